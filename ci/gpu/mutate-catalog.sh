#!/usr/bin/env bash
# mutate-catalog.sh -- the catalog's own mutation score on one GPU (docs/results/mutate-h200.md):
# `hazards mutate --family F` on the fixed/reference variants of every runtime family, and on
# the layered megakernel's synchronization header alone, each within its share of BUDGET.
#     bash ci/gpu/mutate-catalog.sh            # BUDGET=100 s of script time by default
# Raw output: $OUT/mutate-catalog/ (console.log, one FAMILY.json per family, mutate.db) and
# $OUT/mutate-catalog.tar.gz.
cd "$(dirname "$0")/../.." && . ci/gpu/round.sh mutate-catalog "${BUDGET:-100}"
export HZ_BUILD_DIR=${HZ_BUILD_DIR:-/tmp/hz-build} PYTHONUNBUFFERED=1
machine_step
# family, its share of the budget (weights), launches per judging batch, extra arguments
ROWS=("pipeline 3 1000" "ordering 3 1000" "deadlock 3 200" "barrier_layout 3 1000" "mma_pingpong 2 200"
      "megakernel_layers 4 20 standalone/megakernel_layers/mkl_sync.cuh")
TOTAL=0; for r in "${ROWS[@]}"; do set -- $r; TOTAL=$((TOTAL + $2)); done
for r in "${ROWS[@]}"; do
  set -- $r; fam=$1; w=$2; launches=$3; shift 3
  share=$(( $(left) * w / TOTAL )); TOTAL=$((TOTAL - w))
  [ "$share" -ge 10 ] || { echo "$fam: not run (budget left $(left) s)"; continue; }
  step "mutate --family $fam ($share s)"
  timeout $((share + 30)) python3 -m hazards mutate --family "$fam" "$@" --budget "${share}s" --timeout 30 -n 3 \
    --launches "$launches" --store "$R/mutate.db" --json > "$R/$fam.json" 2> "$R/$fam.err"
  echo "exit $?"
  python3 - "$R/$fam.json" <<'PY'
import collections, json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit(f"no result ({e})")
print("score", d["score"], dict(collections.Counter(m["fate"] for m in d["mutants"])))
for m in d["mutants"]:
    print(f"  {m['id']:26} {m['fate']:15} {(m['evidence'] or m['bound'])[:100]}  [{m['path'].split('/')[-1]}]")
PY
  tail -3 "$R/$fam.err"
done
finish
