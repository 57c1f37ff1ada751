"""A fake family launch server for the campaign tests (docs/protocol.md, version 1).

It stands in for a family's harness binary: params["variant"] names the variant and
params["fail_prob"] is the chance that a request reports mismatched launches (a broken
variant: 1.0; a fixed one, or a canary made harmless on purpose: 0.0); params["anomaly"]
names a metric a failing reply reports > 0 (a harness anomaly, not the hazard). The handshake
names the GPU after CUDA_VISIBLE_DEVICES, and every reply echoes it in its metrics, so
tests can check that each child runs on its lease's GPU.
"""
import json
import os
import random
import sys
import time

out = sys.stdout.buffer
cvd = os.environ.get("CUDA_VISIBLE_DEVICES", "")


def send(obj) -> None:
    out.write(json.dumps(obj).encode() + b"\n")
    out.flush()


send({"hz_protocol": 1, "server": "fakefam", "pid": os.getpid(), "gpu_uuid": f"GPU-fake-{cvd}"})
for raw in sys.stdin.buffer:
    req = json.loads(raw)
    if req.get("cmd") == "quit":
        break
    params = req.get("params", {})
    launches = int(req.get("launches") or 1)
    if "variant" not in params:
        send({"id": req["id"], "status": "bad_request", "message": "no variant"})
        continue
    time.sleep(float(params.get("sleep_s", 0.0)))
    failed = random.random() < float(params.get("fail_prob", 0.0))
    metrics = {"cvd": cvd, "variant": params["variant"]}
    if failed and params.get("anomaly"):  # the failure is the harness's own machinery going wrong
        metrics[params["anomaly"]] = launches
    send({"id": req["id"], "status": "ok", "launches": launches,
          "mismatched": launches if failed else 0, "kernel_ms": round(random.uniform(0.05, 0.2), 4),
          "metrics": metrics})
