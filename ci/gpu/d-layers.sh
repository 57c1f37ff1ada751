#!/usr/bin/env bash
# GPU round 1 for the layered MoE decode megakernel (issue 15), one H200, budget 170 s:
#   build; the clean kernel against the torch reference (calibration rows at one point, the
#   device oracle at three more); each hazard switch once through `hazards repro` (short
#   timeout, tripwire sentence); a quick performance / tripwire-cost number.
# Every step has its own time cap; everything lands in $OUT/d-layers.tar.gz.
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/d-layers-out}
W=$(mktemp -d)/d-layers
mkdir -p "$W" "$OUT"
T0=$(date +%s)
log() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( 165 - ($(date +%s) - T0) )); }
cap() { local want=$1 l; l=$(left); [ "$l" -lt "$want" ] && want=$l; [ "$want" -lt 1 ] && want=1; echo "$want"; }

{
date -u +"date %Y-%m-%dT%H:%M:%SZ"; hostname
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv,noheader
nvcc --version | tail -2 | head -1
git log -1 --format='commit %H %s' 2>/dev/null || echo "commit: (no git metadata in this copy)"
} | tee "$W/env.txt"

log "build"
timeout "$(cap 120)" python3 -c "
from hazards.families import get_family
from hazards.stress_family import family_binary
print(family_binary(get_family('megakernel_layers')))" > "$W/build.txt" 2>&1
BIN=$(tail -1 "$W/build.txt")
if [ ! -x "$BIN" ]; then
  log "BUILD FAILED"; cat "$W/build.txt"
else
  cp "$(dirname "$BIN")/build.log" "$W/build.log" 2>/dev/null
  cuobjdump --dump-resource-usage "$BIN" > "$W/resources.txt" 2>&1
  grep -E "mkl_megakernel" -A1 "$W/resources.txt" | head -8
  "$BIN" --list > "$W/list.json"

  log "sanity: clean, 3 checked launches"
  timeout "$(cap 30)" "$BIN" --once '{"launches":3,"params":{}}' > "$W/sanity.txt" 2>&1
  echo "exit $?"; cat "$W/sanity.txt"

  log "calibration at layers 4, seq 4096 (torch reference, E, D, the kernel and the binary's reference)"
  timeout "$(cap 60)" python3 -m hazards.megakernel_layers.calibration --binary "$BIN" --seeds 1 \
    --json "$W/calibration.json" > "$W/calibration.txt" 2>&1
  echo "exit $?"; cat "$W/calibration.txt"

  for v in clean_long clean_grid64 clean_skew; do
    log "device oracle: $v, 50 checked launches"
    timeout "$(cap 25)" "$BIN" --once "{\"launches\":50,\"params\":{\"variant\":\"$v\"}}" > "$W/once_$v.txt" 2>&1
    echo "exit $?"; tail -c 600 "$W/once_$v.txt"; echo
  done
  log "device oracle: small model, 50 checked launches"
  timeout "$(cap 20)" "$BIN" --once '{"launches":50,"params":{"model":"small"}}' > "$W/once_small.txt" 2>&1
  echo "exit $?"; tail -c 600 "$W/once_small.txt"; echo

  R="python3 -m hazards repro --family megakernel_layers --binary $BIN --store $W/repro.db --json"
  for v in participant_set chunk_supply snapshot_epoch shared_line; do
    log "hang switch $v (one run, 10 launches, 4 s)"
    timeout "$(cap 20)" $R --variant "$v" --launches 10 --timeout 4 --max-runs 1 > "$W/repro_$v.json" 2> "$W/repro_$v.err"
    python3 -c "
import json,sys
d=json.load(open('$W/repro_$v.json'))
print(d['counts'], [ (f['outcome'], (f.get('tripwire') or {}).get('sentence')) for f in d['failures'][:1]])" 2>&1 | cut -c1-1500
  done
  for v in stale_release partial_no_fence routing_no_fence stale_descriptor amax_tail dead_flag; do
    log "corruption switch $v (one run, 20 launches)"
    timeout "$(cap 15)" "$BIN" --once "{\"launches\":20,\"params\":{\"variant\":\"$v\"}}" > "$W/once_$v.txt" 2>&1
    echo "exit $?"; tail -c 400 "$W/once_$v.txt"; echo
  done

  log "performance and tripwire cost (quick)"
  timeout "$(cap 70)" python3 bench/megakernel_layers_perf.py --rounds 5 --launches 10 --torch-calls 5 \
    --json "$W/perf.json" > "$W/perf.txt" 2>&1
  echo "exit $?"; cat "$W/perf.txt"
fi
log "done"
tar -czf "$OUT/d-layers.tar.gz" -C "$(dirname "$W")" d-layers
ls -la "$OUT/d-layers.tar.gz"
