#!/bin/bash
# Hang forensics on the H200, round 2: the acceptance runs of hang forensics through the real
# collectors (`hazards repro`, forensics on by default): each hanging `deadlock` variant with
# the tripwire, two hung programs built without it (a spin on a flag nobody sets, a grid
# barrier one block past co-residency; with and without -lineinfo), and a hung PyTorch
# program. Keeps every hang.md / hang.json / hang-device.txt / hang-host-*.txt, the console
# output of each repro and `hazards stats`. Round 1 (raw cuda-gdb/py-spy recordings) was
# ci/gpu/hang_forensics_record.py. Writes $OUT/hang-forensics-acceptance.tar.gz. Budget ${HZ_BUDGET_S:-90} s.
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD
T0=$(date +%s)
BUDGET=${HZ_BUDGET_S:-90}
END=$((T0 + BUDGET - 5))
OUTD=$OUT/hang-forensics-acceptance
mkdir -p "$OUTD/runs"
date -u +%Y-%m-%dT%H:%M:%SZ > "$OUTD/date.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > "$OUTD/pip.log" 2>&1 \
  && export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PYTHONPATH
(which py-spy cuda-gdb gdb; cuda-gdb --version | head -1; py-spy --version) > "$OUTD/tools.txt" 2>&1
B=/tmp/hzf-build
mkdir -p $B
SRC=tests/forensics/programs/hung_kernels.cu
ARCH="-gencode=arch=compute_90a,code=sm_90a"
# the deadlock family's binary (cached build, -lineinfo) in the background while the rest runs
( python3 -c "from hazards.families import get_family; from hazards.stress_family import family_binary; \
print(family_binary(get_family('deadlock')))" > "$OUTD/build-deadlock.log" 2>&1; echo "rc=$?" >> "$OUTD/build-deadlock.log" ) &
BUILD_PID=$!
nvcc -O3 $ARCH -lineinfo -o $B/hung-li $SRC > "$OUTD/build-li.log" 2>&1 &
P1=$!
nvcc -O3 $ARCH -o $B/hung-noli $SRC > "$OUTD/build-noli.log" 2>&1 &
P2=$!
nvcc -O3 $ARCH -lineinfo -shared -Xcompiler -fPIC -DHZ_HANG_LIBRARY -o $B/libhung-li.so $SRC > "$OUTD/build-so.log" 2>&1 &
P3=$!
wait $P1 $P2 $P3
echo "hung programs built after $(( $(date +%s) - T0 ))s"
STORE=$OUTD/results.db

# repro NAME SECONDS_NEEDED ARGS...: one campaign, skipped when the budget cannot cover it
repro() {
  local name=$1 need=$2; shift 2
  local left=$((END - $(date +%s)))
  if [ "$left" -lt "$need" ]; then echo "$name: skipped, ${left}s left" | tee -a "$OUTD/summary.txt"; return; fi
  local t=$(date +%s%N)
  timeout -k 3 $((left - 2)) python3 -m hazards repro --store "$STORE" --name "$name" "$@" > "$OUTD/runs/$name.txt" 2>&1
  local rc=$?
  echo "$name: rc=$rc wall=$(( ($(date +%s%N) - t) / 1000000 ))ms" | tee -a "$OUTD/summary.txt"
  grep -E "^run [0-9]+: hang|tripwire|hang report" "$OUTD/runs/$name.txt" | head -4 | cut -c1-400
  ps -eo pid,stat,comm | grep -E "cuda-gdb|py-spy|hung-|deadlock" | grep -v grep >> "$OUTD/leftovers.txt"
}

repro spin-li 8 --timeout 2 -- $B/hung-li spin
repro gridbar-li 8 --timeout 2 -- $B/hung-li gridbar
repro spin-noli 8 --timeout 2 -- $B/hung-noli spin
repro torch 30 --timeout 12 -- python3 tests/forensics/programs/hung_torch.py $B/libhung-li.so
wait $BUILD_PID
echo "deadlock build: $(tail -2 "$OUTD/build-deadlock.log" | tr '\n' ' ')"
DL=$(head -1 "$OUTD/build-deadlock.log")
for v in broken_grid broken_chunk broken_epoch; do
  repro "deadlock-$v" 10 --family deadlock --variant "$v" --binary "$DL" --timeout 3 --max-runs 10
done
repro mbar-li 7 --timeout 2 -- $B/hung-li mbar
repro hoisted-li 7 --timeout 2 -- $B/hung-li hoisted

python3 -m hazards stats --store "$STORE" > "$OUTD/stats.txt" 2>&1
python3 -m hazards stats --store "$STORE" --json > "$OUTD/stats.json" 2>&1
# the artifact folders of the failing runs (hang.md & co; no large binaries)
find "$OUTD/artifacts" -name "*.bin" -size +1M -delete 2>/dev/null
nvidia-smi > "$OUTD/nvidia-smi-after.txt" 2>&1
tar czf "$OUT/hang-forensics-acceptance.tar.gz" -C "$OUT" hang-forensics-acceptance
echo "== hang-forensics-acceptance round 2 done in $(( $(date +%s) - T0 ))s"
cat "$OUTD/summary.txt"
echo "leftover processes after each repro (should be none):"; cat "$OUTD/leftovers.txt" 2>/dev/null | head
