#!/usr/bin/env bash
# Follow-up to bench/tripwire_h200.sh (docs/results/tripwire-h200.md): more runs for the
# snapshot-epoch hang rate (tripwire off: a hang then costs only the timeout and the
# kill), the same at skew_ppm=0 (the natural race alone), and the overhead benchmark at
# two phase lengths.
# usage: bench/tripwire_h200_followup.sh OUT [BIN_DIR]
set -u
OUT=${1:?usage: tripwire_h200_followup.sh OUT [BIN_DIR]}
BIN=${2:-}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
log() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }
date -u +"date %Y-%m-%dT%H:%M:%SZ"; nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader
R="python3 -m hazards repro --family deadlock --binary $BIN/deadlock --store $OUT/rate.db --no-tripwire --json"
summ() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["rate_in_words"], d["counts"], round(d["elapsed_s"],1), "s")' "$1"; }

log "broken_epoch, skew_ppm=1000 (model 28.9%), 1 launch per run, 60 runs"
timeout 110 $R --variant broken_epoch --launches 1 --timeout 1 --max-runs 60 --keep-going > "$OUT/rate_skew.json"; summ "$OUT/rate_skew.json"
log "broken_epoch, skew_ppm=0 (natural race only), 20 launches per run, 10 runs"
timeout 60 $R --variant broken_epoch --params '{"skew_ppm": 0}' --launches 20 --timeout 1 --max-runs 10 --keep-going > "$OUT/rate_noskew.json"; summ "$OUT/rate_noskew.json"
for w in 512 2048; do
  log "overhead, work $w"
  timeout 60 python3 bench/tripwire_overhead.py --binary "$BIN/tw_bench" --work $w --json "$OUT/overhead_w$w.json"
done
log "done"
tar czf "$OUT.tar.gz" -C "$(dirname "$OUT")" "$(basename "$OUT")"
