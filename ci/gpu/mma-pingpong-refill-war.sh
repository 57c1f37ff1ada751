#!/usr/bin/env bash
# GPU round for family mma_pingpong: does the operand-bank WAR show at run time
# when the refill is the warpgroup's own st.shared (refill=threads) instead of a bulk copy,
# and does the bulk WAR show now that the group left in flight holds real wgmmas (before,
# ptxas committed an empty dummy after the run-time repetition loop)?
# `hazards stress mma_pingpong` on broken_war_threads (one bank, stores right after the
# commit) and broken_war and, at the same points, reference, fixed and fixed_threads (must
# stay bit-exact),
# then the thread WAR's rate over mma_reps/shape/grid, then racecheck on a tiny grid.
# Writes $OUT/mma-pingpong-refill-war.tar.gz. Budget: 90 s of device time; every step checks what is left.
set -u
cd "$(dirname "$0")/../.."
. ci/gpu/round.sh mma-pingpong-refill-war 84  # PYTHONPATH, $OUT, $R, console.log, left/step/finish

machine_step

step "build through the hazards build cache (nvcc -split-compile=0)"
build_family mma_pingpong 60

summary() {  # the JSON object of one hazards stress run, one line per variant
  python3 ci/gpu/stress_summary.py "$1" "  " 20
}
run_stress() {  # name, min seconds needed, then hazards stress arguments
  local name=$1 need=$2; shift 2
  step "hazards stress mma_pingpong $*"
  [ "$(left)" -gt "$need" ] || { echo "skipped: $(left) s left"; return; }
  timeout $(( $(left) - 3 )) python3 -m hazards stress mma_pingpong "$@" --json --store "$OUT/stress.db" \
      > "$R/$name.json" 2> "$R/$name.err"
  echo "exit $?"
  summary "$R/$name.json"
}
ALL5=(--variant broken_war_threads --variant broken_war --variant fixed_threads --variant fixed --variant reference)

# The acceptance points: the new canary and the three clean schedules at the same points.
run_stress defaults 10 "${ALL5[@]}" --launches 5000 --requests 1
run_stress T15 8 "${ALL5[@]}" --launches 3000 --requests 1 --set ktiles=15
run_stress s256x64 8 "${ALL5[@]}" --launches 3000 --requests 1 --set shape=256x64
run_stress s64x16-T7 8 "${ALL5[@]}" --launches 3000 --requests 1 --set shape=64x16 --set ktiles=7
# How the thread WAR's rate depends on the read window (mma_reps) and the grid.
for reps in 1 4; do
  run_stress war-reps$reps 6 --variant broken_war_threads --variant broken_war --launches 2000 --requests 1 --set mma_reps=$reps
done
run_stress war-blocks8 6 --variant broken_war_threads --launches 2000 --requests 1 --set blocks=8
run_stress war-256x64-reps1 6 --variant broken_war_threads --variant broken_war --launches 2000 --requests 1 --set shape=256x64 --set mma_reps=1
# racecheck: generic-proxy stores against async-proxy wgmma reads (can it see them?).
run_stress san-racecheck 15 --variant broken_war_threads --variant fixed_threads --sanitizer racecheck \
    --set blocks=2 --set ktiles=4 --launches 1 --requests 1
for f in "$R"/san-racecheck.json; do [ -s "$f" ] && grep -o '"error_kind": *"[a-z_]*"' "$f" | sort | uniq -c; done
finish
