"""A fake family launch server (docs/protocol.md) with a known, controllable failure pattern.

Per request, params decide the reply:
  fail_every: N > 0  -> every N-th request this process serves mismatches (all launches);
                        an intermittent failure with an exact, known rate of 1/N
  rate: x in [0, 1]  -> mismatched = round(x * launches): a continuous mismatch rate
Unknown params are ignored; `variant` is echoed into metrics.
"""
import json
import os
import sys


def main() -> None:
    out = sys.stdout
    out.write(json.dumps({"hz_protocol": 1, "server": "fakefam", "pid": os.getpid(),
                          "variants": ["steady", "flaky"]}) + "\n")
    out.flush()
    served = 0
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("cmd") == "quit":
            return
        served += 1
        params, launches = req.get("params", {}), int(req.get("launches", 1))
        every = int(params.get("fail_every", 0))
        if every > 0:
            mismatched = launches if served % every == 0 else 0
        else:
            mismatched = round(float(params.get("rate", 0.0)) * launches)
        out.write(json.dumps({"id": req["id"], "status": "ok", "launches": launches, "mismatched": mismatched,
                              "metrics": {"variant": params.get("variant", "")}}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
