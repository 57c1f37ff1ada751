#!/usr/bin/env bash
# GPU round 2 for the layered MoE decode megakernel, one H200, budget 200 s: the
# acceptance runs. Build; sanity; the tolerance table (2 data seeds); clean variants over as
# many checked launches as fit, the corruption canaries' rates, the static model against the
# GPU at extra points (bench/megakernel_layers_acceptance.py); each hang class through
# `hazards repro` (rate, interval, tripwire sentence); `hazards stress` on the corruption
# canaries (the CLI's verdicts); the performance table and the tripwire's cost.
# Every step has its own time cap; everything lands in $OUT/d-layers.tar.gz.
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/d-layers-out}
W=$(mktemp -d)/d-layers
mkdir -p "$W" "$OUT"
T0=$(date +%s)
log() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( 192 - ($(date +%s) - T0) )); }
cap() { local want=$1 l; l=$(left); [ "$l" -lt "$want" ] && want=$l; [ "$want" -lt 1 ] && want=1; echo "$want"; }

{
date -u +"date %Y-%m-%dT%H:%M:%SZ"; hostname
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv,noheader
nvcc --version | tail -2 | head -1
git log -1 --format='commit %H %s' 2>/dev/null || echo "commit: (no git metadata in this copy)"
} | tee "$W/env.txt"

log "build"
timeout "$(cap 90)" python3 -c "
from hazards.families import get_family
from hazards.stress_family import family_binary
print(family_binary(get_family('megakernel_layers')))" > "$W/build.txt" 2>&1
BIN=$(tail -1 "$W/build.txt")
if [ ! -x "$BIN" ]; then
  log "BUILD FAILED"; cat "$W/build.txt"
else
  cp "$(dirname "$BIN")/build.log" "$W/build.log" 2>/dev/null
  cuobjdump --dump-resource-usage "$BIN" 2>&1 | grep -A1 mkl_megakernel | head -4

  log "sanity: clean, 3 checked launches"
  timeout "$(cap 30)" "$BIN" --once '{"launches":3,"params":{}}' > "$W/sanity.txt" 2>&1
  echo "exit $?"; tail -c 700 "$W/sanity.txt"; echo

  log "calibration: layers 4, seq 4096, data seeds 1 and 2"
  timeout "$(cap 40)" python3 -m hazards.megakernel_layers.calibration --binary "$BIN" --seeds 1 2 \
    --json "$W/calibration.json" > "$W/calibration.txt" 2>&1
  echo "exit $?"; cat "$W/calibration.txt"

  log "clean variants, corruption canaries, agreement points (one warm server)"
  timeout "$(cap 75)" python3 bench/megakernel_layers_acceptance.py --clean-budget 9 --canary-budget 2.5 \
    --json "$W/acceptance.json" > "$W/acceptance.txt" 2>&1
  echo "exit $?"; cat "$W/acceptance.txt"

  R="python3 -m hazards repro --family megakernel_layers --binary $BIN --store $W/repro.db --json --keep-going"
  for spec in "participant_set 2 5" "chunk_supply 2 5" "shared_line 2 5" "snapshot_epoch 4 4"; do
    set -- $spec
    log "hang class $1: $2 runs of $3 launches, 1.5 s watchdog"
    timeout "$(cap 25)" $R --variant "$1" --max-runs "$2" --launches "$3" --timeout 1.5 \
      > "$W/repro_$1.json" 2> "$W/repro_$1.err"
    python3 -c "
import json
d = json.load(open('$W/repro_$1.json'))
print(d.get('counts'), d.get('rate_in_words'))
for f in d.get('failures', [])[:1]:
    print(' ', f['outcome'], '|', (f.get('tripwire') or {}).get('sentence'))" 2>&1 | cut -c1-2000
  done

  log "hazards stress on the corruption canaries (the CLI's verdicts)"
  timeout "$(cap 25)" python3 -m hazards stress megakernel_layers --variant stale_descriptor --variant amax_tail \
    --variant dead_flag --variant stale_release --requests 3 --launches 20 --timeout 20 --store "$W/stress.db" \
    > "$W/stress.txt" 2>&1
  echo "exit $?"; tail -25 "$W/stress.txt"

  log "performance and tripwire cost"
  timeout "$(cap 60)" python3 bench/megakernel_layers_perf.py --rounds 9 --launches 20 --torch-calls 10 \
    --json "$W/perf.json" > "$W/perf.txt" 2>&1
  echo "exit $?"; cat "$W/perf.txt"
fi
log "done"
tar -czf "$OUT/d-layers.tar.gz" -C "$(dirname "$W")" d-layers
ls -la "$OUT/d-layers.tar.gz"
