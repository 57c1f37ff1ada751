#!/usr/bin/env bash
# Campaigns on every GPU (leases, check, soak, telemetry, report, JUnit) on two H200s.
# Run from anywhere:
#
#   bash ci/soak_two_gpus.sh check   # hazards check passes on the landed catalog; a canary
#                                    # made harmless on purpose fails it with "went blind"
#   bash ci/soak_two_gpus.sh soak    # a 5-minute soak holds both GPUs at once (lease log),
#                                    # writes one campaign, an HTML report, markdown, JUnit
#   bash ci/soak_two_gpus.sh bench   # per-GPU launch rate in a soak vs one `hazards stress`
#   bash ci/soak_two_gpus.sh all     # the three in a row (~15 min: more than one 10-min slot)
#
# Budgets can be shortened for a dry run: CHECK_BUDGET (3m), SOAK_BUDGET (5m), BENCH_SECONDS (60).
# Everything is written under .hazards/ci/soak_two_gpus (git-ignored, so it stays between
# stages on one machine: the results store, the lease log, reports, JUnit, logs, and
# verdicts.txt with one PASS/FAIL line per acceptance point). When $OUT is set, each stage
# also copies at most 8 small files there, flat (the device runner brings back 8 files).
# Exit status: 0 when every point of the stages run passed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
DIR="${HZ_CI_DIR:-$PWD/.hazards/ci/soak_two_gpus}"
mkdir -p "$DIR"
export HZ_STORE="$DIR/results.db"
export HZ_LEASE_DIR="$DIR/leases"
VERDICTS="$DIR/verdicts.txt"
FAILED=0
pass() { echo "PASS $*" | tee -a "$VERDICTS"; }
fail() { echo "FAIL $*" | tee -a "$VERDICTS"; FAILED=1; }
py() { python3 "$@"; }
collect() {  # copy the named files of $DIR to $OUT (flat), if $OUT is set
  [ -n "${OUT:-}" ] || return 0
  for f in "$@"; do [ -f "$DIR/$f" ] && cp "$DIR/$f" "$OUT/$(echo "$f" | tr '/' '_')"; done
}

n_gpus=$(py -c 'from hazards.engine.leases import lease_candidates; print(len(lease_candidates()))')
echo "$(date -Is) $(hostname): ${n_gpus} GPU(s) visible; output in $DIR" | tee -a "$VERDICTS"
nvidia-smi --query-gpu=index,uuid,name,driver_version --format=csv,noheader >> "$DIR/gpus.txt" 2>&1 || true
if [ "${n_gpus:-0}" -lt 2 ]; then fail "two GPUs needed, ${n_gpus:-0} visible"; exit 1; fi

stage_check() {
  # 1. The landed catalog: static checks, then every canary and clean variant on both GPUs.
  py -m hazards check --budget "${CHECK_BUDGET:-3m}" --junit "$DIR/check.xml" >"$DIR/check.txt" 2>"$DIR/check.err"
  local rc=$?
  tail -n 40 "$DIR/check.txt"
  if [ $rc -eq 0 ] && grep -q "^check passed$" "$DIR/check.txt"; then
    pass "hazards check on the landed catalog: exit 0 ($(grep -c '^ok ' "$DIR/check.txt") variants ok)"
  else
    fail "hazards check on the landed catalog: exit $rc (see check.txt / check.err)"
  fi
  # 2. The same command with pipeline/broken_war made harmless on purpose (its WAR barrier
  #    put back through its run-time parameters): must exit non-zero, saying "went blind".
  py - "$DIR/check_harmless.xml" >"$DIR/check_harmless.txt" 2>"$DIR/check_harmless.err" <<'EOF'
import sys
from hazards import checkrun
from hazards.cli import main

real = checkrun.default_items_for


def harmless(family, variants):
    items = real(family, variants)
    for item in items:
        if (item.target, item.variant) == ("pipeline", "broken_war"):
            item.params["war_barrier"] = True  # the fix: this canary can no longer fail
    return items


checkrun.default_items_for = harmless
sys.exit(main(["check", "--families", "pipeline", "--budget", "2m", "--junit", sys.argv[1]]))
EOF
  rc=$?
  tail -n 12 "$DIR/check_harmless.txt"
  if [ $rc -ne 0 ] && grep -q "pipeline/broken_war \[canary\] went blind" "$DIR/check_harmless.txt"; then
    pass "harmless canary fixture: exit $rc, pipeline/broken_war went blind"
  else
    fail "harmless canary fixture: exit $rc, no 'went blind' line (see check_harmless.txt)"
  fi
  # 3. The GPU tests of the campaign suite (the same fixture through run_check).
  py -m pytest -q -rs -p no:cacheprovider tests/campaign/test_check_gpu.py >"$DIR/pytest_gpu.txt" 2>&1 \
    && grep -q " passed" "$DIR/pytest_gpu.txt" && ! grep -q "skipped" "$DIR/pytest_gpu.txt" \
    && pass "tests/campaign/test_check_gpu.py" || fail "tests/campaign/test_check_gpu.py failed or skipped (see pytest_gpu.txt)"
  collect verdicts.txt check.txt check.err check.xml check_harmless.txt check_harmless.xml pytest_gpu.txt
}

stage_soak() {
  # A 5-minute soak over every family/variant on every free GPU, then its report.
  local t0; t0=$(py -c 'import time; print(time.time())')
  py -m hazards soak --budget "${SOAK_BUDGET:-5m}" --report "$DIR/soak.html" --name "acceptance two GPUs" \
    >"$DIR/soak.txt" 2>"$DIR/soak.err"
  local rc=$?
  tail -n 30 "$DIR/soak.txt"
  local cid; cid=$(py -c 'from hazards.engine.store import Store; print(Store(create=False).campaigns("soak")[-1].id)' 2>/dev/null)
  if [ -z "$cid" ]; then fail "soak: no campaign stored (exit $rc, see soak.err)"; return; fi
  [ $rc -le 1 ] && pass "soak campaign $cid ran (exit $rc: 1 = something flagged, see soak.txt)" \
                || fail "soak exit $rc (see soak.err)"
  # Both GPUs held at once: two acquires by the soak before its first release.
  py - "$t0" <<'EOF' && pass "lease log: the soak held both GPUs at once" || fail "lease log: GPUs not held together"
import sys
from hazards.engine.leases import read_lease_log
t0 = float(sys.argv[1])
ev = [e for e in read_lease_log() if e["holder"] == "hazards soak" and e["t"] >= t0]
acq = [e for e in ev if e["event"] == "acquire"]
rel = [e for e in ev if e["event"] == "release"]
held = sorted({e["gpu"] for e in acq})
print("soak leases:", [(e["event"], e["gpu"], e.get("uuid"), e["pid"], round(e["t"] - t0, 1)) for e in ev])
sys.exit(0 if len(held) >= 2 and rel and max(e["t"] for e in acq) < min(e["t"] for e in rel) else 1)
EOF
  py - "$cid" <<'EOF' && pass "soak runs spread over both GPUs" || fail "soak runs not on two GPUs"
import sys
from hazards.engine.store import Store
runs = Store(create=False).runs(int(sys.argv[1]))
per = {}
for sr in runs:
    per[sr.result.gpu_uuid] = per.get(sr.result.gpu_uuid, 0) + 1
print("runs per GPU:", per)
sys.exit(0 if len([u for u in per if u]) >= 2 else 1)
EOF
  py -m hazards report "$cid" -o "$DIR/report.html" --markdown --junit "$DIR/soak.xml" >"$DIR/report.md" 2>"$DIR/report.err" \
    && [ -s "$DIR/report.html" ] && grep -q "data:image/png;base64," "$DIR/report.html" \
    && pass "report: $DIR/report.html with figures, report.md, soak.xml" || fail "hazards report (see report.err)"
  if py -c 'import xmlschema' 2>/dev/null; then
    py - "$DIR" <<'EOF' && pass "JUnit files validate against tests/data/junit.xsd" || fail "JUnit schema errors"
import sys
from pathlib import Path
sys.path.insert(0, "tests/campaign")
from junit_schema import validate
bad = 0
for f in ("check.xml", "check_harmless.xml", "soak.xml"):
    p = Path(sys.argv[1]) / f
    if p.is_file():
        errors = validate(p)
        print(f, "valid" if not errors else errors)
        bad += bool(errors)
sys.exit(bad)
EOF
  fi
  cp "$HZ_LEASE_DIR/log.jsonl" "$DIR/lease-log.jsonl" 2>/dev/null
  collect verdicts.txt soak.txt soak.err report.html report.md soak.xml lease-log.jsonl gpus.txt
}

stage_bench() {
  py bench/soak_vs_stress.py --seconds "${BENCH_SECONDS:-60}" --out "$DIR/bench" --json "$DIR/bench/soak_vs_stress.json" \
    >"$DIR/bench.txt" 2>&1
  local rc=$?
  cat "$DIR/bench.txt"
  [ $rc -eq 0 ] && pass "throughput: $(tail -n 1 "$DIR/bench.txt")" || fail "bench/soak_vs_stress.py exit $rc"
  collect verdicts.txt bench.txt bench/soak_vs_stress.json bench/soak.html
}

case "${1:-all}" in
  check) stage_check ;;
  soak) stage_soak ;;
  bench) stage_bench ;;
  all) stage_check; stage_soak; stage_bench ;;
  *) echo "usage: $0 [check|soak|bench|all]" >&2; exit 2 ;;
esac
exit $FAILED
