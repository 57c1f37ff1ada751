#!/usr/bin/env bash
# ninth session, call 5: the promotion round of step 10 (layers-campaign.sh promote) on main fb65f8e
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
FINAL=$OUT; W=/tmp/plan5; rm -rf $W; mkdir -p $W
echo "tree: main fb65f8e" > $W/tree.txt
nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader | tee $W/card.txt
date -u | tee -a $W/card.txt
( export OUT=$W; BUDGET=${PB:-330} timeout $(( ${PB:-330} + 15 )) bash ci/gpu/layers-campaign.sh promote ) 2>&1 | tail -60
date -u
tar -czf $FINAL/plan5.tar.gz -C $W .
