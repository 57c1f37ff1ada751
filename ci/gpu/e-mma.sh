#!/usr/bin/env bash
# GPU round 1 for family mma_pingpong (helper e-mma): build the binary, run every variant at
# a few points through one warm server, print enough to fix a wrong layout from the output
# alone (probes, host-check messages, first bad element), measure launch rates, and try
# compute-sanitizer on a tiny grid. Writes $OUT/e-mma.tar.gz. Budget: 120 s of script time.
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD
OUT=${OUT:-/tmp/e-mma-out}
R=$OUT/e-mma
mkdir -p "$R"
T0=$(date +%s)
exec > >(tee "$R/console.log") 2>&1

echo "== machine"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1
git log -1 --format='commit %H %s' 2>/dev/null || true

echo "== build (nvcc -split-compile=0)"
BIN=$R/mma_pingpong
( time timeout 90 nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo -split-compile=0 \
    standalone/mma_pingpong/mma_pingpong.cu -o "$BIN" ) > "$R/build.log" 2>&1
grep -v "C7514" "$R/build.log" | tail -4
echo "C7514 lines (early-read kernels, expected 12): $(grep -c C7514 "$R/build.log")"
[ -x "$BIN" ] || { echo "BUILD FAILED"; tar -czf "$OUT/e-mma.tar.gz" -C "$OUT" e-mma; exit 1; }

echo "== runs through one server ($(( $(date +%s) - T0 )) s so far)"
timeout 60 python3 - "$BIN" "$R/runs.jsonl" <<'EOF'
import json, select, subprocess, sys, time
binary, out_path = sys.argv[1], sys.argv[2]
S = ["64x16", "128x64", "256x64"]
reqs = []
def add(label, launches, **params):
    reqs.append((label, launches, params))
for sh in S:   # exact probes: the reply names what the MMA read when the layout is wrong
    add(f"probe_rows {sh}", 2, variant="reference", shape=sh, ktiles=4, blocks=2, inputs="probe_rows")
    add(f"probe_cols {sh}", 2, variant="reference", shape=sh, ktiles=4, blocks=2, inputs="probe_cols")
for sh in S:
    add(f"reference {sh} T16", 50, variant="reference", shape=sh, ktiles=16)
    for t in (15, 16):
        add(f"fixed {sh} T{t}", 2000, variant="fixed", shape=sh, ktiles=t)
    add(f"broken_war {sh} T16", 2000, variant="broken_war", shape=sh, ktiles=16)
for t in (1, 2, 3):
    add(f"reference 128x64 T{t}", 20, variant="reference", ktiles=t)
    add(f"fixed 128x64 T{t}", 200, variant="fixed", ktiles=t)
add("fixed S3 W2 T17", 1000, variant="fixed", stages=3, wait_depth=2, ktiles=17)
add("fixed S4 W3 T18", 1000, variant="fixed", stages=4, wait_depth=3, ktiles=18)
add("fixed S3 W1 T17 (deeper wait)", 500, variant="fixed", stages=3, wait_depth=1, ktiles=17)
add("broken_war jitter4", 2000, variant="broken_war", jitter=4)
add("S2 W2 T16 (one too shallow)", 2000, variant="fixed", wait_depth=2, ktiles=16)
add("S3 W3 T16 (one too shallow)", 2000, variant="fixed", stages=3, wait_depth=3, ktiles=16)
add("broken_war 256x64 T64", 1000, variant="broken_war", shape="256x64", ktiles=64)
for t in (16, 15):
    add(f"broken_tail T{t}", 100, variant="broken_tail", ktiles=t)
add("broken_acc_read T16", 2000, variant="broken_acc_read")
add("broken_acc_read S1 W1 T16", 1000, variant="broken_acc_read", stages=1)

def start():
    p = subprocess.Popen([binary, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    hello = p.stdout.readline()
    return p, hello
proc, hello = start()
print("hello:", hello.strip())
with open(out_path, "w") as fh:
    for i, (label, n, params) in enumerate(reqs):
        if proc.poll() is not None:
            proc, hello = start()
        t0 = time.time()
        proc.stdin.write(json.dumps({"id": i, "launches": n, "params": {**params, "seed": 1000 + i}}) + "\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], 12.0)
        line = proc.stdout.readline() if ready else ""
        if not ready:  # a hang: kill the server, the next request gets a fresh one
            proc.kill(); proc.wait()
            line = json.dumps({"status": "hang", "message": "no reply in 12 s (server killed)"})
        wall = time.time() - t0
        try:
            rep = json.loads(line)
        except Exception:
            rep = {"status": "no_reply", "raw": line}
        fh.write(json.dumps({"label": label, "params": params, "launches": n, "wall_s": wall, "reply": rep}) + "\n")
        m = rep.get("metrics", {})
        keys = ("host_err", "host_tol", "diag_reproduced", "diag_bad_elements", "diag_block", "diag_row",
                "diag_col", "diag_got", "diag_want", "effective_wait_depth", "tail_bank")
        extra = " ".join(f"{k}={m[k]}" for k in keys if k in m)
        if rep.get("status") == "ok":
            print(f"{label:34s} ok mism {rep['mismatched']}/{rep['launches']} bad_el {rep['bad_elements']} "
                  f"maxerr {rep['max_rel_err']:.3g} kernel_ms {rep['kernel_ms']:.1f} wall {wall:.2f}s {extra}")
        else:
            print(f"{label:34s} {rep.get('status')} {rep.get('message', rep.get('raw', ''))}")
proc.stdin.write('{"cmd":"quit"}\n'); proc.stdin.flush(); proc.wait(timeout=10)
EOF

echo "== raw launch rate ($(( $(date +%s) - T0 )) s so far)"
for v in reference fixed; do
  timeout 15 "$BIN" --raw-loop 2000 "{\"variant\":\"$v\"}" | tee -a "$R/raw.log"
done

echo "== compute-sanitizer, tiny grid ($(( $(date +%s) - T0 )) s so far)"
SAN_REQ='{"launches":1,"params":{"variant":"VARIANT","blocks":2,"ktiles":4,"seed":7}}'
for tool_var in racecheck:broken_war racecheck:fixed synccheck:broken_war; do
  tool=${tool_var%%:*}; var=${tool_var##*:}
  left=$(( 115 - ($(date +%s) - T0) ))
  [ "$left" -lt 12 ] && { echo "skip $tool $var: budget"; continue; }
  lim=$(( left < 25 ? left - 5 : 25 ))
  s0=$(date +%s)
  timeout "$lim" compute-sanitizer --tool "$tool" --print-limit 5 "$BIN" --once "${SAN_REQ/VARIANT/$var}" \
      > "$R/san-$tool-$var.log" 2>&1
  rc=$?
  echo "$tool $var: rc=$rc in $(( $(date +%s) - s0 )) s; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|HZ_RESULT' "$R/san-$tool-$var.log" | tr '\n' ' ' | cut -c1-300)"
done

echo "== done in $(( $(date +%s) - T0 )) s"
tar -czf "$OUT/e-mma.tar.gz" -C "$OUT" e-mma
