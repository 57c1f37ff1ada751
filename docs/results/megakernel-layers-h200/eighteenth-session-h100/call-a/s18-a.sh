#!/usr/bin/env bash
# eighteenth session, call A, on main 6f87764 (production = step 22 = step 21 + step (t); the stage control merged): the prebuild; the bench with
# torch (step 22's first bench: the headline, step 21 beside it in the same run); the GPU suite's layered-family files
# (the promotion's rewritten claims, step (v), the hang sentences after the explainer's earliest-epoch reading; the stage controls); the
# gates production -> step_v, step_v_k (expected `slower` / `no-change`, written before any run); the ragged bench;
# the rest of the suite if time is left (what is not reached runs in call B on the same tree).
cd "$(dirname "$0")/.."; PLAN=a source ci/gpu/plan-preamble.sh; cp .hazards/s18-a.sh "$PLAN_DIR/"
plan_prebuild
timeout 150 python3 bench/megakernel_layers_perf.py --compile-mode default+graph --compile-timeout 60 --rounds 9 \
  --also-define MKL_CAMPAIGN_STEP=21 --json $PLAN_DIR/perf.json > $PLAN_DIR/perf.txt 2>&1
echo "bench rc $? ($(left) s left)"; grep -E "floor|megakernel|torch|headline" $PLAN_DIR/perf.txt | cut -c1-200
run_group mkl-new 60 tests/megakernel_layers/test_attn_stage.py tests/megakernel_layers/test_merge_split.py \
  tests/megakernel_layers/test_oproj_stage.py tests/megakernel_layers/test_hn_first.py tests/megakernel_layers/test_w13_emit_lean.py
run_group mkl-gpu 150 tests/megakernel_layers/test_gpu.py
[ $(left) -ge 60 ] && { timeout 45 python3 bench/ragged_decode_h200.py --calls 20 --out-md $PLAN_DIR/ragged.md --json $PLAN_DIR/ragged.json > $PLAN_DIR/ragged.txt 2>&1
  echo "ragged rc $? ($(left) s left)"; grep -E "Copy bandwidth|^\| megakernel \(this" $PLAN_DIR/ragged.md | cut -c1-200; }
run_group mkl-fastpath 130 tests/megakernel_layers/test_gpu_tripwire_fastpath.py
run_group families 90 tests/families/test_mma_pingpong_gpu.py tests/tripwire/test_deadlock_gpu.py \
  tests/families/test_families_gpu.py tests/families/test_barrier_layout_runtime.py tests/plugin/test_family_property_gpu.py
for c in step_v step_v_k; do [ $(left) -ge 70 ] || break
timeout $(( $(left) - 30 )) python3 -m hazards gate perf --baseline megakernel_layers:production --candidate megakernel_layers:$c \
  --workers 132 --repeats 12 --profiled-launches 3 --wait 0s --task launch --task worker --json > $PLAN_DIR/gate_${c}_launch.json 2> $PLAN_DIR/gate_${c}_launch.err
echo "gate $c exit $? ($(left) s left)"; python3 ci/gpu/layers_campaign_table.py $PLAN_DIR 2>/dev/null | grep "^| $c " | cut -c1-700; done
date -u | tee -a $PLAN_DIR/env.txt
