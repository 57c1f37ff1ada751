#!/usr/bin/env bash
# long-batch-beats.sh -- one long batch (~2-7 s) of each family whose launch loop queues its
# launches (barrier_layout, ordering, mma_pingpong, pipeline), with stall detection at its
# default (auto: the family window, 1.0 s, on a fresh store): before Batch::launched()
# (standalone/common/pace.h) such a batch beat once, at its end, and was a false hang.
# Prints per batch the verdict, its duration and the largest gap between progress events;
# exit 1 if any batch is a hang, 2 if a batch ran shorter than twice the window (proves
# nothing) or none ran. About 25-45 s with the four binaries already built (+ ~60 s to build).
#     OUT=/tmp/out bash ci/gpu/long-batch-beats.sh
cd "$(dirname "$0")/../.." && . ci/gpu/round.sh long-batch-beats 120
export HZ_BUILD_DIR=${HZ_BUILD_DIR:-/tmp/hz-build} PYTHONUNBUFFERED=1
STORE=/tmp/long-batch-beats-store/results.db  # copied into $R at the end (no -wal/-shm files there)
rm -rf "${STORE%/*}"; mkdir -p "${STORE%/*}"
machine_step
build_cuda_families barrier_layout,ordering,mma_pingpong,pipeline
# Launches for ~7 s at the per-launch times of the false-stall round under GPU contention
# (docs/results/hangs-h200/falsestall/falsestall.jsonl: 0.675, 0.495, 0.155, 0.055 ms; the
# launch's check kernel included). Uncontended they run faster, and mma_pingpong and pipeline
# by more than 3x: on an H100 (docs/results/hangs-h100/sixth-session-0b22642) 45,000 and
# 120,000 launches took 1.64 and 1.50 s, under twice the window, so their counts are sized
# from those uncontended times (36 and 12.5 us a launch) to ~4 s.
for spec in barrier_layout:fixed:10000 ordering:pc_fixed:14000 mma_pingpong:fixed:110000 pipeline:fixed:320000; do
  IFS=: read -r fam variant n <<< "$spec"
  step "$fam/$variant: one batch of $n launches"
  timeout -k 5 60 python3 -m hazards stress "$fam" --variant "$variant" --launches "$n" --requests 1 \
    --store "$STORE" --json > "$R/$fam.json" 2>> "$R/stress.err"
  echo "stress rc=$?"
done
step "verdicts and gaps"
python3 ci/gpu/long_batch_gaps.py "$STORE"
RC=$?
cp "$STORE" "$R/results.db"
finish $RC
