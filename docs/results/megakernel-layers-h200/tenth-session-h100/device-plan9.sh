#!/usr/bin/env bash
# tenth session, call 9 (the last of the device budget): round 18's family check on production =
# step 14 (the promotion rule's item 4: `hazards check --families megakernel_layers`), then the whole
# GPU suite on the session's final code (its logit-gate, canary and clean-variant tests build the
# default kernel: production = step 14)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
FINAL=$OUT; W=/tmp/plan9; rm -rf $W; mkdir -p $W
echo "tree: main $(cat .hazards/tree.txt)" > $W/tree.txt
nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $W/card.txt
date -u | tee -a $W/card.txt
timeout 140 python3 -m hazards check --families megakernel_layers --skip clang --budget 90s --junit $W/check-junit.xml > $W/check.txt 2>&1
echo "check rc $?" | tee -a $W/card.txt; tail -25 $W/check.txt | cut -c1-220
date -u | tee -a $W/card.txt
( export OUT=$W; BUDGET=${BUDGET:-400} bash ci/gpu/final-gpu-tests.sh ) 2>&1 | tail -8
grep -E "FAILED|ERROR" /tmp/final-gpu-tests/gpu-tests.txt | head -20
date -u | tee -a $W/card.txt
tar -czf $FINAL/plan9.tar.gz -C $W .
