#!/usr/bin/env bash
# eleventh session: campaign step (m) (MKL_CAMPAIGN_STEP 15, candidate step_m: the attention chunk's
# block loop on tensor cores) against production (14): builds, 3 checked launches each and the output
# comparison (default and small), both gates, the bench without torch, the sub-spans; <= 150 s.
#     run: bash docs/results/megakernel-layers-h200/eleventh-session-h100/device-plan-step-m.sh
cd "$(dirname "$0")/../../../.."
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
FINAL=${OUT:-/tmp/out}; D=/tmp/round19-step-m; rm -rf $D; mkdir -p $D $FINAL
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader > $D/env.txt; git log -1 --format='tree: %h' >> $D/env.txt 2>/dev/null; date -u >> $D/env.txt
timeout 45 python3 -c "
import concurrent.futures as cf
from hazards.families import get_family
from hazards.stress_family import family_binary
f = get_family('megakernel_layers')
ds = [None, {'MKL_CAMPAIGN_STEP': 15}, {'HZ_PROFILER': 1}, {'HZ_PROFILER': 1, 'MKL_CAMPAIGN_STEP': 15},
      {'HZ_PROFILER': 1, 'MKL_PROF_SUBSPANS': 1}, {'HZ_PROFILER': 1, 'MKL_PROF_SUBSPANS': 1, 'MKL_CAMPAIGN_STEP': 15}]
print(list(cf.ThreadPoolExecutor(6).map(lambda d: family_binary(f, defines=d), ds)))" > $D/build.txt 2>&1; echo "build rc $?"
timeout 15 python3 -c "
import torch
from hazards.families import get_family
from hazards.stress_family import family_binary
from hazards.megakernel_layers import reference as R
from hazards.megakernel_layers.calibration import dump_run
f = get_family('megakernel_layers')
for params in ({'layers': 2, 'seq': 1024}, {'layers': 2, 'seq': 1024, 'model': 'small'}):
    outs = {}
    for name, d in (('production', None), ('step_m', {'MKL_CAMPAIGN_STEP': 15})):
        runs = [dump_run(family_binary(f, defines=d), params) for _ in range(3)]
        print(params, name, 'mismatched', [r[2].get('mismatched') for r in runs], 'same bits x3', all(bool((runs[0][0] == r[0]).all()) for r in runs),
              'rel_err vs its reference %.3e' % R.rel_err(runs[0][0], runs[0][1]))
        outs[name] = runs[0][0]
    a, b = outs['step_m'].double().flatten(), outs['production'].double().flatten()
    print(params, 'step_m vs production: cos %.9f max|diff|/max|prod| %.3e rel_err %.3e' % (
        float(torch.nn.functional.cosine_similarity(a, b, dim=0)), float((a - b).abs().max() / b.abs().max()), R.rel_err(outs['step_m'], outs['production'])))
" > $D/check.txt 2>&1; echo "check rc $?"
timeout 25 python3 -m hazards gate perf --baseline megakernel_layers:production --candidate megakernel_layers:step_m --workers 132 --repeats 12 --profiled-launches 3 --wait 0s --json > $D/gate_pm.json 2> $D/gate_pm.err; echo "gate rc $?"
timeout 20 python3 -m hazards gate perf --baseline megakernel_layers:production --candidate megakernel_layers:step_m --workers 132 --repeats 12 --profiled-launches 3 --wait 0s --task worker --json > $D/gate_pm_launch.json 2> $D/gate_pm_launch.err; echo "gate launch rc $?"
timeout 20 python3 bench/megakernel_layers_perf.py --also-define MKL_CAMPAIGN_STEP=15 --no-torch --json $D/perf.json > $D/perf.txt 2>&1; echo "perf rc $?"
timeout 15 python3 bench/megakernel_layers_profile.py --candidate production --candidate step_m --launches 5 --subspans --out $D/subspans > $D/subspans.txt 2>&1; echo "subspans rc $?"
timeout 5 python3 ci/gpu/layers_campaign_table.py $D > $D/table.md 2>&1
date -u >> $D/env.txt
cat $D/check.txt; cat $D/table.md; grep -E "us/step|copy floor|x floor|headline|MKL_CAMPAIGN" $D/perf.txt | head -12
grep -A8 "every layer of all 5 launches" $D/subspans.txt | grep -E "qkv|attn_chunk|router|moe_w13|oproj"
tar -czf $FINAL/round19-step-m.tar.gz -C $D .
