#!/usr/bin/env bash
# The whole GPU test suite and every runtime family's stress verdicts on one H200, on the
# commit under test (docs/results/gpu-test-suite-h200.md records the run). Runs from the
# repository root of a copy of the tree; writes $OUT/final-suite.tar.gz.
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build
R=/tmp/final-suite; rm -rf $R; mkdir -p $R
T0=$(date +%s); left() { echo $(( ${BUDGET:-290} - ($(date +%s) - T0) )); }
finish() { tar -czf "$OUT/final-suite.tar.gz" -C $R .; echo "== done in $(( $(date +%s) - T0 )) s"; }
trap finish EXIT
{ cat .gpu/COMMIT 2>/dev/null || echo "commit unknown (no .gpu/COMMIT; the device copy's .git is stale)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 --version; date -u; } > $R/context.txt
# 1. Every runtime family's binary, built in parallel before the tests time anything.
timeout 120 python3 - > $R/build.txt 2>&1 <<'PY'
import concurrent.futures as cf, time
from hazards.families import all_families
from hazards.stress_family import family_binary
fams = [f for f in all_families() if f.binary]
t = time.monotonic()
with cf.ThreadPoolExecutor(8) as pool:
    for f, r in zip(fams, pool.map(lambda f: (lambda: family_binary(f))(), fams)):
        print(f.name, r)
print(f"built {len(fams)} binaries in {time.monotonic() - t:.1f} s")
PY
echo "build rc=$? ($(left) s left)"; tail -2 $R/build.txt
# 2. The GPU tests, serially (they lease the one GPU).
timeout $(( $(left) - 100 )) python3 -m pytest -m "${GPU_MARK:-gpu}" -q -rs -p no:cacheprovider -p no:randomly tests/ \
  > $R/gpu-tests.txt 2>&1
echo "gpu tests rc=$? ($(left) s left)"; tail -3 $R/gpu-tests.txt
# 3. Every runtime family's verdicts through hazards stress.
for fam in ordering barrier_layout pipeline deadlock megakernel_layers mma_pingpong; do
  [ $(left) -gt 15 ] || { echo "no time for $fam" | tee -a $R/skipped.txt; continue; }
  case $fam in deadlock|megakernel_layers) req=2;; *) req=5;; esac  # hang variants cost a watchdog each
  timeout $(( $(left) < 60 ? $(left) - 5 : 60 )) python3 -m hazards stress $fam --launches 200 --requests $req --json \
    > $R/stress-$fam.json 2> $R/stress-$fam.err
  echo "stress $fam rc=$? ($(left) s left)"
done
[ $(left) -gt 20 ] && timeout 20 python3 -m hazards stress pipeline --variant broken_war --variant fixed \
  --sanitizer racecheck --requests 1 --launches 5 --json > $R/stress-pipeline-racecheck.json 2> $R/stress-pipeline-racecheck.err
echo "racecheck rc=$?"
