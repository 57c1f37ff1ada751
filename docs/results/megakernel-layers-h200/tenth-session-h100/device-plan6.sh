#!/usr/bin/env bash
# tenth session, call 6 (main a merge of qkvspread10 + subspan10 on 02fd85c): round 16's step (j)
# against production (gates, bench, profile, GPU tests), then the profiler's sub-spans of production
# and step (j) beside a plain profiled run
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
FINAL=$OUT; D=/tmp/round16j; rm -rf $D; mkdir -p $D
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader > $D/env.txt; echo "tree: main $(cat .hazards/tree.txt)" >> $D/env.txt; date -u >> $D/env.txt
timeout 60 python3 -c "import concurrent.futures as cf; from hazards.families import get_family; from hazards.stress_family import family_binary; f=get_family('megakernel_layers'); ds=[None,{'MKL_CAMPAIGN_STEP':12},{'HZ_PROFILER':1},{'HZ_PROFILER':1,'MKL_CAMPAIGN_STEP':12},{'HZ_PROFILER':1,'MKL_PROF_SUBSPANS':1},{'HZ_PROFILER':1,'MKL_PROF_SUBSPANS':1,'MKL_CAMPAIGN_STEP':12}]; print(list(cf.ThreadPoolExecutor(6).map(lambda d: family_binary(f, defines=d), ds)))" > $D/build.txt 2>&1; echo "build rc $?"
timeout 60 python3 -m hazards gate perf --baseline megakernel_layers:production --candidate megakernel_layers:step_j --workers 132 --repeats 12 --profiled-launches 3 --wait 0s --json > $D/gate_pj.json 2> $D/gate_pj.err; echo "gate rc $?"
timeout 40 python3 -m hazards gate perf --baseline megakernel_layers:production --candidate megakernel_layers:step_j --workers 132 --repeats 12 --profiled-launches 3 --wait 0s --task worker --json > $D/gate_pj_launch.json 2> $D/gate_pj_launch.err; echo "gate launch rc $?"
timeout 40 python3 bench/megakernel_layers_perf.py --also-define MKL_CAMPAIGN_STEP=12 --no-torch --json $D/perf.json > $D/perf.txt 2>&1; echo "perf rc $?"
timeout 30 python3 bench/megakernel_layers_profile.py --candidate production --candidate step_j --launches 5 --out $D/plain > $D/plain.txt 2>&1; echo "profile rc $?"
timeout 60 python3 bench/megakernel_layers_profile.py --candidate production --candidate step_j --launches 5 --subspans --out $D/subspans > $D/subspans.txt 2>&1; echo "subspans rc $?"
timeout 40 python3 -m pytest -q -p no:randomly tests/megakernel_layers/test_gpu.py -k "step_j or subspan" > $D/pytest.txt 2>&1; echo "pytest rc $?"
timeout 10 python3 ci/gpu/layers_campaign_table.py $D > $D/table.md 2>&1
date -u >> $D/env.txt
tail -3 $D/pytest.txt; cat $D/table.md; grep -E "headline|copy floor|x floor" $D/perf.txt | head; grep -E "^==|layer head" $D/plain.txt
tar -czf $FINAL/round16j.tar.gz -C $D .
