#!/usr/bin/env bash
# eleventh session, call 4: round 20, step 15's promotion round on main (production = step 15; PREV
# step_14, SAME_STEP none): layers-campaign.sh promote (BUDGET 430), then a chunk sweep of the new
# production (the bench without torch: chunk_tokens 256 / auto (124) / 64)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
FINAL=$OUT; D=/tmp/round20; rm -rf $D; mkdir -p $D; cp .hazards/s11-plan4.sh $D/
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader > $D/env.txt; echo "tree: main $(cat .hazards/tree.txt)" >> $D/env.txt; date -u >> $D/env.txt
OUT=$D BUDGET=430 timeout 450 bash ci/gpu/layers-campaign.sh promote > $D/promote-console.txt 2>&1; echo "promote rc $?"
grep -E "^== |exit|rc |PASS|FAIL|headline|x copy floor|verdict|faster|slower|no-change|sloughing|passed|failed|hang" $D/promote-console.txt | cut -c1-260 | tail -70
date -u >> $D/env.txt
timeout 70 python3 bench/megakernel_layers_perf.py --no-torch --also chunk_tokens=256 --also chunk_tokens=64 --json $D/perf_chunks.json > $D/perf_chunks.txt 2>&1; echo "chunks rc $?"; tail -8 $D/perf_chunks.txt
date -u >> $D/env.txt
tar -czf $FINAL/round20.tar.gz -C $D .
