#!/usr/bin/env bash
# owed-evidence.sh -- the GPU evidence the third session of 2026-12-05 could not collect (its
# device time ended), in priority order, within BUDGET seconds (default 570; run it on an H200):
#   1. the GPU test the last suite run stopped at its budget: tests/campaign/test_check_gpu.py;
#   2. false stalls of the fixed variants added that session (fixed_threads_skewed,
#      pc_fixed_skewed, single_jitter) under GPU contention and CPU load, to 20,000 launches each;
#   3. the mutation rows the new stress variants were made for: all of ordering (its five
#      mutants the H200 round did not reach, and remove-barrier@223 against pc_fixed_skewed)
#      and pipeline's remove-barrier@89 (against single_jitter);
#   4. a soak that meets a hang leaves its hang.md (measured on an H100 only);
#   5. the layered megakernel's ring_smem diagnostic (why step (c) is slower).
# Each step runs only if its time fits; what ran comes back as $OUT/owed-evidence.tar.gz and
# each script's own files. Raw output: $OUT/owed-evidence/console.log and one folder per step.
#     OUT=/tmp/out bash ci/gpu/owed-evidence.sh
cd "$(dirname "$0")/../.." && . ci/gpu/round.sh owed-evidence "${BUDGET:-570}"
export HZ_BUILD_DIR=${HZ_BUILD_DIR:-/tmp/hz-build} PYTHONUNBUFFERED=1
machine_step
build_cuda_families

sub check-test 90 python3 -m pytest -m gpu -v -rs -p no:cacheprovider -p no:randomly tests/campaign/test_check_gpu.py
sub falsestall-new-variants 80 bash ci/gpu/falsestall-h200.sh 70 \
  mma_pingpong/fixed_threads_skewed,ordering/pc_fixed_skewed,pipeline/single_jitter
sub mutate-ordering-pipeline 150 env ROWS=ordering,pipeline@89-89 BUDGET=140 bash ci/gpu/mutate-catalog.sh
sub soak-hang-md 135 bash ci/gpu/soak-hang-md.sh
sub ringsmem 70 env BUDGET=60 bash ci/gpu/layers-campaign.sh ringsmem
finish
