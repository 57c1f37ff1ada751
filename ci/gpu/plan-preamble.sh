# Sourced by a session's device plan (`.hazards/<plan>.sh`, kept beside the results page afterwards) so each plan
# states only what it runs: the time left, the environment line, the prebuild, a pytest group under the time left.
# Usage, from the repository root: PLAN=<name> LIMIT=<seconds> source ci/gpu/plan-preamble.sh (the plan's files go to
# $OUT/<name>/; both variables may also be set beforehand; LIMIT defaults to 585)
T0=$(date +%s); LIMIT=${LIMIT:-585}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
PLAN_NAME=${PLAN:-plan}; PLAN_DIR=$OUT/$PLAN_NAME; mkdir -p "$PLAN_DIR"
# the device tool brings back only a few files from $OUT: the plan's folder comes back as one tarball (pytest's outputs
# stay straight under $OUT, so a cut at the tool's limit still keeps them)
trap 'rm -f "${PLAN_PREBUILD:-}"; tar -czf "$OUT/$PLAN_NAME.tar.gz" -C "$OUT" "$PLAN_NAME" && rm -rf "$PLAN_DIR"; echo "== plan $PLAN_NAME done in $(( $(date +%s) - T0 )) s"' EXIT
# the environment line every results page quotes: the tree, the card, its clocks, the device clock
{ echo "tree: main $(cat .hazards/tree.txt 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
  date -u; } | tee "$PLAN_DIR/env.txt"

# plan_prebuild_script [family]: write ci/gpu/final-gpu-tests.sh's parallel prebuild, as this tree has it (every
# family binary and the layered campaign's builds; or one family's builds), to $PLAN_PREBUILD (a file of its own, made
# by mktemp: plans or tests on one host do not share it), its output to
# $PLAN_DIR/build.txt; a final-gpu-tests.sh whose prebuild cannot be cut out, or filtered, is an error, not a plan
# that builds nothing (or everything)
plan_prebuild_script() {
  local script fams='^fams = \[f for f in all_families() if f.binary\]'
  PLAN_PREBUILD=${PLAN_PREBUILD:-$(mktemp /tmp/plan-prebuild.XXXXXX)}; script=$PLAN_PREBUILD
  sed -n '/^timeout 120 python3 - /,/^PY$/p' ci/gpu/final-gpu-tests.sh | sed 's#> $R/build.txt#> '"$PLAN_DIR"'/build.txt#' > "$script"
  grep -q "^PY$" "$script" && grep -q "$fams" "$script" || { echo "plan-preamble: no prebuild in final-gpu-tests.sh" >&2; return 1; }
  [ -z "$1" ] || sed -i "s#$fams#fams = [f for f in all_families() if f.binary and f.name == \"$1\"]#" "$script"
}
# plan_prebuild [family]: run it
plan_prebuild() {
  plan_prebuild_script "$@" || return 1
  bash "$PLAN_PREBUILD"; echo "prebuild rc $? ($(left) s left)"; tail -1 "$PLAN_DIR/build.txt" | cut -c1-200
}

# run_group NAME SECONDS FILES...: the GPU tests of FILES, started only if SECONDS are left, stopped by SIGINT before
# the limit (pytest still prints its summary), the output straight under $OUT (a cut keeps it)
run_group() {
  local name=$1 need=$2; shift 2
  if [ "$(left)" -lt "$need" ]; then echo "== group $name not started ($(left) s left, needs ~$need)"; return 0; fi
  timeout -s INT -k 10 $(( $(left) - 8 )) python3 -m pytest -m gpu -v -rs -p no:cacheprovider -p no:randomly \
    --durations=15 "$@" > "$OUT/gpu-$name.txt" 2>&1
  echo "== group $name rc=$? ($(left) s left)"; grep -E "passed|failed|error" "$OUT/gpu-$name.txt" | tail -1
  grep -E "^(FAILED|ERROR)" "$OUT/gpu-$name.txt" | head -12 | cut -c1-300
}
