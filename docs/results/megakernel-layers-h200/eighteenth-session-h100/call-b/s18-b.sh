#!/usr/bin/env bash
# eighteenth session, call B (same tree as call A, or its successor with the stage control): the GPU suite's files call A
# did not reach (the ragged-decode files, the gates' GPU tests, the logit gate, the check test last), any group A cut
# (named in RERUN, files separated by spaces), and the stage control's GPU tests when present.
cd "$(dirname "$0")/.."; PLAN=b source ci/gpu/plan-preamble.sh; cp .hazards/s18-b.sh "$PLAN_DIR/"
plan_prebuild
[ -n "$RERUN" ] && run_group rerun 60 $RERUN
[ -n "$CONTROL" ] && run_group control 40 $CONTROL
run_group ragged 60 tests/ragged_decode/test_gpu_kernel.py tests/ragged_decode/test_check_target.py tests/ragged_decode/test_profiler_gpu.py
run_group gates 80 tests/gates/test_layers_logit_gate.py tests/gates/test_perf_revision_gpu.py tests/gates/test_perf_launch_gpu.py
run_group check 75 tests/campaign/test_check_gpu.py
date -u | tee -a $PLAN_DIR/env.txt
