#!/usr/bin/env bash
# stall-h200.sh -- hangs found in seconds and the check's time, measured (docs/results/hangs-h200.md).
# About 5.5 minutes on one GPU, no network, no clang (the static part runs with --skip clang):
#   0. the harness heartbeat: seeded deadlocks are stalls, and a warm megakernel_layers server
#      builds each sequence length's context once (the GPU tests);
#   1. time to a hang verdict per hang canary of deadlock and megakernel_layers on the family
#      server with the family stall window, two hangs each (the second on a respawned server:
#      its label must name the tripwire's place, not "started"), and the timeout alone once
#      for deadlock ("before");
#   2. `hazards check --skip clang` at its default settings (wall, every canary detected, when);
#   3. `hazards check --skip clang --budget 3m` (the old default, whose run took 185 s wall):
#      the clean per-launch bounds (goal <= 2.4e-4 at 95%).
# The false-stall measurement is ci/gpu/falsestall-h200.sh, run on its own.
# Raw output: $OUT/stall-h200/ (console.log, verdicts.jsonl, check.json, check-summary.json,
# check3m.json, check3m-summary.json) and $OUT/stall-h200.tar.gz (all of it, the stores too).
# Run from the repository root: bash ci/gpu/stall-h200.sh
cd "$(dirname "$0")/../.." && . ci/gpu/round.sh stall-h200 360
export HZ_BUILD_DIR=${HZ_BUILD_DIR:-/tmp/hz-build} PYTHONUNBUFFERED=1

machine_step

build_cuda_families

step "0. the harness heartbeat: seeded deadlocks are stalls; a warm megakernel_layers server keeps each seq (gpu tests)"
timeout 60 python3 -m pytest -q -p no:randomly -p no:cacheprovider tests/tripwire/test_deadlock_gpu.py \
  tests/megakernel_layers/test_gpu.py -k "stall or warm_server" 2>&1 | tail -4

step "1. time to a hang verdict (deadlock, megakernel_layers)"
timeout 60 python3 ci/gpu/stall_measure.py verdicts "$R" 45 > "$R/verdicts.log" 2>&1
python3 ci/gpu/stall_measure.py verdicts_table "$R"

# check NAME BUDGET: hazards check --skip clang [--budget BUDGET] into $R/NAME.json, its store $R/NAME.db
check() {
  local name=$1 T
  shift
  T=$(date +%s)
  timeout 260 python3 -m hazards check --skip clang --json --store "$R/$name.db" "$@" > "$R/$name.json" 2> "$R/$name.err"
  echo "exit $?  wall $(( $(date +%s) - T )) s"
  grep -E "static checks: .*(judged|done)|forensics:|given up" "$R/$name.err" | tail -4
  python3 ci/gpu/stall_measure.py check_summary "$R" "$R/$name.db" "$name" "$R/$name.json"
}

step "2. hazards check --skip clang (default settings)"
check check

# LONG_CHECK (default 3m, the old default's wall) shortens step 3 when device time is short; 0 skips it
LONG_CHECK=${LONG_CHECK:-3m}
if [ "$LONG_CHECK" != 0 ]; then
  step "3. hazards check --skip clang --budget $LONG_CHECK (clean bounds; the old default was 3m)"
  check check3m --budget "$LONG_CHECK"
fi

step "done"
# Everything (the checks' stores and artifacts included) goes into the tarball; beside it stay
# only the few files the results page reads, so what comes back is at most 8 files.
sleep 1
tar -czf "$OUT/stall-h200.tar.gz" -C "$OUT" stall-h200
find "$R" -mindepth 1 -maxdepth 1 ! -name console.log ! -name check.json ! -name check-summary.json \
  ! -name check3m.json ! -name check3m-summary.json ! -name verdicts.jsonl -exec rm -rf {} +
exit 0
