"""A stand-in for a family binary's --serve (docs/protocol.md): canaries fail, others don't.

Variants whose name starts with "broken" or "mp_plain"/"pc_no" report every launch
mismatched; litmus-style metrics (instances, weak) are reported for ordering names.
Started with `--spin-timeouts`, every launch fails through bounded spins that gave up (the
harness's own anomaly, no weak outcome). Started with `--resolved JSON`, every reply reports
that point as `metrics.resolved` (what a real binary says it ran).
"""
import json
import os
import sys


def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


send({"hz_protocol": 1, "server": "fake", "pid": os.getpid(), "gpu_uuid": "GPU-fake"})
for raw in sys.stdin:
    req = json.loads(raw)
    if req.get("cmd") == "quit":
        break
    params, n = req.get("params", {}), int(req.get("launches", 1))
    v = params.get("variant", "")
    bad = v.startswith(("broken", "mp_plain", "pc_no"))
    metrics = {"variant": v, "instances": 1000 * n, "weak": 3 * n if bad else 0}
    if "--spin-timeouts" in sys.argv:  # every launch fails, but only because a spin gave up
        bad = True
        metrics.update(weak=0, spin_timeouts=n)
    if "--resolved" in sys.argv:
        metrics["resolved"] = json.loads(sys.argv[sys.argv.index("--resolved") + 1])
    send({"id": req["id"], "status": "ok", "launches": n, "mismatched": n if bad else 0,
          "bad_elements": 7 * n if bad else 0, "max_rel_err": 0.5 if bad else 0.0,
          "kernel_ms": 0.01 * n, "seed": 1, "metrics": metrics})
