"""The engine's reliability on a CPU machine, measured: verdicts, processes and files.

Phase 1, a campaign: 2,000 runs of fake targets (bench/reliability_fake.sh, sh + awk, and the
tests' fake launch server) on four fake GPUs at once, through the real frame and loop, with
injected hangs (>= 30%: plain, SIGTERM-ignoring, with a setsid grandchild, with a daemon
that double-forked, cleared its environment and closed its descriptors), faults (exit 3,
CUDA messages, SIGSEGV, a fault message inside a progress bar past column 1,000 followed
by > 64 KB), malformed result lines, result lines after carriage returns, server faults,
garbage, hangs, deaths and servers that exit 0 right after a reply (the next request races
the exit). Every run has an expected outcome; the bench counts runs started (items the work
source handed out) vs stored, misclassified runs, processes still running afterwards and
tripwire files left in /dev/shm. Results: docs/results/reliability-cpu.md.

Phase 2, 20 supervisor kills: `hazards run`, `hazards soak` (two fake GPUs) and `hazards
repro --tripwire` on a workload that cycles through clean runs and the hangs above, killed
with SIGKILL, SIGHUP or SIGTERM at a random moment. Per kill: exit code, runs started (the
fakes' own log) vs stored, processes still running 5 s after the kill, tripwire files of
the dead supervisor left in /dev/shm; after the next start in the same store: campaign
status, what was cleaned, and survivors/files again; `hazards run` campaigns are resumed to
completion (`--resume` must say what was cleaned after a SIGKILL).

First, what containment costs: the start of `true` plain, behind setpriv, and behind the sh
that joins a cgroup and then setpriv, in interleaved blocks.

    python3 bench/reliability_cpu.py --out docs/results/reliability-cpu     # ~7 min, 2 busy cores
    python3 bench/reliability_cpu.py --runs 200 --kills 3                    # a quick look
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import platform
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from hazards.engine.campaign import LeasedCampaign  # noqa: E402
from hazards.engine.containment import CONTAINMENT  # noqa: E402
from hazards.engine.loop import WorkItem  # noqa: E402
from hazards.engine.store import Store  # noqa: E402
from hazards.engine.targets import CommandTarget, ServerTarget  # noqa: E402
from hazards.engine.targets.tripwire import TripwireTarget  # noqa: E402
from hazards.engine.tripwire.session import TripwireFile  # noqa: E402

FAKE = REPO / "bench" / "reliability_fake.sh"
FAKE_SERVER = REPO / "tests" / "fakes" / "fake_server.py"
HANG_TIMEOUT_S = 0.5   # a hang is judged after this
DONE_TIMEOUT_S = 30.0  # runs that end by themselves: a bound no loaded machine reaches
GRACE_S = 0.3          # SIGTERM to SIGKILL

# (kind, mode, expected outcome, share of 2,000 runs)
COMMANDS = [
    ("clean", "clean", 130), ("mismatch_line", "mismatch", 50), ("exit1", "mismatch", 40),
    ("fault_exit3", "fault", 60), ("fault_msg", "fault", 60), ("segv", "fault", 50),
    ("longline_fault", "fault", 80), ("longline_result", "mismatch", 50),
    ("malformed_json", "error", 25), ("malformed_ok", "error", 25), ("malformed_count", "error", 25),
    ("malformed_status", "error", 25),
    ("malformed_says_mismatch", "mismatch", 20), ("malformed_exit1", "mismatch", 20),
    ("wrapper_sigkill", "error", 20), ("wrapper_segv", "fault", 20),
    ("hang_sleep", "hang", 140), ("hang_ignore_term", "hang", 130), ("hang_setsid", "hang", 130),
    ("hang_daemon", "hang", 130),
    ("tw_clean", "clean", 40), ("tw_fault_msg", "fault", 30), ("tw_mismatch_line", "mismatch", 30),
]
SERVER = [  # (action or params, expected, share); "race" is a pair: exit0_after, then a request
    ({}, "clean", 250), ({"mismatched": 2}, "mismatch", 50), ({"action": "fault"}, "fault", 40),
    ({"action": "die_segv"}, "fault", 30), ({"action": "garbage"}, "error", 30),
    ({"action": "hang"}, "hang", 80), ("race", None, 95),
]


# -- phase 1: the campaign ---------------------------------------------------------------

class Planned:
    """A work source with one queue per GPU (a race pair must reach the same server)."""

    def __init__(self, queues: dict[str, collections.deque]) -> None:
        self.queues, self.issued, self._mu = queues, 0, threading.Lock()

    def next_item(self, gpu: str) -> WorkItem | None:
        with self._mu:
            if not self.queues[gpu]:
                return None
            self.issued += 1
            return self.queues[gpu].popleft()

    def report(self, item: WorkItem, result) -> None:
        pass

    def finished(self) -> bool:
        return not any(self.queues.values())


def command_item(mode: str, expect: str, pids: Path, starts: Path) -> WorkItem:
    shell_mode = mode[3:] if mode.startswith("tw_") else mode
    timeout = HANG_TIMEOUT_S if expect == "hang" else DONE_TIMEOUT_S
    return WorkItem(target=f"cmd-{mode}", variant=mode, kind="command", timeout_s=timeout,
                    argv=("sh", str(FAKE), shell_mode, str(pids), str(starts)),
                    params={"mode": mode, "expect": expect})


def server_item(params: dict, expect: str, pids: Path) -> WorkItem:
    timeout = HANG_TIMEOUT_S if expect == "hang" else DONE_TIMEOUT_S
    mode = params.get("action", "mismatched" if "mismatched" in params else "ok")
    return WorkItem(target="fake-server", variant=mode, kind="server", timeout_s=timeout,
                    argv=(sys.executable, str(FAKE_SERVER)), env={"HZ_FAKE_PIDFILE": str(pids)},
                    params={**params, "mode": f"server_{mode}", "expect": expect})


def plan(n: int, gpus: list[str], pids: Path, starts: Path, rng: random.Random) -> dict[str, collections.deque]:
    """The runs, scaled to `n`, dealt to the GPUs; a race pair stays together."""
    scale = n / 2000
    units: list[list[WorkItem]] = []
    for mode, expect, share in COMMANDS:
        units += [[command_item(mode, expect, pids, starts)] for _ in range(round(share * scale))]
    for params, expect, share in SERVER:
        for _ in range(round(share * scale)):
            if params == "race":
                units.append([server_item({"action": "exit0_after"}, "clean", pids),
                              server_item({"race": True}, "error", pids)])
            else:
                units.append([server_item(params, expect, pids)])
    rng.shuffle(units)
    queues = {g: collections.deque() for g in gpus}
    for i, unit in enumerate(units):
        queues[gpus[i % len(gpus)]].extend(unit)
    return queues


def alive(pids: set[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            pass
    return sorted(out)


STARTED = time.time()


def strays() -> list[int]:
    """Every process of the fakes still running, found by what it runs (`sleep 86399`, the
    fake script) rather than by the pids they recorded: nothing can hide from this count."""
    found = []
    for p in psutil.process_iter(["cmdline", "create_time", "status"]):
        try:
            cmd = p.info["cmdline"] or []
            if p.info["create_time"] >= STARTED - 1 and p.info["status"] != psutil.STATUS_ZOMBIE \
                    and ("86399" in cmd or str(FAKE) in cmd):
                found.append(p.pid)
        except psutil.Error:
            continue
    return sorted(found)


def read_pids(path: Path) -> set[int]:
    try:
        return {int(x) for x in path.read_text().split()}
    except (OSError, ValueError):
        return set()


def campaign(n: int, work: Path, seed: int) -> dict:
    os.environ.update(HZ_FAKE_GPUS="0,1,2,3", HZ_LEASE_DIR=str(work / "leases"))
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    pids, starts = work / "campaign-pids", work / "campaign-starts"
    rng = random.Random(seed)
    tripwires: list[TripwireFile] = []

    def factory(item: WorkItem, env: dict) -> object:
        if item.kind == "server":
            return ServerTarget(list(item.argv), env=env, name=item.target, grace_s=GRACE_S,
                                handshake_timeout_s=60)
        if item.variant.startswith("tw_"):
            tw = TripwireFile()
            tripwires.append(tw)
            return TripwireTarget(CommandTarget(list(item.argv), env={**env, **tw.env()}, name=item.target,
                                                grace_s=GRACE_S), tw)
        return CommandTarget(list(item.argv), env=env, name=item.target, grace_s=GRACE_S)

    store = Store(work / "campaign.db")
    t0 = time.monotonic()
    with LeasedCampaign.acquire(store, "reliability bench", telemetry=False, target_factory=factory) as frame:
        queues = plan(n, [lease.gpu for lease in frame.leases], pids, starts, rng)
        source = Planned(queues)
        cid = frame.create("reliability", {"runs": n, "seed": seed})
        frame.run(cid, source, artifacts="none")
        containment = CONTAINMENT.describe()
    for tw in tripwires:
        tw.close()
    elapsed = time.monotonic() - t0
    time.sleep(1.0)
    runs = store.runs(cid)
    confusion: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    wrong = []
    for sr in runs:
        r = sr.result
        expected, got = r.params.get("expect"), r.outcome.value
        confusion[r.params.get("mode", "?")][got] += 1
        if got != expected:
            wrong.append({"seq": sr.seq, "mode": r.params.get("mode"), "expected": expected, "got": got,
                          "reason": r.reason})
    recorded = read_pids(pids)
    survivors = sorted(set(alive(recorded)) | set(strays()))
    shm = sorted(glob.glob(f"/dev/shm/hz-tw-{os.getpid()}-*"))
    counts = collections.Counter(sr.result.outcome.value for sr in runs)
    expected = collections.Counter(sr.result.params.get("expect") for sr in runs)
    store.close()
    return {"runs_planned": sum(len(q) for q in plan(n, ["0"], pids, starts, random.Random(seed)).values()),
            "runs_started": source.issued, "runs_stored": len(runs),
            "command_runs_the_fakes_logged": len(starts.read_text().splitlines()) if starts.exists() else 0,
            "misclassified": len(wrong), "misclassified_runs": wrong,
            "expected": dict(expected), "outcomes": dict(counts),
            "hang_share": expected["hang"] / max(1, len(runs)),
            "confusion_by_mode": {m: dict(c) for m, c in sorted(confusion.items())},
            "processes_recorded": len(recorded), "surviving_processes": survivors,
            "tripwire_files_made": len(tripwires), "leaked_shm_files": shm,
            "elapsed_s": round(elapsed, 1), "runs_per_s": round(len(runs) / elapsed, 1),
            "containment": containment}


# -- what containment costs --------------------------------------------------------------

def spawn_cost(blocks: int = 6, per_block: int = 40) -> dict:
    """Milliseconds per start+wait of `true`: plain Popen, behind setpriv, and behind the
    sh that joins a cgroup then setpriv (what every child gets here), in interleaved blocks
    (median of the block medians, so load drift hits all three alike)."""
    CONTAINMENT.describe()
    setpriv, root = CONTAINMENT.setpriv, CONTAINMENT.cgroup_root
    ways: dict[str, list[str]] = {"plain": ["true"]}
    if setpriv:
        ways["setpriv"] = [setpriv, "--pdeathsig", "KILL", "--", "true"]
    if setpriv and root:
        probe = os.path.join(root, "cost")
        os.mkdir(probe)
        ways["sh+cgroup+setpriv"] = ["sh", "-c", 'echo 0 2>/dev/null >"$0"; exec "$@"',
                                     os.path.join(probe, "cgroup.procs"), *ways["setpriv"]]
    medians: dict[str, list[float]] = {k: [] for k in ways}
    for b in range(blocks):
        for name in (list(ways) if b % 2 == 0 else list(ways)[::-1]):
            times = []
            for _ in range(per_block):
                t = time.perf_counter()
                subprocess.run(ways[name], start_new_session=True)
                times.append(time.perf_counter() - t)
            medians[name].append(sorted(times)[len(times) // 2] * 1000)
    if setpriv and root:
        os.rmdir(probe)
    return {k: round(sorted(v)[len(v) // 2], 2) for k, v in medians.items()}


# -- phase 2: supervisor kills ---------------------------------------------------------------

SOAK_TOML = """[[target]]
name = "cycle"
argv = {argv}
timeout = 2
"""
SIGNALS = [signal.SIGKILL, signal.SIGHUP, signal.SIGTERM]


def hazards(args: list[str], env: dict, cwd: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hazards", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def db_rows(db: Path, sql: str, *args) -> list:
    con = sqlite3.connect(db, timeout=30)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def wait_dead(pids: set[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(pids)


def kills(k: int, work: Path, seed: int) -> dict:
    rng = random.Random(seed + 1)
    db = work / "kills.db"
    env = {key: v for key, v in os.environ.items() if key not in ("HZ_STORE", "HZ_FAKE_GPUS", "CUDA_VISIBLE_DEVICES")}
    env.update(PYTHONPATH=str(REPO), HZ_RUNTIME_DIR=str(work / "runtime"), HZ_LEASE_DIR=str(work / "kill-leases"))
    rounds = []
    for i in range(k):
        kind, sig = ("run", "soak", "repro")[i % 3], SIGNALS[(i + i // 3) % 3]
        pids, starts = work / f"kill{i:02d}-pids", work / f"kill{i:02d}-starts"
        cycle = ["sh", str(FAKE), "cycle", str(pids), str(starts)]
        round_env = dict(env)
        if kind == "run":
            args = ["run", "-n", "1000", "--timeout", "2", "--store", str(db), "--", *cycle]
        elif kind == "soak":
            toml = work / f"kill{i:02d}.toml"
            toml.write_text(SOAK_TOML.format(argv=json.dumps(cycle)))
            args = ["soak", "--budget", "10m", "--targets", str(toml), "--no-families", "--store", str(db),
                    "--report", str(work / f"kill{i:02d}.html")]
            round_env["HZ_FAKE_GPUS"] = "0,1"
        else:
            args = ["repro", "--tripwire", "--no-forensics", "--keep-going", "-n", "1000", "--timeout", "2",
                    "--store", str(db), "--", *cycle]
        before = (db_rows(db, "SELECT coalesce(max(id), 0) FROM campaigns")[0][0] if db.exists() else 0)
        proc = hazards(args, round_env, work)
        deadline = time.monotonic() + 120
        while not (starts.exists() and starts.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.5, 4.0))
        shm_before = sorted(glob.glob(f"/dev/shm/hz-tw-{proc.pid}-*"))
        proc.send_signal(sig)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        survivors = sorted(set(wait_dead(read_pids(pids), 5.0)) | set(strays()))
        cid = db_rows(db, "SELECT max(id) FROM campaigns")[0][0]
        stored = db_rows(db, "SELECT count(*) FROM runs WHERE campaign_id = ?", cid)[0][0] if cid > before else 0
        rounds.append({
            "round": i, "command": kind, "signal": signal.Signals(sig).name, "supervisor_pid": proc.pid,
            "exit_code": proc.returncode, "campaign": cid if cid > before else None,
            "runs_started": len(starts.read_text().splitlines()), "runs_stored": stored,
            "loops": 2 if kind == "soak" else 1,
            "processes_recorded": len(read_pids(pids)), "surviving_5s_after_kill": survivors,
            "shm_files_while_running": shm_before,
            "shm_left_5s_after_kill": sorted(glob.glob(f"/dev/shm/hz-tw-{proc.pid}-*")),
            "stderr_tail": err[-300:]})
    # the next start in the store: recovers the last round's campaign (each round's start
    # recovered the one before it)
    last = hazards(["run", "-n", "1", "--timeout", "5", "--store", str(db), "--", "true"], env, work)
    last.communicate(timeout=300)
    for rnd in rounds:
        if rnd["campaign"] is None:
            continue
        status, spec = db_rows(db, "SELECT status, spec FROM campaigns WHERE id = ?", rnd["campaign"])[0]
        spec = json.loads(spec)
        rnd["status_after_next_start"] = status
        rnd["recovered_report"] = spec.get("recovered")
        rnd["surviving_after_next_start"] = sorted(set(alive(read_pids(work / f"kill{rnd['round']:02d}-pids")))
                                                   | set(strays()))
        rnd["shm_left_after_next_start"] = sorted(glob.glob(f"/dev/shm/hz-tw-{rnd['supervisor_pid']}-*"))
        if rnd["command"] == "run":  # resumed to completion; --resume says what was cleaned
            res = hazards(["run", "--resume", str(rnd["campaign"]), "-n", str(rnd["runs_stored"] + 1),
                           "--timeout", "2", "--store", str(db)], env, work)
            _, err = res.communicate(timeout=300)
            rnd["resume_exit_code"] = res.returncode
            rnd["resume_said"] = [ln for ln in err.splitlines() if "was interrupted" in ln]
            rnd["status_after_resume"] = db_rows(db, "SELECT status FROM campaigns WHERE id = ?",
                                                 rnd["campaign"])[0][0]
            rnd["surviving_after_resume"] = sorted(set(alive(read_pids(work / f"kill{rnd['round']:02d}-pids")))
                                                   | set(strays()))
    return {"rounds": rounds}


def recovered(rnd: dict) -> bool:
    """A killed campaign is recovered when it ends up 'interrupted' with nothing of it left
    running and no file left, after a SIGKILL with a cleaning report, and (`hazards run`)
    resumed to completion, its resume saying what was cleaned after a SIGKILL."""
    ok = rnd.get("status_after_next_start") == "interrupted" and not rnd["surviving_after_next_start"] \
        and not rnd["shm_left_after_next_start"]
    if rnd["signal"] == "SIGKILL":
        ok = ok and bool(rnd.get("recovered_report"))
    else:
        ok = ok and rnd["exit_code"] == 128 + signal.Signals[rnd["signal"]]
    if rnd["command"] == "run":
        ok = ok and rnd.get("status_after_resume") == "complete" \
            and (rnd["signal"] != "SIGKILL" or bool(rnd.get("resume_said")))
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--out", type=Path, help="folder for campaign.json, kills.json, summary.txt")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hz-reliability-"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    machine = f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs, Linux {platform.release()}"
    cost = spawn_cost()
    camp = campaign(args.runs, work, args.seed)
    kill = kills(args.kills, work, args.seed)
    rounds = kill["rounds"]
    lines = [
        f"reliability-cpu  commit {commit}  {time.strftime('%Y-%m-%d %H:%M')}  {machine}",
        f"containment: {json.dumps(camp['containment'])}",
        f"spawn + wait of `true`, ms (median of interleaved block medians): {json.dumps(cost)}",
        "",
        f"campaign: {camp['runs_stored']} runs on 4 fake GPUs in {camp['elapsed_s']} s "
        f"({camp['runs_per_s']} runs/s); hangs {camp['hang_share']:.1%} of the runs",
        f"  runs started (handed out) {camp['runs_started']}, stored {camp['runs_stored']}",
        f"  misclassified {camp['misclassified']}",
        f"  surviving processes {len(camp['surviving_processes'])} (of {camp['processes_recorded']} recorded)",
        f"  leaked /dev/shm files {len(camp['leaked_shm_files'])} (of {camp['tripwire_files_made']} made)",
        f"  expected {json.dumps(camp['expected'], sort_keys=True)}",
        f"  judged   {json.dumps(camp['outcomes'], sort_keys=True)}",
        "",
        f"supervisor kills: {len(rounds)}",
        "  round command signal  exit  started stored  surv.5s  shm.5s  status(next start)  resumed",
    ]
    for r in rounds:
        lines.append(f"  {r['round']:5d} {r['command']:7s} {r['signal']:7s} {r['exit_code']:4d} "
                     f"{r['runs_started']:8d} {r['runs_stored']:6d} {len(r['surviving_5s_after_kill']):8d} "
                     f"{len(r['shm_left_5s_after_kill']):7d}  {str(r.get('status_after_next_start')):18s}  "
                     f"{r.get('status_after_resume', '-')}")
    lost = sum(r["runs_started"] - r["runs_stored"] for r in rounds)
    in_flight = sum(r["loops"] for r in rounds)
    lines += [
        f"  runs started {sum(r['runs_started'] for r in rounds)}, stored {sum(r['runs_stored'] for r in rounds)} "
        f"(not stored: {lost}, the runs in flight at the kills, at most {in_flight})",
        f"  surviving processes 5 s after the kill: {sum(len(r['surviving_5s_after_kill']) for r in rounds)}; "
        f"after the next start: {sum(len(r.get('surviving_after_next_start', [])) for r in rounds)}",
        f"  leaked /dev/shm files 5 s after the kill: {sum(len(r['shm_left_5s_after_kill']) for r in rounds)}; "
        f"after the next start: {sum(len(r.get('shm_left_after_next_start', [])) for r in rounds)}",
        f"  interrupted campaigns recovered: {sum(recovered(r) for r in rounds)} of {len(rounds)}",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "campaign.json").write_text(json.dumps({**camp, "spawn_cost_ms": cost}, indent=1, default=str))
        (args.out / "kills.json").write_text(json.dumps(kill, indent=1, default=str))
        (args.out / "summary.txt").write_text(text + "\n")
    ok = (camp["runs_started"] == camp["runs_stored"] and not camp["misclassified"]
          and not camp["surviving_processes"] and not camp["leaked_shm_files"]
          and all(recovered(r) and not r["surviving_5s_after_kill"] and not r["shm_left_5s_after_kill"]
                  and r["runs_started"] - r["runs_stored"] <= r["loops"] for r in rounds))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
