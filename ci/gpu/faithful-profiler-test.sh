#!/usr/bin/env bash
# GPU code no CPU test reached, on the GPU: the ragged-decode profiler tests, the faithful check among
# them (it read reference.SEED_CFG, renamed CONTRACT_CFG: AttributeError on the H200 only).
# Raw output: $OUT/faithful-profiler-test/{context.txt,pytest.txt}. About 3 minutes.
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
R=$OUT/faithful-profiler-test; mkdir -p $R
{ git rev-parse --short HEAD 2>/dev/null || cat .gpu/COMMIT 2>/dev/null || echo "commit unknown"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $R/context.txt
timeout -s INT -k 10 ${BUDGET:-240} python3 -m pytest -m gpu -v -rs -p no:cacheprovider -p no:randomly \
  tests/ragged_decode/test_profiler_gpu.py > $R/pytest.txt 2>&1
echo "faithful-profiler-test rc=$?"; grep -E "passed|failed|error" $R/pytest.txt | tail -3
