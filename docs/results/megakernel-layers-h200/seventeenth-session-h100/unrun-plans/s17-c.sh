#!/usr/bin/env bash
# seventeenth session, call C, on main 738c2bf (step (v) merged behind MKL_ATTN_STAGE; the explainer reads a hang at its earliest epoch): (1) builds; (2) the gates
# production -> step_v, step_v_k (--task launch --task worker, 12 pairs), decided before they run: a candidate is
# promotable only if the plain `launch` row says `faster` and the profiled `worker` row does not say `slower`
# (predictions, the catalog's, written before: step_v ~0.975 [0.95, 1.00]; step_v_k ~0.98 [0.965, 1.00]);
# (3) the sub-spans of production, step_v, step_v_k; (4) step (v)'s GPU tests (production's bits);
# (5) the hang-sentence GPU tests on production and step 17 (the explainer's change; step 17's shared_line test failed in call B).
cd "$(dirname "$0")/.."
T0=$(date +%s); LIMIT=${LIMIT:-200}; left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
cap() { local t=$1 l=$(( $(left) - 8 )); [ $l -lt $t ] && t=$l; [ $t -lt 1 ] && t=1; echo $t; }
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
C=/tmp/c; rm -rf $C; mkdir -p $C; cp .hazards/s17-c.sh $C/
trap 'tar -czf $OUT/s17-c.tar.gz -C $C .' EXIT
{ echo "tree: main $(cat .hazards/tree.txt)"; nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader; date -u; } | tee $C/env.txt
timeout 120 python3 - > $C/build.txt 2>&1 <<'PY'
import concurrent.futures as cf
from hazards.families import get_family
from hazards.stress_family import family_binary
f = get_family('megakernel_layers')
S = {'HZ_PROFILER': 1, 'MKL_PROF_SUBSPANS': 1}
V = {'MKL_ATTN_STAGE': 1}; VK = {**V, 'MKL_ATTN_STAGE_V_BLOCKS': 0}
ds = [None, {'HZ_PROFILER': 1}, S] + [x for d in (V, VK) for x in (d, {**d, 'HZ_PROFILER': 1}, {**d, **S})]
print(list(cf.ThreadPoolExecutor(12).map(lambda d: family_binary(f, defines=d), ds)))
PY
echo "builds exit $? ($(left) s left)"; tail -1 $C/build.txt | cut -c1-200
for c in step_v step_v_k; do
timeout $(cap 60) python3 -m hazards gate perf --baseline megakernel_layers:production --candidate megakernel_layers:$c \
  --workers 132 --repeats 12 --profiled-launches 3 --wait 0s --task launch --task worker --json > $C/gate_${c}_launch.json 2> $C/gate_${c}_launch.err
echo "gate $c exit $? ($(left) s left)"; tail -2 $C/gate_${c}_launch.err | cut -c1-300; done
python3 ci/gpu/layers_campaign_table.py $C > $C/table.md 2>&1; cut -c1-1200 $C/table.md
timeout $(cap 50) python3 bench/megakernel_layers_profile.py --candidate production --candidate step_v --candidate step_v_k --launches 5 --subspans --out /tmp/subspans > $C/subspans.txt 2>&1; echo "subspans rc $? ($(left) s left)"
grep -E "^== |layer head|layer time" $C/subspans.txt | cut -c1-200; grep -A3 "every layer of all 5 launches" $C/subspans.txt | grep -E "attn_chunk" | cut -c1-200
timeout -s INT $(cap 90) python3 -m pytest -m gpu -v -rs -p no:cacheprovider -p no:randomly tests/megakernel_layers/test_attn_stage.py > $OUT/gpu-tests-attn-stage.txt 2>&1
echo "step (v) gpu tests rc $? ($(left) s left)"; grep -E "FAILED|ERROR|passed|failed" $OUT/gpu-tests-attn-stage.txt | tail -6 | cut -c1-300
timeout -s INT $(cap 100) python3 -m pytest -m gpu -v -p no:cacheprovider -p no:randomly tests/megakernel_layers/test_w13_emit_lean.py -k hang \
  "tests/megakernel_layers/test_gpu.py::test_seeded_hangs_are_named_by_barrier_layer_participants_and_cause" \
  "tests/megakernel_layers/test_gpu.py::test_step_d_hangs_show_the_merge_workers_beside_the_missing_chunk_ranks" > $OUT/gpu-tests-hang-sentences.txt 2>&1
echo "hang sentences rc $? ($(left) s left)"; grep -E "PASSED|FAILED|AssertionError|passed|failed" $OUT/gpu-tests-hang-sentences.txt | cut -c1-400 | tail -12
date -u | tee -a $C/env.txt
