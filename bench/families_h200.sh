#!/usr/bin/env bash
# The first runtime families' acceptance run on one GPU (H200): stress every variant of
# `pipeline` and `ordering` through the engine, racecheck through `hazards stress --sanitizer`, the
# server-throughput and litmus-incantation benchmarks, and the GPU tests. Every step has a
# time cap so one hang cannot eat the whole device lease; outputs go to $OUT (<= 8 files).
#
#   OUT=/tmp/out bash bench/families_h200.sh [steps...]   (steps: info pipeline ordering
#                                                         racecheck racecheck2 throughput litmus pytest)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/hz-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
WORK=$(mktemp -d /tmp/hz-accept.XXXX)
STORE=$WORK/results.db
STEPS=${*:-info pipeline ordering racecheck throughput litmus pytest}
LOG=$OUT/log.txt
say() { echo "=== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }

if has info; then
  say "machine"
  { date -u; hostname; nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.mem --format=csv;
    nvcc --version | tail -2; compute-sanitizer --version | head -2; python3 --version; git describe --always --dirty; } 2>&1 | tee -a "$LOG"
  say "build (cache carried from the CPU machine when the compiler matches)"
  timeout 200 python3 -c "
from hazards.families import get_family
from hazards.stress_family import family_binary
for f in ('pipeline', 'ordering'): print(family_binary(get_family(f)))" 2>&1 | tee -a "$LOG"
fi
# stress_step NAME TIMEOUT ARGS...: `hazards stress ARGS --json` into $OUT/NAME.json + a table.
stress_step() {
  local name=$1 cap=$2; shift 2
  say "hazards stress $*"
  timeout "$cap" python3 -m hazards stress "$@" --json --store "$STORE" > "$OUT/$name.json" 2>>"$LOG"
  echo "exit $?" | tee -a "$LOG"
  python3 bench/summarize_stress.py "$OUT/$name.json" 2>&1 | tee -a "$LOG"
}
has pipeline && stress_step stress_pipeline 90 pipeline --launches 1000 --requests 10
has ordering && stress_step stress_ordering 150 ordering --launches 500 --requests 20
has racecheck && stress_step racecheck 120 pipeline --variant broken_war --variant fixed --variant reference \
  --sanitizer racecheck --launches 2 --requests 2 --set blocks=16
# racecheck on the cp.async variants: what it does and does not see
has racecheck2 && stress_step racecheck2 120 pipeline --variant broken_wait --variant broken_tail \
  --variant fixed_pingpong --sanitizer racecheck --launches 2 --requests 1 --set blocks=16
if has throughput; then
  say "bench/server_throughput.py"
  timeout 90 python3 bench/server_throughput.py --requests 10 --json "$WORK/throughput.json" 2>&1 | tee -a "$LOG"
fi
if has litmus; then
  say "bench/litmus_incantations.py"
  timeout 120 python3 bench/litmus_incantations.py --seconds 1.0 --confirm-seconds 3 --json "$WORK/litmus.json" 2>&1 | tee -a "$LOG"
fi
if has pytest; then
  say "GPU tests"
  timeout 150 python3 -m pytest tests/families/test_families_gpu.py -q -p no:cacheprovider 2>&1 | tail -30 | tee -a "$LOG"
fi
say "pack"
for f in throughput.json litmus.json; do [ -f "$WORK/$f" ] && cp "$WORK/$f" "$OUT/"; done
STORE_DIR=$(dirname "$STORE")
tar czf "$OUT/artifacts.tgz" -C "$STORE_DIR" . 2>/dev/null
ls -la "$OUT" | tee -a "$LOG"
