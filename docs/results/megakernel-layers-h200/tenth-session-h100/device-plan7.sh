#!/usr/bin/env bash
# tenth session, call 7: round 17, steps (k) (MKL_CAMPAIGN_STEP 13) and (l) (14) against production:
# both gates each, the bench (step 13's set-aside variant beside), the sub-spans of all three, GPU tests
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
FINAL=$OUT; D=/tmp/round17; rm -rf $D; mkdir -p $D
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader > $D/env.txt; echo "tree: main $(cat .hazards/tree.txt)" >> $D/env.txt; date -u >> $D/env.txt
timeout 90 python3 -c "
import concurrent.futures as cf
from hazards.families import get_family
from hazards.stress_family import family_binary
f = get_family('megakernel_layers')
ds = [None, {'MKL_CAMPAIGN_STEP': 13}, {'MKL_CAMPAIGN_STEP': 14}, {'MKL_CAMPAIGN_STEP': 13, 'MKL_L2_SET_ASIDE_MB': 30},
      {'HZ_PROFILER': 1}, {'HZ_PROFILER': 1, 'MKL_CAMPAIGN_STEP': 13}, {'HZ_PROFILER': 1, 'MKL_CAMPAIGN_STEP': 14},
      {'HZ_PROFILER': 1, 'MKL_PROF_SUBSPANS': 1}, {'HZ_PROFILER': 1, 'MKL_PROF_SUBSPANS': 1, 'MKL_CAMPAIGN_STEP': 13},
      {'HZ_PROFILER': 1, 'MKL_PROF_SUBSPANS': 1, 'MKL_CAMPAIGN_STEP': 14}]
print(list(cf.ThreadPoolExecutor(10).map(lambda d: family_binary(f, defines=d), ds)))" > $D/build.txt 2>&1; echo "build rc $?"
for c in k l; do
  timeout 50 python3 -m hazards gate perf --baseline megakernel_layers:production --candidate megakernel_layers:step_$c --workers 132 --repeats 12 --profiled-launches 3 --wait 0s --json > $D/gate_p$c.json 2> $D/gate_p$c.err; echo "gate $c rc $?"
  timeout 40 python3 -m hazards gate perf --baseline megakernel_layers:production --candidate megakernel_layers:step_$c --workers 132 --repeats 12 --profiled-launches 3 --wait 0s --task worker --json > $D/gate_p${c}_launch.json 2> $D/gate_p${c}_launch.err; echo "gate $c launch rc $?"
done
timeout 60 python3 bench/megakernel_layers_perf.py --also-define MKL_CAMPAIGN_STEP=13 --also-define MKL_CAMPAIGN_STEP=14 --also-define MKL_CAMPAIGN_STEP=13,MKL_L2_SET_ASIDE_MB=30 --no-torch --json $D/perf.json > $D/perf.txt 2>&1; echo "perf rc $?"
timeout 60 python3 bench/megakernel_layers_profile.py --candidate production --candidate step_k --candidate step_l --launches 5 --subspans --out $D/subspans > $D/subspans.txt 2>&1; echo "subspans rc $?"
timeout 60 python3 -m pytest -q -p no:randomly tests/megakernel_layers/test_gpu.py -k "step_k or step_l" > $D/pytest.txt 2>&1; echo "pytest rc $?"
timeout 10 python3 ci/gpu/layers_campaign_table.py $D > $D/table.md 2>&1
date -u >> $D/env.txt
tail -3 $D/pytest.txt; cat $D/table.md; grep -E "us/step|copy floor|x floor|headline|MKL_CAMPAIGN" $D/perf.txt | head -12
grep -A8 "every layer of all 5 launches" $D/subspans.txt | grep -E "qkv|attn_chunk|router|moe_w13|oproj"
tar -czf $FINAL/round17.tar.gz -C $D .
