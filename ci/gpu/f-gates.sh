#!/usr/bin/env bash
# f-gates GPU round 1 (budget 120 s): the per-task profiler on the ragged-decode megakernel
# (decode, overflow on the real ring, cost, every perf-gate candidate's metrics), a short
# perf-gate run on two catalog candidates, one FAITHFUL_RESULT command judged by `hazards
# run`, and the synthetic-LM training smoke with the logit-gate table.
# Writes everything into $OUT/f-gates.tar.gz.
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD
export HZ_CACHE_DIR=/tmp/hz-cache HZ_LEASE_DIR=/tmp/hz-leases HZ_MEGAKERNEL_BUILD_DIR=/tmp/hz-build
R=/tmp/f-gates-results
rm -rf "$R"; mkdir -p "$R"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
{
  date -u; hostname; git rev-parse HEAD; nvidia-smi -L; nvcc --version | tail -1
  python3 -c "import torch; print(torch.__version__)"
} > "$R/env.txt" 2>&1

stamp "build both megakernel libraries (profiled and not) in parallel"
python3 -c "from hazards.megakernel.build import build_library; print(build_library(profiler=True))" > "$R/build_prof.txt" 2>&1 &
python3 -c "from hazards.megakernel.build import build_library; print(build_library())" > "$R/build.txt" 2>&1 &
python3 -c "from hazards.megakernel.build import build_library; print(build_library(profiler=True, defines=('HZ_RD_NOOP_CANDIDATE',)))" > "$R/build_noop.txt" 2>&1 &
wait
stamp "built"

stamp "1. profiler bench"
timeout 45 python3 bench/profiler_h200.py --workers 8,66,132 --launches 5 --json "$R/profiler.json" > "$R/profiler.txt" 2>&1
echo "rc=$?" >> "$R/profiler.txt"
stamp "profiler bench done"

stamp "2. perf gate: improved and sloughing vs baseline (catalog, one warm server)"
timeout 40 python3 -m hazards gate perf --baseline megakernel:baseline --candidate megakernel:improved \
  --candidate megakernel:sloughing --workers 66,132 --repeats 10 --launches 3 --json \
  > "$R/gate_perf.json" 2> "$R/gate_perf.stderr"
echo "rc=$?" >> "$R/gate_perf.stderr"
stamp "perf gate done"

stamp "3. logit harness with training smoke (30 s of training)"
timeout 60 python3 -m hazards.gates.synthlm.harness --out /tmp/lg --max-seconds 30 \
  > "$R/logit_harness.txt" 2> "$R/logit_harness.stderr"
echo "rc=$?" >> "$R/logit_harness.stderr"
cp /tmp/lg/result.json "$R/logit_result.json" 2>/dev/null
stamp "logit harness done"

if [ $(( $(date +%s) - T0 )) -lt 100 ]; then
  stamp "4. a FAITHFUL_RESULT command judged by hazards run (incorrect candidate: must be mismatch)"
  timeout 15 python3 -m hazards run -n 1 --json --timeout 12 -- python3 -m hazards.megakernel.faithful \
    --candidate incorrect --workers 132 --launches 2 > "$R/run_incorrect.json" 2> "$R/run_incorrect.stderr"
  echo "rc=$?" >> "$R/run_incorrect.stderr"
fi
stamp "all done"
mkdir -p "$OUT"
tar -czf "$OUT/f-gates.tar.gz" -C "$R" .
echo "== summary"
grep -E "overflow accounted|workers .*: unprofiled" "$R/profiler.txt"
tail -2 "$R/profiler.txt"
python3 -c "
import json
r = json.load(open('$R/gate_perf.json'))
for c in r.get('candidates', [r]):
    print(c['candidate'], c['verdict'], [(p['workers'], p['verdict']) for p in c['points']])
" 2>&1 | tail -3
grep -E "^model:|^\| [a-z]" "$R/logit_harness.txt" | head -9
tail -1 "$R/logit_harness.stderr"
cat "$R/run_incorrect.json" 2>/dev/null | head -c 300; echo
stamp "end"
