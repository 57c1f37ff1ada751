#!/usr/bin/env bash
# `hazards check --skip clang --json` at its defaults (budget 50 s) with the family binaries
# built (warm) and the static checks' build cache COLD, as in the H200 run of 19:28 UTC on
# c941074 where the family builds' phase SIGKILLed the static part's nvcc (exit 2, empty
# --json). Passes when the check exits 0 with its --json and no compiler was killed.
# ~80 s on an H200/H100: ~20 s of family builds (cached on a warm machine) + ~55 s of check.
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
R=$OUT/check-cold-static-cache; mkdir -p $R
{ git rev-parse --short HEAD 2>/dev/null || cat .gpu/COMMIT 2>/dev/null; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $R/context.txt
timeout 120 python3 -c "
from hazards.families import all_families
from hazards.stress_family import family_binary
for f in all_families():
    if f.binary: print(f.name, family_binary(f))" > $R/build.txt 2>&1 || { echo "family builds failed"; tail -3 $R/build.txt; exit 1; }
rm -rf "$HZ_BUILD_DIR/static"   # the static part compiles everything again, beside the GPU part
T0=$(date +%s)
timeout -k 10 150 python3 -m hazards check --skip clang --json --store $R/check.db > $R/check.json 2> $R/check.err
rc=$?
echo "exit $rc  wall $(( $(date +%s) - T0 )) s" | tee $R/summary.txt
python3 - "$R/check.json" "$rc" >> $R/summary.txt <<'PY'
import json, sys
text = open(sys.argv[1]).read()
if not text.strip():
    print("EMPTY --json"); sys.exit()
r = json.loads(text)
print(f"json exit_code {r['exit_code']} static: {r['static']['note']}; not judged {r['static']['not_judged']}")
print(f"verdicts {len(r['verdicts'])}: " + ", ".join(sorted({v['verdict'] for v in r['verdicts']})))
PY
grep -E "killed|exit -|error" $R/check.err | head -5 >> $R/summary.txt
cat $R/summary.txt
