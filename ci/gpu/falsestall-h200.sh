#!/usr/bin/env bash
# falsestall-h200.sh -- the false-stall measurement alone (step 3 of ci/gpu/stall-h200.sh):
# every clean variant of every runtime family and the ragged-decode megakernel under GPU
# contention and CPU load, until 20,000 launches each or the budget, with the family window.
#   bash ci/gpu/falsestall-h200.sh [BUDGET_S [NAME,...]]    (NAME: a family, FAMILY/VARIANT or
#       ragged_decode to keep; default all; only the named families are built)
#   bash ci/gpu/falsestall-h200.sh 150 ragged_decode       (the megakernel's check server alone: no
#       family builds; it stops at 20,000 launches, requests of 500 launches of one drawn input each)
# Raw output: $OUT/falsestall-h200/ (console.log, falsestall.jsonl, gaps.json, falsestall.log).
cd "$(dirname "$0")/../.." && . ci/gpu/round.sh falsestall-h200 "${1:-560}"
export HZ_BUILD_DIR=${HZ_BUILD_DIR:-/tmp/hz-build} PYTHONUNBUFFERED=1
machine_step
# the megakernel's check server builds its own library as it starts (before the load)
[ "${2:-}" = ragged_decode ] || build_cuda_families "${2:-}"
step "false stalls under GPU contention and CPU load"
S=$(( $(left) - 20 ))
timeout $(( S + 15 )) python3 ci/gpu/stall_measure.py falsestall "$R" "$S" ${2:-} > "$R/falsestall.log" 2>&1
grep -v '^{' "$R/falsestall.log" | tail -25
python3 - "$R/falsestall.jsonl" <<'PY'
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if os.path.exists(sys.argv[1]) else []
for r in rows:
    print(f"{r['item']:40} {r['launches']:7d} launches {r['requests']:5d} req {r['seconds']:6.1f} s  stalls {r['stall_verdicts']}  "
          f"max gap {r['max_gap_s']:.3f} s  outcomes {r['outcomes']}")
print(f"stall verdicts in all: {sum(r['stall_verdicts'] for r in rows)} over {sum(r['launches'] for r in rows)} launches")
PY
finish
