#!/usr/bin/env bash
# The tripwire acceptance run on one GPU (docs/results/tripwire-h200.md):
#   seeded deadlocks through `hazards repro` (classified hang, diagnosis), fixed variants
#   over 5000 launches, the snapshot-epoch hang rate with its CI, the overhead benchmark,
#   and the GPU tests. Every step has its own time cap; results go to OUT, and all of it
#   is packed into OUT.tar.gz at the end.
# usage: bench/tripwire_h200.sh OUT [BIN_DIR]   (BIN_DIR: prebuilt deadlock and tw_bench)
set -u
OUT=${1:?usage: tripwire_h200.sh OUT [BIN_DIR]}
BIN=${2:-}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
S=$OUT/repro.db
T0=$(date +%s)
log() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }

date -u +"date %Y-%m-%dT%H:%M:%SZ"; hostname
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader
nvcc --version | tail -2 | head -1
DL=$BIN/deadlock
TB=$BIN/tw_bench
if ! { [ -x "$DL" ] && "$DL" --list >/dev/null 2>&1; }; then
  log "building deadlock here"; DL=$(python3 -c 'from hazards.families import get_family; from hazards.stress_family import family_binary; print(family_binary(get_family("deadlock")))')
fi
R="python3 -m hazards repro --family deadlock --binary $DL --store $S"

for v in broken_grid broken_chunk; do
  log "seeded hang $v"
  timeout 40 $R --variant $v --timeout 3 --max-runs 2
done
log "seeded hang broken_epoch (20 launches per run)"
timeout 60 $R --variant broken_epoch --launches 20 --timeout 3 --max-runs 3

for v in fixed_grid fixed_chunk fixed_epoch fixed_epoch_widen; do
  log "fixed $v, 5000 launches"
  timeout 60 $R --variant $v --launches 5000 --timeout 60 --max-runs 1
done

log "snapshot-epoch hang rate: 1 launch per run, keep going"
timeout 100 $R --variant broken_epoch --launches 1 --timeout 1.5 --max-runs 30 --keep-going --json > "$OUT/epoch_rate.json"
python3 - "$OUT/epoch_rate.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(d["rate_in_words"], "| counts", d["counts"], "| elapsed", round(d["elapsed_s"], 1), "s")
for f in d["failures"][:3]:
    print("  run", f["seq"], f["outcome"], "|", (f.get("tripwire") or {}).get("sentence"))
PY

log "overhead: registered mapping"
timeout 60 python3 bench/tripwire_overhead.py --binary "$TB" --json "$OUT/overhead.json"
log "overhead: snapshot-thread fallback"
timeout 60 python3 bench/tripwire_overhead.py --binary "$TB" --mode snapshot --rounds 11 --json "$OUT/overhead_snapshot.json"

log "Xid lines in the kernel log"
dmesg 2>/dev/null | grep -iE "xid|nvrm" | tail -5

if [ $(( $(date +%s) - T0 )) -lt 150 ]; then
  log "GPU tests"
  timeout 90 python3 -m pytest -p hazards.pytest_plugin tests/tripwire/test_deadlock_gpu.py -q -x -p no:cacheprovider 2>&1 | tail -8
fi
log "done"
tar czf "$OUT.tar.gz" -C "$(dirname "$OUT")" "$(basename "$OUT")"
ls -la /dev/shm | grep -c hz-tw- | sed 's/^/tripwire files left in \/dev\/shm: /'
