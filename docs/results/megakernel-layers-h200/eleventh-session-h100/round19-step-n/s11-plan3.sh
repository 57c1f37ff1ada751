#!/usr/bin/env bash
# eleventh session, call 3: (1) step (n) (MKL_CAMPAIGN_STEP 16, branch tail16 at 5983870 = main 851e065 +
# step (n), a git archive in its own folder) against production (step 14): its GPU tests, both gates,
# the bench without torch, the sub-spans; (2) on main (review17 merged): step (j)'s hang test with the
# device-counted arrivals, and repro -D MKL_CAMPAIGN_STEP=12 (a hang explained with step 12's tiles)
HERE=$PWD; FINAL=$OUT; D=/tmp/round19n; rm -rf $D /tmp/t16; mkdir -p $D /tmp/t16
tar -xf .hazards/t16.tar -C /tmp/t16; cp .hazards/s11-plan3.sh $D/
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader > $D/env.txt
echo "tree (1): branch tail16 5983870 (main 851e065 + step (n)); tree (2): main $(cat .hazards/tree.txt)" >> $D/env.txt; date -u >> $D/env.txt
cd /tmp/t16; export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
timeout 100 python3 -c "
import concurrent.futures as cf
from hazards.families import get_family
from hazards.stress_family import family_binary
f = get_family('megakernel_layers')
ds = [None, {'MKL_CAMPAIGN_STEP': 16}, {'HZ_PROFILER': 1}, {'HZ_PROFILER': 1, 'MKL_CAMPAIGN_STEP': 16},
      {'HZ_PROFILER': 1, 'MKL_PROF_SUBSPANS': 1}, {'HZ_PROFILER': 1, 'MKL_PROF_SUBSPANS': 1, 'MKL_CAMPAIGN_STEP': 16}]
print(list(cf.ThreadPoolExecutor(6).map(lambda d: family_binary(f, defines=d), ds)))" > $D/build.txt 2>&1; echo "build rc $?"
timeout 90 python3 -m pytest -q -p no:randomly tests/megakernel_layers/test_gpu.py -k "step_n" > $D/pytest.txt 2>&1; echo "pytest rc $?"; tail -4 $D/pytest.txt | cut -c1-300
timeout 40 python3 -m hazards gate perf --baseline megakernel_layers:production --candidate megakernel_layers:step_n --workers 132 --repeats 12 --profiled-launches 3 --wait 0s --task worker --json > $D/gate_pn_launch.json 2> $D/gate_pn_launch.err; echo "gate n launch rc $?"
timeout 50 python3 -m hazards gate perf --baseline megakernel_layers:production --candidate megakernel_layers:step_n --workers 132 --repeats 12 --profiled-launches 3 --wait 0s --json > $D/gate_pn.json 2> $D/gate_pn.err; echo "gate n rc $?"
timeout 60 python3 bench/megakernel_layers_perf.py --also-define MKL_CAMPAIGN_STEP=16 --no-torch --json $D/perf.json > $D/perf.txt 2>&1; echo "perf rc $?"
timeout 60 python3 bench/megakernel_layers_profile.py --candidate production --candidate step_n --launches 5 --subspans --out $D/subspans > $D/subspans.txt 2>&1; echo "subspans rc $?"
timeout 10 python3 ci/gpu/layers_campaign_table.py $D > $D/table.md 2>&1
cat $D/table.md; grep -E "copy floor|MKL_CAMPAIGN|headline" $D/perf.txt | head -6
grep -A10 "every layer of all 5 launches" $D/subspans.txt | head -24
cd "$HERE"; export PYTHONPATH=$PWD; R=$D/review17; mkdir -p $R
timeout 110 python3 -m pytest -q -p no:randomly tests/megakernel_layers/test_gpu.py -k step_j_participant_set_still_hangs > $R/step-j-hang.txt 2>&1; echo "step j hang rc $?"; tail -3 $R/step-j-hang.txt | cut -c1-300
timeout 40 python3 -m hazards repro --family megakernel_layers --variant participant_set -D MKL_CAMPAIGN_STEP=12 -n 1 --timeout 6 --no-forensics --json > $R/repro-step12.json 2> $R/repro-step12.err; echo "repro -D rc $?"
python3 -c "
import json,sys; d=json.load(open('$R/repro-step12.json')); f=(d.get('failures') or [{}])[0]; print(str((f.get('tripwire') or {}).get('sentence'))[:600])" 2>&1 | tail -3
date -u >> $D/env.txt
tar -czf $FINAL/round19n.tar.gz -C $D .
