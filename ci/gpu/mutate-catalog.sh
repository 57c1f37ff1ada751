#!/usr/bin/env bash
# mutate-catalog.sh -- the catalog's own mutation score on one GPU (docs/results/mutate-*.md):
# `hazards mutate --family F` on the synchronization points of the runtime families, each
# judged by one server process running one batch of every fixed/reference variant (the
# cheapest kill test: ~0.4 s of process start-up, then the batches), within BUDGET seconds.
#     bash ci/gpu/mutate-catalog.sh                                  # every row, BUDGET=170 s
#     ROWS=pipeline,mma_pingpong BUDGET=110 bash ci/gpu/mutate-catalog.sh  # only these rows
#     ROWS=pipeline,ordering@147-173 bash ci/gpu/mutate-catalog.sh   # ordering: mutants on lines 147-173
#     DRY_RUN=1 ROWS=pipeline bash ci/gpu/mutate-catalog.sh          # say the rows, run nothing
# Rows in priority order: the families' own sources and the compat.h helpers they call
# (acquire/release/fence under ordering, the cp.async waits under pipeline), deadlock, mma_pingpong, the layered
# megakernel's mkl_sync.cuh if time is left; mma_pingpong's and the megakernel's builds (about a
# minute each) start in the background at once. ROWS (comma-separated family names) keeps
# only those rows, in the table's order, and shares the budget among them; a name that is no
# row is an error before anything runs. Raw output, 5 files: $OUT/mutate-catalog/{console.log,
# results.jsonl (one --json object per row, with the row), stderr.log, mutate.db} and
# $OUT/mutate-catalog.tar.gz.
S=standalone
# family | weight of the budget (about its mutants; the megakernel build is slower) | launches per variant per run | run timeout s | prebuild | operators | sources
# (deadlock after the others: its kills are hangs, each costs its run timeout; mma_pingpong and
# the megakernel last: their builds, a minute each, are made beside the first rows: prebuild=yes)
CATALOG=("ordering|15|1000|10|no|remove-barrier,weaken-order,narrow-scope,remove-fence|$S/ordering/ordering.cu $S/common/compat.h"
      "pipeline|10|1000|10|no|remove-barrier,deepen-wait|$S/pipeline/pipeline.cu $S/common/compat.h"
      "barrier_layout|10|500|10|no|all|$S/barrier_layout/barrier_layout.cu $S/barrier_layout/barrier_layout_host.h"
      "deadlock|12|200|6|no|all|$S/deadlock/deadlock.cu"
      "mma_pingpong|6|200|10|yes|all|$S/mma_pingpong/mma_pingpong.cu $S/mma_pingpong/wgmma.cuh"
      "megakernel_layers|7|20|10|yes|all|$S/megakernel_layers/mkl_sync.cuh")
# The rows ROWS names (all by default), in the table's order.
# An entry FAMILY@A-B keeps only the row's mutants on lines A-B (hazards mutate --lines).
CHOSEN=()
declare -A LINES_OF=()
IFS=',' read -r -a WANTED <<< "${ROWS:-}"
for want in "${WANTED[@]}"; do
  name=${want%%@*}
  if [ "$name" != "$want" ]; then
    [[ ${want#*@} =~ ^[0-9]+-[0-9]+$ ]] || { echo "mutate-catalog.sh: ROWS entry '$want': lines must be A-B (e.g. ordering@140-180)" >&2; exit 2; }
    LINES_OF[$name]=${want#*@}
  fi
  hit=0; for r in "${CATALOG[@]}"; do [ "${r%%|*}" = "$name" ] && hit=1; done
  [ "$hit" = 1 ] || { echo "mutate-catalog.sh: ROWS names '$name', which is no row (rows: $(printf '%s ' "${CATALOG[@]%%|*}"))" >&2; exit 2; }
done
for r in "${CATALOG[@]}"; do
  for want in "${WANTED[@]}"; do [ "${want%%@*}" = "${r%%|*}" ] && CHOSEN+=("$r") && break; done
  [ ${#WANTED[@]} -gt 0 ] || CHOSEN+=("$r")
done
if [ -n "${DRY_RUN:-}" ]; then
  for r in "${CHOSEN[@]}"; do IFS='|' read -r fam w launches tmo pre ops srcs <<< "$r"
    echo "row $fam: weight $w, $launches launches, timeout $tmo s, prebuild $pre, operators $ops, lines ${LINES_OF[$fam]:-all}, sources $srcs"; done
  exit 0
fi
cd "$(dirname "$0")/../.." && . ci/gpu/round.sh mutate-catalog "${BUDGET:-170}"
export HZ_BUILD_DIR=${HZ_BUILD_DIR:-/tmp/hz-build} PYTHONUNBUFFERED=1
machine_step
[ -z "${ROWS:-}" ] || echo "rows: $ROWS"
# The slow builds start now, 6 jobs each, into the content-keyed build cache: their rows then
# hit it (or wait on the same compile's lock) instead of compiling when their turn comes.
# (niced: the rows' own builds come first)
PREBUILD=()
for r in "${CHOSEN[@]}"; do
  IFS='|' read -r fam _ _ _ pre ops srcs <<< "$r"
  [ "$pre" = yes ] || continue
  # shellcheck disable=SC2086  # the sources are one word each
  nice -n 10 python3 -m hazards.mutate.catalog prebuild "$fam" 6 "$ops" $srcs >> "$R/stderr.log" 2>&1 &
  PREBUILD+=($!)
done
TOTAL=0; for r in "${CHOSEN[@]}"; do IFS='|' read -r _ w _ <<< "$r"; TOTAL=$((TOTAL + w)); done
for r in "${CHOSEN[@]}"; do
  IFS='|' read -r fam w launches tmo _ ops srcs <<< "$r"
  share=$(( $(left) * w / TOTAL )); TOTAL=$((TOTAL - w))
  [ "$share" -ge 30 ] || { echo "$fam: not run (budget left $(left) s)"; continue; }
  step "mutate --family $fam ($share s; $srcs; operators $ops; lines ${LINES_OF[$fam]:-all})"
  opargs=(); [ "$ops" = all ] || opargs=(--operators "$ops")
  [ -z "${LINES_OF[$fam]:-}" ] || opargs+=(--lines "${LINES_OF[$fam]}")
  # shellcheck disable=SC2086  # the sources are one word each
  # the kill loop starts no mutant after share - 10 s; the last gets one run (<= its 10 s timeout)
  timeout $((share + 5)) python3 -m hazards mutate --family "$fam" $srcs "${opargs[@]}" --budget "$((share - 10))s" \
    --timeout "$tmo" -n 3 --launches "$launches" --store "$R/mutate.db" --json > "$R/row.json" 2>> "$R/stderr.log"
  echo "exit $?"
  python3 - "$R/row.json" "$fam" "$srcs" >> "$R/results.jsonl" <<'PY'
import collections, json, sys
path, fam, srcs = sys.argv[1:]
try:
    d = json.load(open(path))
except Exception as e:
    print(json.dumps({"family": fam, "sources": srcs, "error": f"no result ({e})"}))
    print(f"no result ({e})", file=sys.stderr)
    sys.exit()
print(json.dumps({"family": fam, "sources": srcs, **d}))
print("score", d["score"], dict(collections.Counter(m["fate"] for m in d["mutants"])), file=sys.stderr)
for m in d["mutants"]:
    print(f"  {m['id']:22} {m['fate']:15} {(m['evidence'] or m['bound'])[:110]}  [{m['path'].split('/')[-1]}]",
          file=sys.stderr)
PY
  rm -f "$R/row.json"
  grep -v '^mutate: ' "$R/stderr.log" | tail -2
done
for pid in "${PREBUILD[@]}"; do kill "$pid" 2>/dev/null; done  # only when a row was skipped
grep '^prebuild' "$R/stderr.log"
finish
