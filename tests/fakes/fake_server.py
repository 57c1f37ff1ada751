"""The one fake launch server of the tests (docs/protocol.md, through `hazards.engine.protocol_server`).

It stands in for a family's harness binary and for a misbehaving server. Per request, params
decide the reply:

  action        ok (default) | fault | bad_request | hang (never reply) | garbage (a line that
                is not JSON) | wrong_id | truncate (half a reply, then exit 0) | die_segv |
                die_cuda (a CUDA fault on stderr, exit 1) | abort_after / exit0_after (reply
                ok, then abort / exit 0 before the next request)
  mismatched    that many mismatched launches, or else:
  fail_prob     the chance that every launch of this request mismatches (a canary: 1.0);
  fail_every    N > 0: every N-th request this process serves mismatches (an exact rate 1/N);
  rate          mismatched = round(rate * launches): a continuous rate
  fail_from     {name: threshold}: every launch mismatches when each named request field is
                >= its threshold (a failing region of a fake family's parameter space)
  sleep_s       seconds to sleep before replying
  beats, beat_s that many progress lines (protocol_server.progress), `beat_s` apart, before
                anything else (a hang after them is a stall)
  anomaly       a metric a failing reply reports > 0 (the harness's own machinery went wrong,
                not the hazard)
  variant       echoed into metrics
  require_variant  true: a request without a variant is a bad request

The handshake names the GPU after CUDA_VISIBLE_DEVICES (GPU-fake-<cvd>, GPU-fake-0000 when
unset) and every reply's metrics carry `cvd`, `worker_pid` and `variant`, so tests can check
which process and which leased GPU served a run.

`--harness` replies as a family's harness binary does: a variant named broken* / mp_plain* /
pc_no* mismatches every launch, with litmus metrics (instances, weak), element counts and an
error; `--spin-timeouts` then makes every launch fail through bounded spins that gave up (the
harness's own anomaly, no weak outcome), and `--resolved JSON` reports that point as
`metrics.resolved` (what a real binary says it ran).

`--handshake MODE` changes the start: ok, banner (library chatter first), bad_version,
garbage, truncated, silent (never shakes hands), crash (exits 1 first). `--handshake-from
FILE` reads that MODE from FILE at start-up (so a respawned server can fail where the first
one succeeded).
"""
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, when not installed

from fakelib import record_pid  # noqa: E402

from hazards.engine.protocol_server import StopServing, progress, serve  # noqa: E402

out = sys.stdout.buffer
cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
CANARY_NAMES = ("broken", "mp_plain", "pc_no")
ABORT = 134  # a StopServing code that means: abort (SIGABRT) instead of exiting


def raw(data: bytes) -> None:
    out.write(data)
    out.flush()


class FakeServer:
    """The reply logic; one instance per process (it counts the requests it served)."""

    def __init__(self, argv: list[str]) -> None:
        self.harness = "--harness" in argv
        self.spin_timeouts = "--spin-timeouts" in argv
        self.resolved = json.loads(argv[argv.index("--resolved") + 1]) if "--resolved" in argv else None
        self.served = 0

    def __call__(self, req: dict) -> dict | None:
        self.served += 1
        params, launches = req.get("params", {}), int(req.get("launches") or 1)
        for k in range(int(params.get("beats", 0))):
            progress(f"launch {k}")
            time.sleep(float(params.get("beat_s", 0.0)))
        action = params.get("action", "ok")
        if action != "ok":
            return misbehave(action, req["id"])
        if params.get("require_variant") and "variant" not in params:
            return {"status": "bad_request", "message": "no variant"}
        time.sleep(float(params.get("sleep_s", 0.0)))
        variant = params.get("variant", "")
        metrics = {"worker_pid": os.getpid(), "cvd": cvd or "", "variant": variant}
        bad = self.fails(params, launches)
        if bad and params.get("anomaly"):
            metrics[params["anomaly"]] = launches
        reply = {"status": "ok", "launches": launches, "kernel_ms": 0.01 * launches}
        if self.harness:  # a harness's reply: litmus metrics, element counts, the error
            bad = bad or (launches if variant.startswith(CANARY_NAMES) else 0)
            metrics.update(instances=1000 * launches, weak=3 * launches if bad else 0)
            if self.spin_timeouts:
                bad = launches
                metrics.update(weak=0, spin_timeouts=launches)
            if self.resolved is not None:
                metrics["resolved"] = self.resolved
            reply.update(bad_elements=7 * bad, max_rel_err=0.5 if bad else 0.0)
        return {**reply, "mismatched": bad, "metrics": metrics}

    def fails(self, params: dict, launches: int) -> int:
        """Mismatched launches of this request, from the params that set a failure pattern."""
        if "mismatched" in params:
            return int(params["mismatched"])
        region = params.get("fail_from")
        if isinstance(region, dict) and region:
            inside = all(isinstance(params.get(k), (int, float)) and params[k] >= v for k, v in region.items())
            return launches if inside else 0
        if random.random() < float(params.get("fail_prob", 0.0)):
            return launches
        every = int(params.get("fail_every", 0))
        if every > 0:
            return launches if self.served % every == 0 else 0
        return round(float(params.get("rate", 0.0)) * launches)


def misbehave(action: str, rid: int) -> dict | None:
    """The reply (or the lack of one) of a misbehaving server."""
    if action == "fault":
        return {"status": "fault", "message": "cudaErrorIllegalAddress: an illegal memory access was encountered"}
    if action == "bad_request":
        return {"status": "bad_request", "message": "unknown variant"}
    if action == "wrong_id":
        return {"id": rid + 1000, "status": "ok", "mismatched": 0}
    if action in ("abort_after", "exit0_after"):
        raise StopServing(ABORT if action == "abort_after" else 0, {"status": "ok", "mismatched": 0})
    if action == "hang":
        while True:
            time.sleep(3600)
    if action == "garbage":
        raw(b"Segmentation fault? no, just garbage\n")
    elif action == "truncate":
        raw(b'{"id": %d, "status": "o' % rid)
        os._exit(0)
    elif action == "die_segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif action == "die_cuda":
        print("CUDA error: an illegal memory access was encountered", file=sys.stderr, flush=True)
        os._exit(1)
    return None


def handshake(mode: str) -> dict | None:
    """Misbehave at start-up as `mode` says; the handshake to send (None: none)."""
    hello = {"server": "fake", "pid": os.getpid(), "gpu_uuid": f"GPU-fake-{cvd or '0000'}",
             "variants": ["reference"]}
    if mode == "banner":
        raw(b"Fake runtime 1.0 starting\nloading ...\n")
    elif mode == "bad_version":
        hello["hz_protocol"] = 99
    elif mode == "garbage":
        raw(b"{this is not json\n")
        return None
    elif mode == "truncated":
        raw(b'{"hz_protocol": 1, "ser')
        sys.exit(0)
    elif mode == "silent":
        while True:
            time.sleep(3600)
    elif mode == "crash":
        print("ModuleNotFoundError: No module named 'fake_cuda'", file=sys.stderr)
        sys.exit(1)
    return hello


def main() -> int:
    record_pid()
    mode = "ok"
    if "--handshake" in sys.argv:
        mode = sys.argv[sys.argv.index("--handshake") + 1]
    if "--handshake-from" in sys.argv:
        mode = Path(sys.argv[sys.argv.index("--handshake-from") + 1]).read_text().strip()
    code = serve(FakeServer(sys.argv), handshake(mode))
    if code == ABORT:
        os.abort()
    return code


if __name__ == "__main__":
    sys.exit(main())
