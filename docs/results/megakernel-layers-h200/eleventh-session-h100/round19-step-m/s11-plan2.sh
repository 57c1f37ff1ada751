#!/usr/bin/env bash
# eleventh session, call 2: round 19, step (m) (MKL_CAMPAIGN_STEP 15, branch mma15 at a802d77, a git
# archive extracted in its own folder) against production (step 14): its GPU test (closeness), both
# gates, the bench without torch, the sub-spans of both
HERE=$PWD; FINAL=$OUT; D=/tmp/round19; rm -rf $D /tmp/m15; mkdir -p $D /tmp/m15
tar -xf .hazards/m15.tar -C /tmp/m15; cp .hazards/s11-plan2.sh $D/; cd /tmp/m15
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader > $D/env.txt; echo "tree: branch mma15 a802d77 (main 851e065 + step (m))" >> $D/env.txt; date -u >> $D/env.txt
timeout 100 python3 -c "
import concurrent.futures as cf
from hazards.families import get_family
from hazards.stress_family import family_binary
f = get_family('megakernel_layers')
ds = [None, {'MKL_CAMPAIGN_STEP': 15}, {'HZ_PROFILER': 1}, {'HZ_PROFILER': 1, 'MKL_CAMPAIGN_STEP': 15},
      {'HZ_PROFILER': 1, 'MKL_PROF_SUBSPANS': 1}, {'HZ_PROFILER': 1, 'MKL_PROF_SUBSPANS': 1, 'MKL_CAMPAIGN_STEP': 15}]
print(list(cf.ThreadPoolExecutor(6).map(lambda d: family_binary(f, defines=d), ds)))" > $D/build.txt 2>&1; echo "build rc $?"
timeout 90 python3 -m pytest -q -p no:randomly tests/megakernel_layers/test_gpu.py -k "step_m" > $D/pytest.txt 2>&1; echo "pytest rc $?"; tail -15 $D/pytest.txt | cut -c1-300
timeout 40 python3 -m hazards gate perf --baseline megakernel_layers:production --candidate megakernel_layers:step_m --workers 132 --repeats 12 --profiled-launches 3 --wait 0s --task worker --json > $D/gate_pm_launch.json 2> $D/gate_pm_launch.err; echo "gate m launch rc $?"
timeout 50 python3 -m hazards gate perf --baseline megakernel_layers:production --candidate megakernel_layers:step_m --workers 132 --repeats 12 --profiled-launches 3 --wait 0s --json > $D/gate_pm.json 2> $D/gate_pm.err; echo "gate m rc $?"
timeout 60 python3 bench/megakernel_layers_perf.py --also-define MKL_CAMPAIGN_STEP=15 --no-torch --json $D/perf.json > $D/perf.txt 2>&1; echo "perf rc $?"
timeout 60 python3 bench/megakernel_layers_profile.py --candidate production --candidate step_m --launches 5 --subspans --out $D/subspans > $D/subspans.txt 2>&1; echo "subspans rc $?"
timeout 10 python3 ci/gpu/layers_campaign_table.py $D > $D/table.md 2>&1
date -u >> $D/env.txt
cat $D/table.md; grep -E "us/step|copy floor|x floor|headline|MKL_CAMPAIGN" $D/perf.txt | head -12
grep -A12 "every layer of all 5 launches" $D/subspans.txt | head -40
tar -czf $FINAL/round19.tar.gz -C $D .
