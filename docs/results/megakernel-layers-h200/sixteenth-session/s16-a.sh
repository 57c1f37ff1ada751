#!/usr/bin/env bash
# sixteenth session, one call on main 1edacb4 (steps (t) and (u) merged behind their switches), <= 320 s:
# (1) thirteen builds (plain, profiled, sub-spans; production, step_t, step_u, step_u16; step 14); (2) the gates production -> step_t, step_u, step_u16 (--task launch --task worker), decided before it runs:
#     promoted only if the plain `launch` row says `faster` AND the profiled `worker` row does not say `slower`
#     (predictions, written before: step_t launch ~0.975 [0.96, 0.985]; step_u ~0.985 [0.965, 1.01]; step_u16 ~0.985 [0.97, 1.005]);
#     sub-spans of the four;
# (3) the GPU tests the session's change reaches: step (t)'s, step (u)'s, production-vs-step-14 (bits.assert_close); (4) bench/tripwire_overhead.py of branch twmark (old and new mark forms in one binary), twice each point-expr. (The whole suite: s16-b.sh.)
cd "$(dirname "$0")/.."
T0=$(date +%s); LIMIT=${LIMIT:-320}; left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
cap() { local t=$1 l=$(( $(left) - 8 )); [ $l -lt $t ] && t=$l; [ $t -lt 1 ] && t=1; echo $t; }
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
C=/tmp/a; rm -rf $C; mkdir -p $C; cp .hazards/s16-a.sh $C/
trap 'tar -czf $OUT/s16-a.tar.gz -C $C .' EXIT
{ echo "tree: main $(cat .hazards/tree.txt)"; nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader; date -u; } | tee $C/env.txt
timeout 150 python3 - > $C/build.txt 2>&1 <<'PY'
import concurrent.futures as cf
from hazards.families import get_family
from hazards.stress_family import family_binary
f = get_family('megakernel_layers')
S = {'HZ_PROFILER': 1, 'MKL_PROF_SUBSPANS': 1}
T = {'MKL_MERGE_SPLIT': 1}
U = {'MKL_OPROJ_STAGE': 1}; U16 = {**U, 'MKL_OPROJ_STAGE_ROWS': 16}
ds = [None, {'HZ_PROFILER': 1}, S, {'MKL_CAMPAIGN_STEP': 14}] + [x for d in (T, U, U16) for x in (d, {**d, 'HZ_PROFILER': 1}, {**d, **S})]
print(list(cf.ThreadPoolExecutor(12).map(lambda d: family_binary(f, defines=d), ds)))
PY
echo "builds exit $? ($(left) s left)"; tail -1 $C/build.txt | cut -c1-200
for c in step_t step_u step_u16; do
timeout $(cap 60) python3 -m hazards gate perf --baseline megakernel_layers:production --candidate megakernel_layers:$c \
  --workers 132 --repeats 12 --profiled-launches 3 --wait 0s --task launch --task worker --json > $C/gate_${c}_launch.json 2> $C/gate_${c}_launch.err
echo "gate $c exit $? ($(left) s left)"; tail -3 $C/gate_${c}_launch.err | cut -c1-300; done
python3 ci/gpu/layers_campaign_table.py $C > $C/table.md 2>&1; cut -c1-1200 $C/table.md
timeout $(cap 60) python3 bench/megakernel_layers_profile.py --candidate production --candidate step_t --candidate step_u --candidate step_u16 --launches 5 --subspans --out /tmp/subspans > $C/subspans.txt 2>&1; echo "subspans rc $? ($(left) s left)"
grep -E "^== |layer head|layer time" $C/subspans.txt | cut -c1-200
timeout $(cap 170) python3 -m pytest -m gpu -v -rs -p no:cacheprovider -p no:randomly tests/megakernel_layers/test_merge_split.py tests/megakernel_layers/test_oproj_stage.py "tests/megakernel_layers/test_gpu.py::test_production_is_clean_and_close_to_step_14" > $C/gpu-tests-changed.txt 2>&1
echo "gpu test rc $? ($(left) s left)"; grep -E "PASSED|FAILED|ERROR|passed|failed" $C/gpu-tests-changed.txt | tail -8 | cut -c1-200
# the tripwire's mark, branch twmark (1ecebe5): its bench files over a copy of this tree; old form = `plain`, new = `on`, one binary
if [ $(left) -ge 30 ]; then rm -rf /tmp/tw; mkdir /tmp/tw; cp -r . /tmp/tw/ 2>/dev/null; tar -xzf .hazards/twmark-files.tar.gz -C /tmp/tw
  i=0; for pe in twice once twice once; do i=$((i+1)); [ $(left) -ge 15 ] || break
    (cd /tmp/tw && PYTHONPATH=/tmp/tw timeout $(cap 40) python3 bench/tripwire_overhead.py --rounds 15 --point-expr $pe --json $C/tw_${i}_$pe.json > $C/tw_${i}_$pe.txt 2>&1); echo "tw $i $pe rc $?"; tail -7 $C/tw_${i}_$pe.txt | cut -c1-200; done; fi
date -u | tee -a $C/env.txt
