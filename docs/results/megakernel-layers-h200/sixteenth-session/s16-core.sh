#!/usr/bin/env bash
# sixteenth session, one call on main 2668305 (production = step 21; step (t) merged behind MKL_MERGE_SPLIT), <= 575 s:
# (1) the suite's prebuild; (2) step (t)'s gate production -> step_t (--task launch --task worker), decided before it runs:
#     promoted only if the plain `launch` row says `faster` AND the profiled `worker` row does not say `slower`
#     (prediction, written in session 15: launch ~0.975 [0.96, 0.985]); sub-spans of production and step_t;
# (3) the whole GPU suite (17 files, step (t)'s test first); (4) with what is left: the bench (torch on an H200 only).
cd "$(dirname "$0")/.."
T0=$(date +%s); LIMIT=${LIMIT:-575}; left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
cap() { local t=$1 l=$(( $(left) - 8 )); [ $l -lt $t ] && t=$l; [ $t -lt 1 ] && t=1; echo $t; }
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
C=/tmp/core; rm -rf $C; mkdir -p $C; cp .hazards/s16-core.sh $C/
trap 'tar -czf $OUT/s16-core.tar.gz -C $C .' EXIT
{ echo "tree: main $(cat .hazards/tree.txt)"; nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader; date -u; } | tee $C/env.txt
sed -n '/^timeout 120 python3 - /,/^PY$/p' ci/gpu/final-gpu-tests.sh | sed 's#> $R/build.txt#> '"$C"'/build.txt#' > /tmp/prebuild.sh
bash /tmp/prebuild.sh; echo "prebuild rc $? ($(left) s left)"; tail -1 $C/build.txt
timeout $(cap 90) python3 -m hazards gate perf --baseline megakernel_layers:production --candidate megakernel_layers:step_t \
  --workers 132 --repeats 12 --profiled-launches 3 --wait 0s --task launch --task worker --json > $C/gate_step_t_launch.json 2> $C/gate_step_t_launch.err
echo "gate exit $? ($(left) s left)"; tail -3 $C/gate_step_t_launch.err | cut -c1-300
python3 ci/gpu/layers_campaign_table.py $C > $C/table.md 2>&1; cut -c1-1200 $C/table.md
timeout $(cap 60) python3 bench/megakernel_layers_profile.py --candidate production --candidate step_t --launches 5 --subspans --out /tmp/subspans > $C/subspans.txt 2>&1; echo "subspans rc $? ($(left) s left)"
grep -E "^== |layer head|layer time" $C/subspans.txt | cut -c1-200
timeout -s INT -k 10 $(cap 470) python3 -m pytest -m gpu -v -rs -p no:cacheprovider -p no:randomly --durations=25 \
  tests/megakernel_layers/test_merge_split.py tests/megakernel_layers/test_gpu.py tests/megakernel_layers/test_gpu_tripwire_fastpath.py \
  tests/megakernel_layers/test_hn_first.py \
  tests/megakernel_layers/test_w13_emit_lean.py tests/gates/test_perf_launch_gpu.py tests/gates/test_perf_revision_gpu.py \
  tests/gates/test_layers_logit_gate.py tests/families/test_families_gpu.py \
  tests/families/test_mma_pingpong_gpu.py tests/tripwire/test_deadlock_gpu.py tests/families/test_barrier_layout_runtime.py \
  tests/ragged_decode/test_gpu_kernel.py tests/ragged_decode/test_check_target.py tests/ragged_decode/test_profiler_gpu.py \
  tests/plugin/test_family_property_gpu.py tests/campaign/test_check_gpu.py > $C/gpu-tests.txt 2>&1
echo "gpu tests rc=$? ($(left) s left)"; grep -E "passed|failed|error" $C/gpu-tests.txt | tail -3; grep -E "FAILED|ERROR" $C/gpu-tests.txt | head -10
if [ $(left) -ge 50 ]; then
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then TORCH="--compile-mode default+graph --compile-timeout 40"; else TORCH=--no-torch; fi
  timeout $(cap 120) python3 bench/megakernel_layers_perf.py $TORCH --rounds 9 --also-define MKL_MERGE_SPLIT=1 --json $C/perf.json > $C/perf.txt 2>&1
  echo "bench rc $? ($(left) s left)"; grep -E "floor|headline|torch|megakernel" $C/perf.txt | cut -c1-200
fi
if [ $(left) -ge 25 ]; then timeout $(cap 30) python3 bench/tripwire_overhead.py --rounds 15 > $C/tripwire_overhead.txt 2>&1; echo "tripwire_overhead rc $?"; tail -4 $C/tripwire_overhead.txt; fi
date -u | tee -a $C/env.txt
