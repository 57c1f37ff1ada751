#!/usr/bin/env bash
# seventeenth session, call D, on main c10ad3f (production = step 22 = step 21 + step (t); the explainer's earliest-epoch
# reading): the prebuild of ci/gpu/final-gpu-tests.sh, then the GPU tests the promotion and this session's changes
# reach, most important first (test_gpu.py: production's bits = step_t's, step 21 = step 15, the hang sentences;
# steps (t), (u), (v)'s files; step 17's shared_line test; the fast path's sentences; the gates' GPU tests; the logit
# gate; the check test), pytest stopped by SIGINT at the limit so it prints its summary; then, if time is left, the
# gates production -> step_v, step_v_k (expected `slower` after step (u)'s gate; rule as ever: promotable only on a
# `faster` launch row without a `slower` worker row).
cd "$(dirname "$0")/.."
T0=$(date +%s); LIMIT=${LIMIT:-240}; left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
C=$OUT/d; mkdir -p $C; cp .hazards/s17-d.sh $C/
{ echo "tree: main $(cat .hazards/tree.txt)"; nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader; date -u; } | tee $C/env.txt
sed -n '/^timeout 120 python3 - /,/^PY$/p' ci/gpu/final-gpu-tests.sh | sed 's#> $R/build.txt#> '"$C"'/build.txt#' | sed 's#^fams = \[f for f in all_families() if f.binary\]#fams = [f for f in all_families() if f.binary and f.name == "megakernel_layers"]#' > /tmp/prebuild.sh
bash /tmp/prebuild.sh; echo "prebuild rc $? ($(left) s left)"; tail -1 $C/build.txt
# (the prebuild: the layered family's builds only, for the device time left)
# first what the promotion and the explainer change reach (production's and step 21's bits, the hang sentences), then the rest
K="production or step_21 or step_15_is or hang or merge_split or step_t"
timeout -s INT -k 10 $(( $(left) - 20 )) python3 -m pytest -m gpu -v -rs -p no:cacheprovider -p no:randomly --durations=10 -k "$K" \
  tests/megakernel_layers/test_gpu.py tests/megakernel_layers/test_merge_split.py tests/megakernel_layers/test_w13_emit_lean.py \
  tests/megakernel_layers/test_oproj_stage.py tests/megakernel_layers/test_attn_stage.py tests/megakernel_layers/test_gpu_tripwire_fastpath.py \
  tests/megakernel_layers/test_hn_first.py tests/gates/test_perf_launch_gpu.py tests/gates/test_perf_revision_gpu.py \
  tests/gates/test_layers_logit_gate.py tests/campaign/test_check_gpu.py > $OUT/gpu-tests-first.txt 2>&1
echo "gpu tests (first) rc=$? ($(left) s left)"; grep -E "passed|failed|error" $OUT/gpu-tests-first.txt | tail -1; grep -E "FAILED|ERROR" $OUT/gpu-tests-first.txt | head -12 | cut -c1-300
[ $(left) -ge 30 ] && timeout -s INT -k 10 $(( $(left) - 12 )) python3 -m pytest -m gpu -v -rs -p no:cacheprovider -p no:randomly --durations=10 -k "not ($K)" \
  tests/megakernel_layers/test_gpu.py tests/megakernel_layers/test_merge_split.py tests/megakernel_layers/test_w13_emit_lean.py \
  tests/megakernel_layers/test_oproj_stage.py tests/megakernel_layers/test_attn_stage.py tests/megakernel_layers/test_gpu_tripwire_fastpath.py \
  tests/megakernel_layers/test_hn_first.py tests/gates/test_perf_launch_gpu.py tests/gates/test_perf_revision_gpu.py \
  tests/gates/test_layers_logit_gate.py tests/campaign/test_check_gpu.py > $OUT/gpu-tests-rest.txt 2>&1
echo "gpu tests (rest) rc=$? ($(left) s left)"; grep -E "passed|failed|error" $OUT/gpu-tests-rest.txt | tail -1; grep -E "FAILED|ERROR" $OUT/gpu-tests-rest.txt | head -12 | cut -c1-300
for c in step_v step_v_k; do [ $(left) -ge 25 ] || break
timeout $(( $(left) - 8 )) python3 -m hazards gate perf --baseline megakernel_layers:production --candidate megakernel_layers:$c \
  --workers 132 --repeats 12 --profiled-launches 3 --wait 0s --task launch --task worker --json > $C/gate_${c}_launch.json 2> $C/gate_${c}_launch.err
echo "gate $c exit $? ($(left) s left)"; python3 ci/gpu/layers_campaign_table.py $C 2>/dev/null | grep "^| $c " | cut -c1-700; done
date -u | tee -a $C/env.txt
