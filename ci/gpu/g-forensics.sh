#!/bin/bash
# g-forensics on the H200. Round 1: record real cuda-gdb / py-spy output of hung programs
# (hung_kernels.cu with and without -lineinfo, a PyTorch hang) and time each collector.
# Writes $OUT/g-forensics.tar.gz. Budget: ${HZ_BUDGET_S:-100} seconds.
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD
T0=$(date +%s)
BUDGET=${HZ_BUDGET_S:-100}
DEADLINE=$((T0 + BUDGET - 8))
OUTD=$OUT/g-forensics
mkdir -p "$OUTD"
git rev-parse HEAD > "$OUTD/commit.txt" 2>/dev/null || true
date -u +%Y-%m-%dT%H:%M:%SZ > "$OUTD/date.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > "$OUTD/pip.log" 2>&1 \
  && export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PYTHONPATH
B=/tmp/hzf-build
mkdir -p $B
SRC=tests/forensics/programs/hung_kernels.cu
ARCH="-gencode=arch=compute_90a,code=sm_90a"
nvcc -O3 $ARCH -lineinfo -o $B/hung-li $SRC > "$OUTD/build-li.log" 2>&1 &
nvcc -O3 $ARCH -o $B/hung-noli $SRC > "$OUTD/build-noli.log" 2>&1 &
nvcc -O3 $ARCH -lineinfo -shared -Xcompiler -fPIC -DHZ_HANG_LIBRARY -o $B/libhung-li.so $SRC > "$OUTD/build-so.log" 2>&1 &
wait
echo "build done after $(( $(date +%s) - T0 ))s"
timeout -k 2 $((DEADLINE - $(date +%s))) python3 ci/gpu/g_forensics_record.py $B "$OUTD" $DEADLINE 2>&1 | tee "$OUTD/record.log"
# anything the recorder started and did not end (it was cut short): kill by recorded pid
for pid in $(cat "$OUTD/pids.txt" 2>/dev/null); do kill -9 -- "-$pid" 2>/dev/null; done
sleep 0.5
nvidia-smi > "$OUTD/nvidia-smi-after.txt" 2>&1
tar czf "$OUT/g-forensics.tar.gz" -C "$OUT" g-forensics
echo "g-forensics: done in $(( $(date +%s) - T0 ))s; raw files: $(ls "$OUTD/raw" 2>/dev/null | wc -l)"
