#!/usr/bin/env bash
# GPU round of hazards explore and evidence allocation, one H200,
# ~166 s of script time:
#  (a) the targeting measurement: bench/explore_targeting.py, region pipeline-war (the WAR
#      refill race of a 2-4 stage ring without its barrier, rate growing with jitter), 20 seeds,
#      with and without hypothesis.target, examples to the first failing point;
#  (b) the allocation benchmark: bench/soak_allocation.py, the same soak budget with
#      --allocation evidence and uniform side by side (scaled down from the issue's 10 minutes
#      to ~30 s each: the whole team has 30 minutes of device time);
#  (c) one short `hazards explore` per runtime family (and the ragged-decode megakernel
#      target), with its agreement table and findings.
# The family binaries build in the background from the start (in parallel); each step waits
# for the ones it needs and is capped by what is left. Everything lands in $OUT/explore-targeting.tar.gz.
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/explore-targeting-out}
R=$OUT/explore-targeting
W=$(mktemp -d)
mkdir -p "$R"
T0=$(date +%s)
BUDGET=166
exec > >(tee "$R/console.log") 2>&1
elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( BUDGET - $(elapsed) )); }
step() { echo; echo "== $1 ($(elapsed) s so far, $(left) s left)"; }
finish() { trap - EXIT TERM INT; step "done"; timeout 20 tar -czf "$OUT/explore-targeting.tar.gz" -C "$OUT" explore-targeting; exit 0; }
trap finish EXIT TERM INT  # killed from outside too: what was measured still comes back
FAMILIES="pipeline ordering barrier_layout deadlock mma_pingpong megakernel_layers"
EXPLORED="$FAMILIES ragged_decode"

step "machine"
timeout 20 nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,clocks.max.sm --format=csv,noheader
timeout 20 nvcc --version | tail -1
timeout 30 python3 -c "import hypothesis, sys; print('hypothesis', hypothesis.__version__, 'python', sys.version.split()[0])"
timeout 10 git log -1 --format='commit %H %s' 2>/dev/null || echo "commit: (no git metadata in this copy)"
date -u +"date %Y-%m-%dT%H:%M:%SZ"

step "build every runtime family in the background (the hazards build cache)"
for f in $FAMILIES; do
  ( timeout 150 python3 -c "
from hazards.families import get_family
from hazards.stress_family import family_binary
print(family_binary(get_family('$f')))" > "$R/build-$f.txt" 2>&1
    echo "$f rc=$? at $(elapsed) s" >> "$R/builds.txt" ) &
done
( timeout 150 python3 -c "
from hazards.ragged_decode.build import build_library
print(build_library())" > "$R/build-ragged_decode.txt" 2>&1
  echo "ragged_decode rc=$? at $(elapsed) s" >> "$R/builds.txt" ) &
built() {  # wait (at most $2 s) for family $1's build; true when its binary is there
  local deadline=$(( $(elapsed) + $2 ))
  while ! grep -q "^$1 " "$R/builds.txt" 2>/dev/null; do
    [ "$(elapsed)" -ge "$deadline" ] && return 1
    sleep 1
  done
  grep -q "^$1 rc=0" "$R/builds.txt"
}

step "(a) targeting: examples to the first failing point, with and without hypothesis.target"
if built pipeline 60; then
  CAP=$(( $(left) - 115 )); [ "$CAP" -gt 45 ] && CAP=45; [ "$CAP" -lt 20 ] && CAP=20
  timeout $(( CAP + 15 )) python3 bench/explore_targeting.py --region pipeline-war --seeds 20 --examples 100 \
    --launches 20 --stop-rate 0.5 --budget "$CAP" --json "$R/targeting.json" > "$R/targeting.txt" 2>&1
  echo "exit $?"; tail -3 "$R/targeting.txt"
else
  echo "pipeline did not build:"; tail -5 "$R/build-pipeline.txt"
fi

step "(b) allocation: the same soak budget, evidence and uniform side by side"
if built ordering 30 && built barrier_layout 30; then
  PER=$(( ($(left) - 50) / 2 - 6 )); [ "$PER" -gt 30 ] && PER=30; [ "$PER" -lt 10 ] && PER=10
  echo "budget per allocation: $PER s"
  timeout $(( 2 * PER + 40 )) python3 bench/soak_allocation.py --families pipeline,ordering,barrier_layout \
    --one-launch pipeline:fixed,barrier_layout:fixed --budget "$PER" --out "$W/alloc" \
    --json "$R/allocation.json" > "$R/allocation.txt" 2>&1
  echo "exit $?"; grep -E "^(evidence|uniform|weakest|canary)" "$R/allocation.txt"
  cp "$W"/alloc/*.stderr "$R/" 2>/dev/null
else
  echo "ordering/barrier_layout did not build"; cat "$R/builds.txt"
fi

step "(c) hazards explore, one short run per runtime family"
n=7
for f in $EXPLORED; do
  PER=$(( ($(left) - 3) / n - 3 )); n=$(( n - 1 )); [ "$PER" -gt 7 ] && PER=7
  if [ "$PER" -lt 2 ]; then echo "$f: no time left"; continue; fi
  if ! built "$f" 5; then echo "$f: not built"; tail -3 "$R/build-$f.txt"; continue; fi
  extra="" grace=12
  case $f in deadlock) extra="--timeout 1";; megakernel_layers) extra="--timeout 3";;
    ragged_decode) extra="--timeout 3" grace=20;; esac  # its server imports torch before its handshake
  timeout $(( PER + grace )) python3 -m hazards explore "$f" --budget "${PER}s" --point-runs 3 --json \
    --store "$W/explore.db" $extra > "$R/explore-$f.json" 2> "$R/explore-$f.err"
  echo "$f exit $?"
  timeout 20 python3 - "$R/explore-$f.json" <<'EOF'
import json, sys
try:
    d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
except Exception as e:
    print("  no JSON:", e); sys.exit(0)
print(f"  {d['examples']} points, {d['runs']} runs, {d['launches']} launches in {d['elapsed_s']:.1f} s; "
      f"first failing point {d['first_failure_example']}; counts {d['counts']}; stop: {d['stop_reason']}")
for row, cells in d["agreement"].items():
    if cells:
        print(f"  {row:24s} {cells}")
for f in d["findings"]:
    print(f"  FINDING {f['kind']} confirmed={f['confirmed']}: {f['params_json']}")
    if "remeasured" in f:
        r = f["remeasured"]
        print(f"    re-measured {r['failures']}/{r['judged']} runs, {r['failed_launches']}/{r['launches']} launches")
if d.get("error"):
    print("  error:", d["error"])
EOF
done
cp "$R/builds.txt" "$R/builds-final.txt" 2>/dev/null
finish
