#!/usr/bin/env bash
# `hazards check --skip clang --json` at its defaults (budget 50 s) with the family binaries
# built (warm) and the static checks' build cache COLD, as in the H200 run of 19:28 UTC on
# c941074 where the family builds' phase SIGKILLed the static part's nvcc (exit 2, empty
# --json). Passes when the check exits 0 with its --json and no compiler was killed.
# ~80 s on an H200/H100: ~20-30 s of family builds (8 at once: mma_pingpong alone takes about a
# minute cold; cached on a warm machine) + ~55 s of check. Output: $OUT/check-cold-static-cache/
# (console.log, summary.txt, check.json, check.err) and its tar.
cd "$(dirname "$0")/../.." && . ci/gpu/round.sh check-cold-static-cache 210
export HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
machine_step
build_cuda_families  # a family that fails to build here is built (or fails) inside the check
step "check with a cold static build cache"
rm -rf "$HZ_BUILD_DIR/static"   # the static part compiles everything again, beside the GPU part
T1=$(date +%s)
timeout -k 10 "$(( $(left) < 150 ? $(left) : 150 ))" python3 -m hazards check --skip clang --json \
  --store "$R/check.db" > "$R/check.json" 2> "$R/check.err"
rc=$?
echo "exit $rc  wall $(( $(date +%s) - T1 )) s" > "$R/summary.txt"
python3 - "$R/check.json" "$rc" >> "$R/summary.txt" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
if not text.strip():
    print("EMPTY --json"); sys.exit()
r = json.loads(text)
print(f"json exit_code {r['exit_code']} static: {r['static']['note']}; not judged {r['static']['not_judged']}")
print(f"verdicts {len(r['verdicts'])}: " + ", ".join(sorted({v['verdict'] for v in r['verdicts']})))
PY
grep -E "killed|exit -|error" "$R/check.err" | head -5 >> "$R/summary.txt"
cat "$R/summary.txt"
finish
