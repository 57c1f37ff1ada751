"""A fake server target speaking docs/protocol.md; what it does per request is chosen by
the request's params["action"]:

ok (default)  reply ok with params["mismatched"] (default 0) mismatched launches
fault         reply status fault with a CUDA message
bad_request   reply status bad_request
hang          never reply (block forever)
garbage       reply with a line that is not JSON
wrong_id      reply to a different id
truncate      write half a reply, no newline, and exit 0
die_segv      die by SIGSEGV mid-request
die_cuda      print a CUDA fault on stderr and exit 1 mid-request
abort_after   reply ok, then abort (SIGABRT) before reading the next request

`fake_server.py --handshake MODE` changes the start: ok, banner (library chatter first),
bad_version, garbage, truncated, silent (never shakes hands), crash (exits 1 first).
`--handshake-from FILE` reads that MODE from FILE at start-up (so a test can make a
respawned server fail where the first one succeeded).
"""
import json
import os
import signal
import sys
import time

from fakelib import record_pid

out = sys.stdout.buffer


def send(obj) -> None:
    out.write(json.dumps(obj).encode() + b"\n")
    out.flush()


def handshake(mode: str) -> None:
    hello = {"hz_protocol": 1, "server": "fake", "pid": os.getpid(),
             "gpu_uuid": "GPU-fake-0000", "variants": ["reference"]}
    if mode == "banner":
        out.write(b"Fake runtime 1.0 starting\nloading ...\n")
    elif mode == "bad_version":
        hello["hz_protocol"] = 99
    elif mode == "garbage":
        out.write(b"{this is not json\n")
        out.flush()
        return
    elif mode == "truncated":
        out.write(b'{"hz_protocol": 1, "ser')
        out.flush()
        sys.exit(0)
    elif mode == "silent":
        while True:
            time.sleep(3600)
    elif mode == "crash":
        print("ModuleNotFoundError: No module named 'fake_cuda'", file=sys.stderr)
        sys.exit(1)
    send(hello)


def serve() -> None:
    for raw in sys.stdin.buffer:
        req = json.loads(raw)
        if req.get("cmd") == "quit":
            return
        rid, params = req["id"], req.get("params", {})
        action = params.get("action", "ok")
        if action == "ok":
            send({"id": rid, "status": "ok", "launches": req["launches"],
                  "mismatched": params.get("mismatched", 0), "max_rel_err": 0.0,
                  "metrics": {"worker_pid": os.getpid()}})
        elif action == "fault":
            send({"id": rid, "status": "fault",
                  "message": "cudaErrorIllegalAddress: an illegal memory access was encountered"})
        elif action == "bad_request":
            send({"id": rid, "status": "bad_request", "message": "unknown variant"})
        elif action == "hang":
            while True:
                time.sleep(3600)
        elif action == "garbage":
            out.write(b"Segmentation fault? no, just garbage\n")
            out.flush()
        elif action == "wrong_id":
            send({"id": rid + 1000, "status": "ok", "mismatched": 0})
        elif action == "truncate":
            out.write(b'{"id": %d, "status": "o' % rid)
            out.flush()
            os._exit(0)
        elif action == "die_segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif action == "abort_after":
            send({"id": rid, "status": "ok", "mismatched": 0})
            os.abort()
        elif action == "exit0_after":
            send({"id": rid, "status": "ok", "mismatched": 0})
            os._exit(0)
        elif action == "die_cuda":
            print("CUDA error: an illegal memory access was encountered", file=sys.stderr,
                  flush=True)
            os._exit(1)


if __name__ == "__main__":
    record_pid()
    mode = "ok"
    if "--handshake" in sys.argv:
        mode = sys.argv[sys.argv.index("--handshake") + 1]
    if "--handshake-from" in sys.argv:
        with open(sys.argv[sys.argv.index("--handshake-from") + 1]) as f:
            mode = f.read().strip()
    handshake(mode)
    serve()
