# round.sh -- the common frame of a GPU-round script, sourced from the repository root:
#     cd "$(dirname "$0")/../.." && . ci/gpu/round.sh NAME BUDGET_S
# Sets PYTHONPATH, OUT (default /tmp/NAME-out) and R=$OUT/NAME (created), copies the console
# into $R/console.log, and defines left (seconds of BUDGET_S left), step TITLE, finish (tar
# $R into $OUT/NAME.tar.gz and exit 0, or its argument: what was measured still comes
# back), machine_step (the GPU, nvcc, commit and date the round ran on), build_family FAMILY
# TIMEOUT_S (the family's binary through the hazards build cache in $BIN, or finish),
# build_cuda_families [NAME,...] (every CUDA family's binary, or those named, into the build
# cache, 8 at once; a failure is said, not fatal; a name that matches nothing ends the round,
# exit 2) and sub NAME NEED_S CMD... (a step that is another script: CMD with OUT=$R/NAME, its
# console in $R/NAME/console.txt, if NEED_S seconds are left, for at most what is left).
ROUND=$1
BUDGET=$2
export PYTHONPATH=$PWD
OUT=${OUT:-/tmp/$ROUND-out}
R=$OUT/$ROUND
mkdir -p "$R"
T0=$(date +%s)
exec > >(tee "$R/console.log") 2>&1
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
step() { echo; echo "== $1 ($(( $(date +%s) - T0 )) s so far, $(left) s left)"; }
finish() { step "done"; sleep 1; tar -czf "$OUT/$ROUND.tar.gz" -C "$OUT" "$ROUND"; exit "${1:-0}"; }

machine_step() {
  step "machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  nvcc --version | tail -1
  git log -1 --format='commit %H %s' 2>/dev/null || echo "commit: $(cat .git/HEAD 2>/dev/null)"
  date -u +"date %Y-%m-%dT%H:%M:%SZ"
}

build_family() {
  BIN=$(timeout "$2" python3 -c "
from hazards.families import get_family
from hazards.stress_family import family_binary
print(family_binary(get_family('$1')).resolve())" 2> "$R/build.err" | tail -1)
  echo "binary: $BIN"
  [ -x "$BIN" ] || { echo "BUILD FAILED"; tail -20 "$R/build.err"; finish; }
}

build_cuda_families() {  # [NAME,...]: only those families (FAMILY/VARIANT counts as FAMILY;
  # ragged_decode, the megakernel's check server, builds its own library: nothing here). A name
  # that matches nothing ends the round (exit 2): it would build, and then run, nothing of it.
  step "build the CUDA family binaries ${1:-(all)}"
  local rc=0
  timeout 120 python3 - "${1:-}" <<'PY' || rc=$?
import concurrent.futures as cf
import sys
from hazards.engine.errors import EXIT_BAD_INPUT, UserError
from hazards.families import cuda_binary_families, named_items
from hazards.stress_family import family_binary
fams = cuda_binary_families()
try:
    keep = {fam for fam, _ in named_items(sys.argv[1], {f.name: [v.name for v in f.variants] for f in fams},
                                          also=("ragged_decode",))}
except UserError as e:
    print(f"build_cuda_families: {e}", file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)
fams = [f for f in fams if not keep or f.name in keep]
with cf.ThreadPoolExecutor(8) as pool:
    for f, b in zip(fams, pool.map(family_binary, fams)):
        print(f.name, b)
PY
  [ "$rc" = 2 ] && finish 2
  [ "$rc" = 0 ] || echo "BUILD FAILED (continuing with what built)"
}

# sub NAME NEED_S CMD...: run CMD with OUT=$R/NAME if NEED_S seconds are left, at most what is left
sub() {
  local name=$1 need=$2
  shift 2
  if [ "$(left)" -lt "$need" ]; then echo "$name: not run ($(left) s left, needs $need)"; return; fi
  step "$name"
  mkdir -p "$R/$name"
  OUT=$R/$name timeout -k 5 "$(left)" "$@" > "$R/$name/console.txt" 2>&1
  echo "$name: exit $?"
  tail -12 "$R/$name/console.txt" | cut -c1-220
}
