"""A soak across three Ray nodes on one CPU machine, one node killed halfway, as an operator sees it.

Starts the test cluster of `tests/ray/cluster.py` (a head without GPUs, node-a with one fake
GPU, node-b with two, each its own `ray start` process, lease folder and node name), runs
`hazards soak --executor ray --address HEAD` (text output) from a separate driver process,
SIGKILLs every process of node-a once the soak has stored enough runs, and prints the
soak's output, its exit status and the stored rows per node and GPU. Then the CLI against
addresses that are not a Ray head. Every node, the driver and the fake heads are on
127.0.0.1: nothing leaves the loopback interface. Finally the cluster is stopped and any process left is
listed. Prints everything on stdout (the raw output of docs/results/ray-multinode-cpu.md).

    PYTHONPATH=$PWD python3 bench/ray_multinode_cpu.py [--budget 20] [--kill-after-runs 8]
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "ray"))

from cluster import HTTP2_NOT_FOUND, LOOPBACK, NODES, fake_head, free_port, full_backlog, start_cluster  # noqa: E402
from test_multinode import Driver, targets_toml  # noqa: E402

from hazards.engine.store import Store  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=20.0, help="soak budget, seconds")
    ap.add_argument("--kill-after-runs", type=int, default=8, help="kill node-a once this many runs are stored")
    ap.add_argument("--sleep", type=float, default=0.5, help="seconds each fake request takes")
    args = ap.parse_args()

    t0 = time.monotonic()
    cluster = start_cluster(NODES)
    print(f"cluster at {cluster.address}: " + ", ".join(
        f"{n.name} up after {n.started_s:.1f} s" for n in cluster.nodes.values()), flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="hz-ray-bench-") as tmp:
            driver = Driver(Path(tmp), cluster.address)
            targets = targets_toml(Path(tmp) / "targets.toml", args.sleep)
            argv = [a for a in driver.argv("--targets", str(targets), "--no-families", "--budget",
                                           f"{args.budget:g}s") if a != "--json"]
            print("$", " ".join(argv[2:]).replace(str(tmp), "$TMP"), flush=True)
            proc = subprocess.Popen(argv, cwd=tmp, env=driver.env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            driver.wait_runs(args.kill_after_runs, proc)
            pids = cluster.nodes["node-a"].kill()
            killed_at = time.time()  # node-a's processes are all dead by now
            print(f"[{time.strftime('%H:%M:%S', time.localtime(killed_at))}] SIGKILL to node-a's "
                  f"{len(pids)} processes after {driver.count_runs()} stored runs", flush=True)
            out, err = proc.communicate(timeout=600)
            print("--- soak stdout ---\n" + out.replace(str(tmp), "$TMP").rstrip())
            print("--- soak stderr ---\n" + err.replace(str(tmp), "$TMP").rstrip())
            print(f"--- exit status {proc.returncode} ---", flush=True)

            store = Store(driver.store, read_only=True)
            camp = store.campaigns("soak")[-1]
            per = collections.Counter()
            for sr in store.runs(camp.id):
                r = sr.result
                when = "before" if r.started_at < killed_at else "after"
                per[(r.host, r.gpu_uuid, r.outcome.value, r.error_kind or "", when)] += 1
                if r.error_kind == "node_lost":
                    print(f"node_lost row: seq {sr.seq}, {r.key}, host {r.host}, GPU {r.gpu_uuid}, "
                          f"started {r.started_at - killed_at:+.2f} s from the kill, reason: {r.reason}")
            print("stored runs by (host, GPU, outcome, error kind, started before/after the kill):")
            for key, n in sorted(per.items()):
                print(f"  {n:4d}  {key}")
            print(f"campaign {camp.id}: status {camp.status}; spec lost: {camp.spec.get('lost')}")
            store.close()

            # Every bad address is made here on 127.0.0.1 (nothing leaves loopback;
            # an unknown host name is left to the tests, where no DNS server is asked).
            with contextlib.ExitStack() as fakes:
                bad = {"nothing listens": f"{LOOPBACK}:{free_port()}",
                       "a silent port": fakes.enter_context(fake_head()),
                       "an HTTP/2 server that is not gRPC": fakes.enter_context(fake_head(HTTP2_NOT_FOUND)),
                       "a full backlog: no answer to a connect": fakes.enter_context(full_backlog()),
                       "not HOST:PORT": "headnode"}
                for what, address in bad.items():
                    b = Driver(Path(tmp), address)
                    t1 = time.monotonic()
                    rc, _, berr = b.run("--targets", str(targets), "--no-families", "--budget", "5s")
                    print(f"--address {address} ({what}): exit {rc} after {time.monotonic() - t1:.1f} s: "
                          f"{berr.strip()}")
    finally:
        t1 = time.monotonic()
        left = cluster.stop()
        print(f"cluster stopped in {time.monotonic() - t1:.1f} s; processes left: {left}; "
              f"folder {cluster.temp_dir} removed: {not cluster.temp_dir.exists()}; total {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
