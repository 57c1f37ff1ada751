#!/usr/bin/env bash
# eleventh session, call 1: the ragged-decode regression on one card, the kernel at the issue's filing
# commit (f05cafc) against main 851e065, alternated old/new/old/new (.hazards/ragged_pair.sh)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
W=/tmp/ragged-pair; rm -rf $W; mkdir -p $W; export W
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader > $W/env.txt
echo "tree: main $(cat .hazards/tree.txt); old: f05cafc (git archive of hazards stress standalone bench pyproject.toml)" >> $W/env.txt; date -u >> $W/env.txt
cp .hazards/ragged_pair.sh .hazards/s11-plan1.sh $W/
bash .hazards/ragged_pair.sh 20 2>&1 | tee $W/pair.txt
date -u >> $W/env.txt; cat $W/env.txt
tar -czf $OUT/ragged-pair.tar.gz -C $W .
