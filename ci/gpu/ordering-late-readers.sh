#!/usr/bin/env bash
# ordering-late-readers.sh -- the consumer-skew stress variant ordering/pc_fixed_late_readers on
# one GPU, within BUDGET seconds (default 80; about 55 s are used when the mutant is killed):
#   1. the mutant it was made for: the ordering row on line 242 only, remove-barrier@242 (the
#      consumer's barrier between its warps' data reads and thread 0's ack: a write-after-read
#      race that survived 16,000 launches of the other fixed variants on an H100);
#   2. false stalls: pc_fixed_late_readers under GPU contention and CPU load to 20,000 launches
#      (every clean variant needs one, docs/stall.md), with what is left (at most 45 s).
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
# falsestall-h200.sh keeps 20 s of its budget for its ending: 45 leaves ~24 s of launches
# (~20 s for 20,000 of pc_fixed_skewed's, the same skew on the other side, on an H100)
FS=$(( $(left) - 2 )); [ "$FS" -le 45 ] || FS=45
sub falsestall 40 bash ci/gpu/falsestall-h200.sh "$FS" ordering/pc_fixed_late_readers
finish
