#!/usr/bin/env bash
# GPU round 2 for family mma_pingpong: `hazards stress mma_pingpong`
# acceptance (10,000 launches per point for reference/fixed at several trip-count parities
# and shapes; every canary), broken-variant rates over the timing knobs (shape, mma_reps,
# banks/wait depth, jitter, grid), the host-tolerance calibration (floor E, distance D), the
# static-vs-runtime agreement over 40 strategy points (ci/gpu/mma-pingpong-points.json), the
# compute-sanitizer table, the family's GPU tests. Writes $OUT/mma-pingpong-acceptance.tar.gz.
# Budget: 170 s of script time; every step checks what is left.
set -u
cd "$(dirname "$0")/../.."
. ci/gpu/round.sh mma-pingpong-acceptance 165  # PYTHONPATH, $OUT, $R, console.log, left/step/finish

machine_step

step "build through the hazards build cache (nvcc, serial)"
build_family mma_pingpong 90

step "acceptance: hazards stress mma_pingpong (defaults, 10,000 launches per variant)"
timeout $(( $(left) - 5 )) python3 -m hazards stress mma_pingpong --launches 10000 --requests 1 --json \
    --store "$OUT/stress.db" > "$R/accept-defaults.json" 2> "$R/accept-defaults.err"
echo "exit $?"
python3 ci/gpu/stress_summary.py "$R/accept-defaults.json"

step "rates, calibration and the 40 strategy points through one server"
timeout $(( $(left) - 60 > 20 ? $(left) - 60 : 20 )) python3 - "$BIN" "$R/sweep.jsonl" ci/gpu/mma-pingpong-points.json <<'EOF'
import json, select, subprocess, sys, time
binary, out_path, points_path = sys.argv[1:4]
reqs = []
def add(group, label, launches, **params):
    reqs.append((group, label, launches, params))
for sh in ("64x16", "128x64", "256x64"):
    for reps in (1, 2, 4, 8, 16):
        add("war_reps", f"broken_war {sh} reps{reps}", 2000, variant="broken_war", shape=sh, mma_reps=reps)
for reps in (8, 16):
    add("war_shallow", f"S2 W2 reps{reps}", 2000, variant="fixed", wait_depth=2, mma_reps=reps)
    add("war_shallow", f"S3 W3 reps{reps}", 2000, variant="fixed", stages=3, wait_depth=3, mma_reps=reps)
    add("war_shallow", f"S2 W2 256x64 reps{reps}", 2000, variant="fixed", shape="256x64", wait_depth=2, mma_reps=reps)
for j in (0, 4, 16, 64):
    add("war_jitter", f"broken_war jitter{j}", 2000, variant="broken_war", jitter=j)
for b in (1, 8, 66, 264):
    add("war_blocks", f"broken_war blocks{b}", 2000, variant="broken_war", blocks=b)
for t in (2, 3, 15, 16, 63, 64):
    add("tail", f"broken_tail T{t}", 200, variant="broken_tail", ktiles=t)
for t in (16, 17, 18):  # three banks: the single tail is right only when (T-1) % 3 == 0
    add("tail", f"broken_tail S3 T{t}", 200, variant="broken_tail", stages=3, wait_depth=2, ktiles=t)
add("acc", "broken_acc_read", 5000, variant="broken_acc_read")
add("acc", "broken_acc_read S1 reps16", 5000, variant="broken_acc_read", stages=1, mma_reps=16)
for sh in ("64x16", "128x64", "256x64"):   # calibration: floor E of the reference vs the host GEMM
    for t, reps in ((1, 1), (16, 8), (128, 16)):
        add("calib", f"reference {sh} T{t} reps{reps}", 20, variant="reference", shape=sh, ktiles=t, mma_reps=reps)
add("calib_d", "broken_tail T128 reps1 (cheapest D)", 20, variant="broken_tail", ktiles=128, mma_reps=1)
add("calib_d", "broken_tail 256x64 T128 reps1", 20, variant="broken_tail", shape="256x64", ktiles=128, mma_reps=1)
for k, p in enumerate(json.load(open(points_path))):
    add("points", f"point {k}", 1000, **p["point"])

def start():
    p = subprocess.Popen([binary, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    p.stdout.readline()
    return p
proc = start()
with open(out_path, "w") as fh:
    for i, (group, label, n, params) in enumerate(reqs):
        if proc.poll() is not None:
            proc = start()
        t0 = time.time()
        try:
            proc.stdin.write(json.dumps({"id": i, "launches": n, "params": {**params, "seed": 5000 + i}}) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:  # the server exited after a fault: answer this one as such
            proc.wait()
            fh.write(json.dumps({"group": group, "label": label, "params": params, "launches": n,
                                 "wall_s": 0, "reply": {"status": "server_gone"}}) + "\n")
            proc = start()
            continue
        ready, _, _ = select.select([proc.stdout], [], [], 30.0)
        line = proc.stdout.readline() if ready else ""
        if not ready:
            proc.kill(); proc.wait()
            line = json.dumps({"status": "hang", "message": "no reply in 30 s (server killed)"})
        wall = time.time() - t0
        try:
            rep = json.loads(line)
        except Exception:
            rep = {"status": "no_reply", "raw": line}
        fh.write(json.dumps({"group": group, "label": label, "params": params, "launches": n,
                             "wall_s": wall, "reply": rep}) + "\n"); fh.flush()
        if group == "points":
            continue
        m = rep.get("metrics", {})
        if rep.get("status") == "ok":
            print(f"{label:36s} mism {rep['mismatched']}/{rep['launches']} maxerr {rep['max_rel_err']:.3g} "
                  f"host_err {m.get('host_err', 0):.3g} tol {m.get('host_tol', 0):.3g} "
                  f"ms/launch {rep['kernel_ms'] / max(1, rep['launches']):.4f}")
        else:
            print(f"{label:36s} {rep.get('status')} {rep.get('message', '')[:200]}")
print("points run:", sum(1 for r in reqs if r[0] == "points"))
proc.stdin.write('{"cmd":"quit"}\n'); proc.stdin.flush(); proc.wait(timeout=10)
EOF

run_accept() {  # name, then hazards stress arguments
  local name=$1; shift
  [ "$(left)" -lt 25 ] && { echo "skip $name: budget"; return; }
  timeout $(( $(left) - 15 )) python3 -m hazards stress mma_pingpong "$@" --json --store "$OUT/stress.db" \
      > "$R/accept-$name.json" 2> "$R/accept-$name.err"
  local rc=$?
  python3 - "$R/accept-$name.json" "$name" "$rc" <<'EOF'
import json, sys
path, name, rc = sys.argv[1:]
try:
    d = json.load(open(path))
except Exception as e:
    print(f"{name}: exit {rc}, no JSON ({e})"); sys.exit(0)
for v in d["variants"]:
    print(f"{name:22s} {v['variant']:16s} {v['verdict']:10s} {v['failed_launches']}/{v['launches']} "
          f"rate {v['launch_rate']} ci95 {[round(x, 6) for x in v['launch_rate_ci95']]} exit {rc}")
EOF
}

step "acceptance at other trip-count parities and shapes (reference, fixed: 10,000 launches each)"
run_accept T15 --variant reference --variant fixed --set ktiles=15 --launches 10000 --requests 1
run_accept T17 --variant reference --variant fixed --set ktiles=17 --launches 10000 --requests 1
run_accept 64x16-T7 --variant reference --variant fixed --set shape=64x16 --set ktiles=7 --launches 10000 --requests 1
run_accept 256x64-r16-T16 --variant reference --variant fixed --set shape=256x64 --set mma_reps=16 --launches 10000 --requests 1
run_accept 256x64-r16-T15 --variant reference --variant fixed --set shape=256x64 --set mma_reps=16 --set ktiles=15 --launches 10000 --requests 1
run_accept war-256x64 --variant broken_war --set shape=256x64 --launches 10000 --requests 1

step "compute-sanitizer (tiny grid: 2 blocks, 4 tiles, 1 launch per variant)"
for tool in racecheck synccheck; do
  run_accept "san-$tool" --sanitizer "$tool" --set blocks=2 --set ktiles=4 --launches 1 --requests 1
done
for tool_var in racecheck:broken_war racecheck:fixed synccheck:broken_war; do  # the raw reports, kept
  tool=${tool_var%%:*}; var=${tool_var##*:}
  [ "$(left)" -lt 20 ] && break
  timeout 15 compute-sanitizer --tool "$tool" --print-limit 5 "$BIN" --once \
      "{\"launches\":1,\"params\":{\"variant\":\"$var\",\"blocks\":2,\"ktiles\":4,\"seed\":7}}" \
      > "$R/san-$tool-$var.log" 2>&1
  echo "$tool $var: rc=$? $(grep -E 'SUMMARY' "$R/san-$tool-$var.log" | tr '\n' ' ') $(grep -o '"mismatched":[0-9]*' "$R/san-$tool-$var.log")"
done

step "raw launch rates"
for v in reference fixed broken_war; do
  [ "$(left)" -lt 8 ] && break
  timeout 10 "$BIN" --raw-loop 5000 "{\"variant\":\"$v\"}" | tee -a "$R/raw.log"
done

step "GPU tests of the family"
if [ "$(left)" -gt 25 ]; then
  timeout $(( $(left) - 5 )) python3 -m pytest -q -p hazards.pytest_plugin tests/families/test_mma_pingpong_gpu.py \
      > "$R/pytest-gpu.txt" 2>&1
  echo "pytest exit $?"; tail -5 "$R/pytest-gpu.txt"
else
  echo "skipped: budget"
fi
finish
