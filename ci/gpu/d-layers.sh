#!/usr/bin/env bash
# A third, optional GPU run for the layered MoE decode megakernel, one H200, ~110 s.
# NOT RUN YET: rounds 1 and 2 (commits ee472c0 / b0a6691 of this script) are the measured ones
# (docs/results/megakernel-layers-h200.md). What this one would settle:
#   * gemv_depth 4 (four GEMV iterations' loads in flight instead of one) gives the same bits
#     and how much faster a step gets; the tripwire's cost at that speed;
#   * snapshot_epoch with the 1e6-cycle skew (round 2's 2e5 cycles were shorter than a
#     layer's head: 0 hangs in 16 launches), clean_skew and stale_release at that skew.
# Every step has its own time cap; everything lands in $OUT/d-layers.tar.gz.
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/d-layers-out}
W=$(mktemp -d)/d-layers
mkdir -p "$W" "$OUT"
T0=$(date +%s)
log() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( 115 - ($(date +%s) - T0) )); }
cap() { local want=$1 l; l=$(left); [ "$l" -lt "$want" ] && want=$l; [ "$want" -lt 1 ] && want=1; echo "$want"; }

{
date -u +"date %Y-%m-%dT%H:%M:%SZ"; hostname
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv,noheader
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
  for d in 1 4; do
    log "gemv_depth $d: 1000 checked launches (the two must agree bit for bit: same max_rel_err)"
    timeout "$(cap 20)" "$BIN" --once "{\"launches\":1000,\"params\":{\"gemv_depth\":$d}}" > "$W/depth$d.txt" 2>&1
    echo "exit $?"; tail -c 400 "$W/depth$d.txt"; echo
  done
  for d in 1 4; do
    log "performance and tripwire cost at gemv_depth $d"
    timeout "$(cap 30)" python3 bench/megakernel_layers_perf.py --rounds 7 --launches 20 --no-torch \
      --set gemv_depth=$d --json "$W/perf_depth$d.json" > "$W/perf_depth$d.txt" 2>&1
    echo "exit $?"; cat "$W/perf_depth$d.txt"
  done
  log "snapshot_epoch at the 1e6-cycle skew: 4 runs of 4 launches"
  timeout "$(cap 30)" python3 -m hazards repro --family megakernel_layers --binary "$BIN" --store "$W/repro.db" \
    --json --keep-going --variant snapshot_epoch --max-runs 4 --launches 4 --timeout 2 > "$W/repro_snapshot_epoch.json" 2>&1
  python3 -c "
import json
d = json.load(open('$W/repro_snapshot_epoch.json'))
print(d.get('counts'), d.get('rate_in_words'))
for f in d.get('failures', [])[:1]:
    print(' ', f['outcome'], '|', (f.get('tripwire') or {}).get('sentence'))" 2>&1 | cut -c1-2000
  for v in clean_skew stale_release; do
    log "$v at the 1e6-cycle skew: 500 checked launches"
    timeout "$(cap 20)" "$BIN" --once "{\"launches\":500,\"params\":{\"variant\":\"$v\"}}" > "$W/once_$v.txt" 2>&1
    echo "exit $?"; tail -c 400 "$W/once_$v.txt"; echo
  done
fi
log "done"
tar -czf "$OUT/d-layers.tar.gz" -C "$(dirname "$W")" d-layers
ls -la "$OUT/d-layers.tar.gz"
