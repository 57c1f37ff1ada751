#!/usr/bin/env bash
# ninth session, call 4: the whole GPU suite on main fb65f8e (production = campaign step 10)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
FINAL=$OUT; W=/tmp/plan4; rm -rf $W; mkdir -p $W
echo "tree: main fb65f8e" > $W/tree.txt
nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader | tee $W/card.txt
date -u | tee -a $W/card.txt
( export OUT=$W; BUDGET=420 bash ci/gpu/final-gpu-tests.sh ) 2>&1 | tail -8
grep -E "FAILED|ERROR" /tmp/final-gpu-tests/gpu-tests.txt | head -20
date -u
tar -czf $FINAL/plan4.tar.gz -C $W .
