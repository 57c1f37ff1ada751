#!/usr/bin/env bash
# ordering-late-readers.sh -- the consumer-skew stress variant ordering/pc_fixed_late_readers on
# one GPU, within BUDGET seconds (default 80; 54 s were used on an H100 with the mutant killed):
#   1. the mutant it was made for: the ordering row on line 242 only, remove-barrier@242 (the
#      consumer's barrier between its warps' data reads and thread 0's ack: a write-after-read
#      race that survived 16,000 launches of the other fixed variants on an H100);
#   2. false stalls: pc_fixed_late_readers under GPU contention and CPU load to 20,000 launches
#      (every clean variant needs one, docs/stall.md), with what is left (at most 48 s).
# The unmutated ordering binary is built once first (both steps then find it in the build
# cache). Raw output: $OUT/ordering-late-readers/console.log and one folder per step (each
# script's own files and tarball), all in $OUT/ordering-late-readers.tar.gz.
#     OUT=/tmp/out bash ci/gpu/ordering-late-readers.sh
cd "$(dirname "$0")/../.." && . ci/gpu/round.sh ordering-late-readers "${BUDGET:-80}"
export HZ_BUILD_DIR=${HZ_BUILD_DIR:-/tmp/hz-build} PYTHONUNBUFFERED=1
machine_step
build_cuda_families ordering
# a mutate-catalog.sh row needs a share >= 30 s; a killed mutant ends it early
sub mutate-242 31 env ROWS=ordering@242-242 BUDGET=31 bash ci/gpu/mutate-catalog.sh
# falsestall-h200.sh keeps 20 s of its budget for its ending and its start takes ~4 s: 45 gave
# 19.6 s of launches, 19,800 of this variant (~1 ms each, H100, 17:34 UTC); 48 should give 20,000 (not run)
FS=$(( $(left) - 2 )); [ "$FS" -le 48 ] || FS=48
sub falsestall 40 bash ci/gpu/falsestall-h200.sh "$FS" ordering/pc_fixed_late_readers
finish
