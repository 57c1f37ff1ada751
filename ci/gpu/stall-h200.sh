#!/usr/bin/env bash
# stall-h200.sh -- hangs found in seconds, measured (docs/results/hangs-h200.md, docs/stall.md).
# About 8 minutes on one H200, no network, no clang (the static part runs with --skip clang).
#   1. time to a hang verdict per hang canary of deadlock and megakernel_layers: the family
#      stall window (after) and, for one canary per family, the timeout alone (before);
#   2. `hazards check --skip clang` at its default settings (3 min budget): when every canary
#      was first seen failing, each hang's duration and kind, the clean per-launch bounds,
#      and the gaps between progress events of its clean runs;
#   3. the false-stall measurement: every clean variant of every runtime family and the
#      ragged-decode megakernel under GPU contention and CPU load, up to 20,000 launches
#      each, with the family window: stall verdicts (must be 0) and the gap distribution
#      the window's floor is derived from.
# Raw output: $OUT/stall-h200/ (console.log, verdicts.jsonl, check.json, check-summary.json,
# falsestall.jsonl, gaps.json) and $OUT/stall-h200.tar.gz (all of it, the check's store too).
# Run from the repository root: bash ci/gpu/stall-h200.sh
cd "$(dirname "$0")/../.." && . ci/gpu/round.sh stall-h200 465
export HZ_BUILD_DIR=${HZ_BUILD_DIR:-/tmp/hz-build} PYTHONUNBUFFERED=1

machine_step

step "build every CUDA family binary"
timeout 200 python3 -c "
from hazards.families import all_families
from hazards.stress_family import family_binary
for f in all_families():
    if f.binary and 'cuda' in f.platforms:
        print(f.name, family_binary(f))" || echo "BUILD FAILED (continuing with what built)"

step "0. the harness heartbeat: seeded deadlocks are stalls (gpu tests)"
timeout 60 python3 -m pytest -q -p no:randomly -p no:cacheprovider tests/tripwire/test_deadlock_gpu.py -k stall 2>&1 | tail -5

step "1. time to a hang verdict (deadlock, megakernel_layers)"
timeout 75 python3 ci/gpu/stall_measure.py verdicts "$R" 60 > "$R/verdicts.log" 2>&1
python3 - "$R/verdicts.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if __import__("os").path.exists(sys.argv[1]) else []
for r in rows:
    print(f"{r['mode']:6} {r['family']}/{r['variant']:18} {r['outcome']:8} {str(r['error_kind']):9} "
          f"verdict {r['duration_s']:7.2f} s  wall {r['wall_s']:7.2f} s  {r['reason'][:90]}")
PY

step "2. hazards check --skip clang (default settings)"
T=$(date +%s)
timeout 260 python3 -m hazards check --skip clang --json --store "$R/check.db" > "$R/check.json" 2> "$R/check.err"
echo "exit $?  wall $(( $(date +%s) - T )) s"
tail -5 "$R/check.err"
python3 ci/gpu/stall_measure.py check_summary "$R" "$R/check.db"

step "3. false stalls under GPU contention and CPU load"
S=$(( $(left) - 25 ))
[ "$S" -gt 20 ] && timeout $(( S + 20 )) python3 ci/gpu/stall_measure.py falsestall "$R" "$S" > "$R/falsestall.log" 2>&1
grep -v '^{' "$R/falsestall.log" | tail -30
python3 - "$R/falsestall.jsonl" <<'PY'
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if os.path.exists(sys.argv[1]) else []
for r in rows:
    print(f"{r['item']:40} {r['launches']:7d} launches {r['requests']:5d} req  stalls {r['stall_verdicts']}  "
          f"max gap {r['max_gap_s']:.3f} s  outcomes {r['outcomes']}")
print(f"stall verdicts in all: {sum(r['stall_verdicts'] for r in rows)} over {sum(r['launches'] for r in rows)} launches")
PY
step "done"
# Everything (the check's store and artifacts included) goes into the tarball; beside it stay
# only the few files the results page reads, so what comes back is at most 8 files.
sleep 1
tar -czf "$OUT/stall-h200.tar.gz" -C "$OUT" stall-h200
find "$R" -mindepth 1 -maxdepth 1 ! -name console.log ! -name check.json ! -name check-summary.json \
  ! -name verdicts.jsonl ! -name falsestall.jsonl ! -name gaps.json -exec rm -rf {} +
exit 0
