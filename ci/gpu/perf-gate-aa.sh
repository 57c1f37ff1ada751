#!/usr/bin/env bash
# A/A gates of `hazards gate perf` on the layered megakernel, one H200, <= 250 s of script
# time (the gate's family-wise error: it must call a candidate that is the baseline again anything
# but no-change in at most 1 of 20 gates). Builds the profiled production and noop binaries,
# times one gate through the CLI (the issue's command), then runs as many gates as the
# budget leaves (bench/perf_gate_aa.py: noop vs production and production vs itself in turn,
# 132 workers, 10 pairs; every pair's raw metrics kept) and prints how many completed and
# how many were not no-change, under the new rule and the rule before it on the same pairs.
# Output: $OUT/perf-gate-aa/ (console.log, build.txt, cli_gate.json, cli_gate.err,
# gates.jsonl) and the same folder as $OUT/perf-gate-aa.tar.gz.
cd "$(dirname "$0")/../.." && . ci/gpu/round.sh perf-gate-aa "${BUDGET:-250}"
export HZ_BUILD_DIR=${HZ_BUILD_DIR:-/tmp/hz-build} PYTHONUNBUFFERED=1
machine_step

step "build the profiled binaries: production and noop, in parallel"
pids=()
for defines in "{'HZ_PROFILER': 1}" "{'HZ_PROFILER': 1, 'MKL_NOOP_CANDIDATE': 1}"; do
  timeout 150 python3 -c "
from hazards.families import get_family
from hazards.stress_family import family_binary
print(family_binary(get_family('megakernel_layers'), defines=$defines))" >> "$R/build.txt" 2>&1 &
  pids+=($!)
done
wait "${pids[@]}"  # not a bare wait: that would also wait for round.sh's tee
cat "$R/build.txt"

step "one gate through the CLI, timed (noop vs production, 132 workers, 10 pairs)"
t=$(date +%s)
timeout 120 python3 -m hazards gate perf --baseline megakernel_layers:production \
  --candidate megakernel_layers:noop --workers 132 --repeats 10 --json > "$R/cli_gate.json" 2> "$R/cli_gate.err"
rc=$?
verdict=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['verdict'])" "$R/cli_gate.json" 2>/dev/null)
echo "exit $rc in $(( $(date +%s) - t )) s: ${verdict:-no verdict ($(tail -1 "$R/cli_gate.err"))}"

step "A/A gates until the budget (noop vs production, production vs production, in turn)"
timeout $(( $(left) - 5 )) python3 bench/perf_gate_aa.py --budget-s $(( $(left) - 15 )) --out "$R"
finish
