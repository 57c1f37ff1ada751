#!/usr/bin/env bash
# tenth session, call 2: round 15 (step (i) against production), the commands of
# docs/results/megakernel-layers-h200.md "Round 15 (planned)", on main 5bc3109
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
FINAL=$OUT; D=/tmp/round15; rm -rf $D; mkdir -p $D
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader > $D/env.txt; echo "tree: main 5bc3109" >> $D/env.txt; date -u >> $D/env.txt
timeout 120 python3 -m hazards gate perf --baseline megakernel_layers:production --candidate megakernel_layers:step_i --workers 132 --repeats 12 --profiled-launches 3 --wait 0s --json > $D/gate_pi.json 2> $D/gate_pi.err; echo "gate rc $?"
timeout 90 python3 -m hazards gate perf --baseline megakernel_layers:production --candidate megakernel_layers:step_i --workers 132 --repeats 12 --profiled-launches 3 --wait 0s --task worker --json > $D/gate_pi_launch.json 2> $D/gate_pi_launch.err; echo "gate launch rc $?"
timeout 45 python3 bench/megakernel_layers_perf.py --also-define MKL_CAMPAIGN_STEP=11 --no-torch --json $D/perf.json > $D/perf.txt 2>&1; echo "perf rc $?"
timeout 30 python3 bench/megakernel_layers_profile.py --candidate production --candidate step_i --launches 5 --out $D/profile > $D/profile.txt 2>&1; echo "profile rc $?"
timeout 40 python3 bench/megakernel_layers_acceptance.py --define MKL_CAMPAIGN_STEP=11 --clean-launches 500 --clean-budget 2 --canary-budget 1 --skip-agreement --json $D/acceptance.json > $D/acceptance.txt 2>&1; echo "acceptance rc $?"
timeout 60 python3 -m pytest -q -p no:randomly tests/megakernel_layers/test_gpu.py -k step_i > $D/pytest.txt 2>&1; echo "pytest rc $?"
timeout 10 python3 ci/gpu/layers_campaign_table.py $D > $D/table.md 2>&1
date -u >> $D/env.txt
tail -3 $D/pytest.txt; cat $D/table.md | head -20; tail -5 $D/perf.txt
tar -czf $FINAL/round15.tar.gz -C $D .
