#!/usr/bin/env bash
# seventeenth session, call E (the device time left: ~140 s), on main c10ad3f (production = step 22): four builds,
# then the promotion's GPU tests first (production = step_t's bits, step 21 = step 15's, routing_no_fence, the merge
# spans) and the hang sentences the explainer change reaches (production's seeded hangs, step 17's shared_line).
cd "$(dirname "$0")/.."
T0=$(date +%s); LIMIT=${LIMIT:-140}; left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
C=$OUT/e; mkdir -p $C; cp .hazards/s17-e.sh $C/
{ echo "tree: main $(cat .hazards/tree.txt)"; nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader; date -u; } | tee $C/env.txt
timeout 60 python3 - > $C/build.txt 2>&1 <<'PY'
import concurrent.futures as cf
from hazards.families import get_family
from hazards.stress_family import family_binary
f = get_family('megakernel_layers')
ds = [None, {'MKL_CAMPAIGN_STEP': 21}, {'MKL_CAMPAIGN_STEP': 15}, {'MKL_CAMPAIGN_STEP': 21, 'MKL_MERGE_SPLIT': 1},
      {'HZ_PROFILER': 1}, {'MKL_CAMPAIGN_STEP': 17}]
print(list(cf.ThreadPoolExecutor(6).map(lambda d: family_binary(f, defines=d), ds)))
PY
echo "builds rc $? ($(left) s left)"
timeout -s INT -k 5 $(( $(left) - 6 )) python3 -m pytest -m gpu -v -rs -p no:cacheprovider -p no:randomly \
  "tests/megakernel_layers/test_gpu.py::test_production_gives_step_t_bits_clean_and_with_stale_descriptor" \
  "tests/megakernel_layers/test_gpu.py::test_step_21_gives_step_15_bits_clean_and_with_stale_descriptor" \
  "tests/megakernel_layers/test_gpu.py::test_production_routing_no_fence_stays_clean_on_nvidia_as_step_21" \
  "tests/megakernel_layers/test_gpu.py::test_seeded_hangs_are_named_by_barrier_layer_participants_and_cause" \
  "tests/megakernel_layers/test_w13_emit_lean.py::test_step_17_shared_line_still_hangs_with_the_reverted_release" \
  "tests/megakernel_layers/test_gpu.py::test_production_profiles_every_merge_span_without_overflowing_the_ring" \
  > $OUT/gpu-tests-e.txt 2>&1
echo "gpu tests rc=$? ($(left) s left)"; grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/gpu-tests-e.txt | cut -c1-250 | tail -16
date -u | tee -a $C/env.txt
