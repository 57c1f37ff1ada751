"""Supervisor overhead per server request, measured side by side in one run.

Three clients talk to the same trivial JSON-lines server (docs/protocol.md), each to its
own copy of it, in interleaved blocks so machine load drifts hit all of them alike:

  direct     a minimal pipe client: write the request line, read the reply line
  target     hazards.engine.targets.ServerTarget.run() (protocol checks, watchdog deadline,
             classification, RunResult)
  campaign   ServerTarget.run() + Store.record_run() (the campaign loop's per-run cost,
             including the SQLite WAL commit)
  store      Store.record_run() alone of a stored-looking clean result (the commit cost)

The overhead is the difference of the per-request medians against `direct`.

    python3 bench/supervisor_overhead.py                 # 20 blocks x 500 requests
    python3 bench/supervisor_overhead.py --blocks 10 --per-block 200
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hazards.engine.store import Store  # noqa: E402
from hazards.engine.targets import ServerTarget  # noqa: E402


def serve() -> None:
    """The trivial server: handshake, then one 'ok' reply per request, no work."""
    out = sys.stdout.buffer
    out.write(json.dumps({"hz_protocol": 1, "server": "bench", "pid": os.getpid()}).encode() + b"\n")
    out.flush()
    for raw in sys.stdin.buffer:
        req = json.loads(raw)
        if req.get("cmd") == "quit":
            return
        out.write(json.dumps({"id": req["id"], "status": "ok", "launches": req.get("launches", 1),
                              "mismatched": 0}).encode() + b"\n")
        out.flush()


SERVER_ARGV = [sys.executable, str(Path(__file__).resolve()), "--serve"]


class DirectClient:
    """The least a client can do: one line out, one line back, parsed."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(SERVER_ARGV, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        json.loads(self.proc.stdout.readline())  # handshake
        self.next_id = 0

    def run(self) -> None:
        self.next_id += 1
        self.proc.stdin.write(json.dumps({"id": self.next_id, "launches": 1, "params": {}}).encode() + b"\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        assert reply["id"] == self.next_id and reply["status"] == "ok"

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


def time_block(fn, count: int) -> float:
    """Seconds per call of fn over `count` calls."""
    t0 = time.perf_counter()
    for _ in range(count):
        fn()
    return (time.perf_counter() - t0) / count


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=20)
    ap.add_argument("--per-block", type=int, default=500)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve()
        return 0

    load_before = os.getloadavg()[0]
    tmp = tempfile.TemporaryDirectory(prefix="hz-bench-")
    store = Store(Path(tmp.name) / "results.db")
    cid = store.create_campaign("bench", {"what": "supervisor overhead"})
    direct = DirectClient()
    target = ServerTarget(SERVER_ARGV, name="bench")
    target2 = ServerTarget(SERVER_ARGV, name="bench")

    def via_target() -> None:
        r = target.run({}, timeout=10.0, launches=1)
        assert r.outcome.value == "clean", r.reason

    def via_campaign() -> None:
        r = target2.run({}, timeout=10.0, launches=1)
        store.record_run(cid, r)

    sample = target.run({}, timeout=10.0, launches=1)

    def store_only() -> None:
        store.record_run(cid, sample)

    clients = {"direct": direct.run, "target": via_target, "campaign": via_campaign, "store": store_only}
    try:
        for fn in clients.values():  # warm up: imports, first spawn, page cache
            time_block(fn, 50)
        per = {name: [] for name in clients}
        for b in range(args.blocks):
            order = list(clients) if b % 2 == 0 else list(reversed(clients))
            for name in order:
                per[name].append(time_block(clients[name], args.per_block))
        assert store.run_count(cid) == 2 * (50 + args.blocks * args.per_block)
    finally:
        direct.close()
        target.close()
        target2.close()
        store.close()
        tmp.cleanup()

    med = {k: statistics.median(v) for k, v in per.items()}
    lo = {k: min(v) for k, v in per.items()}
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"load avg {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(f"{args.blocks} interleaved blocks x {args.per_block} requests per client\n")
    print(f"{'client':<10} {'median us/req':>14} {'best block us/req':>18} {'x direct':>9}")
    for k in clients:
        print(f"{k:<10} {med[k] * 1e6:>14.1f} {lo[k] * 1e6:>18.1f} {med[k] / med['direct']:>9.2f}")
    print()
    print(f"supervisor overhead per request (ServerTarget.run - direct): "
          f"{(med['target'] - med['direct']) * 1e6:.1f} us (median), "
          f"{(lo['target'] - lo['direct']) * 1e6:.1f} us (best blocks)")
    print(f"with the store commit (run + record_run - direct):           "
          f"{(med['campaign'] - med['direct']) * 1e6:.1f} us (median), "
          f"{(lo['campaign'] - lo['direct']) * 1e6:.1f} us (best blocks)")
    print(f"the store commit alone (record_run):                         "
          f"{med['store'] * 1e6:.1f} us (median), {lo['store'] * 1e6:.1f} us (best block)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
