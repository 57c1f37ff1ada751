#!/usr/bin/env bash
# Lead's third device call (carried): A/A gates of the perf gate on merge8's production (step (d)):
# noop (a separately compiled binary) vs production and production vs itself, ci/gpu/perf-gate-aa.sh.
export PYTHONPATH=/tmp/m8 HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
rm -rf /tmp/m8 && cp -a . /tmp/m8 && cd /tmp/m8 && git apply --whitespace=nowarn .hazards/merge8.patch && echo "merge8 patch applied" || exit 3
OUT=$OUT BUDGET=140 timeout 160 bash ci/gpu/perf-gate-aa.sh; echo "== aa rc=$?"; date -u
python3 bench/perf_gate_aa.py --summarise $OUT/perf-gate-aa/gates.jsonl 2>&1 | tail -30
