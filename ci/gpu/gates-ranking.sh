#!/usr/bin/env bash
# The gates on the GPU, round 2 (budget 150 s): the perf-gate ranking table for the five candidates of
# the ragged-decode megakernel (improved, noop, slower, sloughing, incorrect vs baseline,
# worker sweep, rank-based intervals), the logit-gate table for the known-bad candidates
# (training the synthetic-language model on the way), `hazards gate logits` on two of the
# GPU-produced sinks, then the profiler's GPU tests if time is left.
# Writes everything into $OUT/gates-ranking.tar.gz.
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD
export HZ_CACHE_DIR=/tmp/hz-cache HZ_LEASE_DIR=/tmp/hz-leases HZ_MEGAKERNEL_BUILD_DIR=/tmp/hz-build
R=/tmp/gates-ranking-results
rm -rf "$R"; mkdir -p "$R"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
{
  date -u; hostname; git rev-parse HEAD; git status --short | head -5; nvidia-smi -L; nvcc --version | tail -1
  python3 -c "import torch; print(torch.__version__)"
} > "$R/env.txt" 2>&1

stamp "build the profiled megakernel libraries (baseline build and the noop candidate's) in parallel"
python3 -c "from hazards.ragged_decode.build import build_library; print(build_library(profiler=True))" > "$R/build_prof.txt" 2>&1 &
python3 -c "from hazards.ragged_decode.build import build_library; print(build_library(profiler=True, defines=('HZ_RD_NOOP_CANDIDATE',)))" > "$R/build_noop.txt" 2>&1 &
wait
stamp "built"

stamp "1. perf gate ranking: five candidates vs baseline, task attend, workers 8,64,128,132, 12 pairs"
CMD="python3 -m hazards gate perf --baseline megakernel:baseline --candidate megakernel:improved \
  --candidate megakernel:noop --candidate megakernel:slower --candidate megakernel:sloughing \
  --candidate megakernel:incorrect --workers 8,64,128,132 --repeats 12 --task attend --profiled-launches 3 --json"
echo "$CMD" > "$R/gate_perf.cmd"
timeout 80 $CMD > "$R/gate_perf.json" 2> "$R/gate_perf.stderr"
echo "rc=$?" >> "$R/gate_perf.stderr"
python3 -c "
import json
from hazards.gates.perf import format_report
print(format_report(json.load(open('$R/gate_perf.json'))))" > "$R/gate_perf.txt" 2>&1
stamp "perf gate done"

stamp "2. logit harness: train (30 s), every path, every scenario"
echo "python3 -m hazards.gates.synthlm.harness --out /tmp/lg --max-seconds 30" > "$R/logit_harness.cmd"
timeout 75 python3 -m hazards.gates.synthlm.harness --out /tmp/lg --max-seconds 30 \
  > "$R/logit_harness.txt" 2> "$R/logit_harness.stderr"
echo "rc=$?" >> "$R/logit_harness.stderr"
cp /tmp/lg/result.json "$R/logit_result.json" 2>/dev/null
stamp "logit harness done"

stamp "3. hazards gate logits on the GPU-produced sinks"
{
  python3 -m hazards gate logits --reference /tmp/lg/reference.npz --candidate /tmp/lg/clean.npz \
    --candidate /tmp/lg/accum23.npz --candidate /tmp/lg/bf16_logits.npz; echo "rc=$?"
  python3 -m hazards gate logits --reference /tmp/lg/reference_mxfp4.npz --candidate /tmp/lg/quantized.npz; echo "rc=$?"
  python3 -m hazards gate logits --reference /tmp/lg/reference.npz --candidate /tmp/lg/quantized.npz; echo "rc=$?"
} > "$R/gate_logits_cli.txt" 2>&1
stamp "gate logits done"

if [ $(( $(date +%s) - T0 )) -lt 115 ]; then
  stamp "4. the profiler's GPU tests"
  timeout $(( 145 - ($(date +%s) - T0) )) python3 -m pytest -q -p no:cacheprovider tests/ragged_decode/test_profiler_gpu.py \
    > "$R/pytest_profiler_gpu.txt" 2>&1
  echo "rc=$?" >> "$R/pytest_profiler_gpu.txt"
fi
stamp "all done"
mkdir -p "$OUT"
tar -czf "$OUT/gates-ranking.tar.gz" -C "$R" .
echo "== summary"
grep -E "vs megakernel:baseline|overall" "$R/gate_perf.txt"
tail -1 "$R/gate_perf.stderr"
grep -E "^model:|^\| [a-z]|^calibration" "$R/logit_harness.txt"
tail -1 "$R/logit_harness.stderr"
grep -E "rc=|: (PASS|FAIL)|error" "$R/gate_logits_cli.txt"
tail -2 "$R/pytest_profiler_gpu.txt" 2>/dev/null
stamp "end"
