"""Round 1 of the hang-forensics GPU work: record what cuda-gdb and py-spy really print for
hung programs on the H200 (test data for the parsers), and how long each takes.

Usage: python3 ci/gpu/hang_forensics_record.py BUILD_DIR OUT_DIR DEADLINE_EPOCH
BUILD_DIR holds hung-li / hung-noli (hung_kernels.cu with and without -lineinfo) and
libhung-li.so. Every hung process is killed after its captures; nothing is left running.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import hazards  # noqa: E402,F401  (maps hazards.engine)
from hazards.engine.forensics.debugger import (DebuggerGone, DebuggerSession, stopped_tasks,  # noqa: E402
                                               tracer_of)
from hazards.engine.proctree import kill_whole_group, run_in_group, start_in_group  # noqa: E402

BUILD, OUT, DEADLINE = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
RAW = OUT / "raw"
RAW.mkdir(parents=True, exist_ok=True)
CUDA_GDB = shutil.which("cuda-gdb")
PY_SPY = shutil.which("py-spy")
TIMINGS: list[dict] = []

BATCH = [
    "info cuda devices", "info cuda kernels", "info cuda blocks", "info cuda threads", "info cuda sms",
    "info cuda warps", "info cuda lanes", "info cuda warps sm 1", "info cuda threads kernel 0",
    "info threads", "thread apply all bt",
    "cuda kernel 0 block 0 thread 0", "bt", "x/4i $pc", "x/16i $pc-0x80", "info line *$pc", "info symbol $pc",
    "p $pc", "info cuda lanes",
    "cuda block 0 thread 1", "x/2i $pc", "info line *$pc",
    "cuda block 0 thread 32", "x/2i $pc", "info line *$pc", "info cuda warps",
    "cuda block 5 thread 0", "x/2i $pc", "disassemble",
]


def remember(pid: int) -> None:
    """Pids (group leaders) the shell wrapper kills if this script is cut short."""
    with open(OUT / "pids.txt", "a") as f:
        f.write(f"{pid}\n")


def left() -> float:
    return DEADLINE - time.time()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def start(argv: list[str], env: dict | None = None, ready: str = "HZ_HANG launched", wait_s: float = 20.0):
    p = start_in_group(argv, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, text=True)
    remember(p.pid)
    t0 = time.monotonic()
    lines = []
    while time.monotonic() - t0 < wait_s:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        if ready in line:
            return p, lines, time.monotonic() - t0
    return p, lines, None


def kill(p: subprocess.Popen) -> None:
    kill_whole_group(p)
    p.wait()


def state(pid: int) -> dict:
    return {"alive": Path(f"/proc/{pid}").exists(), "stopped_tasks": stopped_tasks(pid), "tracer": tracer_of(pid)}


def batch(name: str, pid: int, limit: float = 25.0) -> None:
    if CUDA_GDB is None or left() < 8:
        return
    argv = [CUDA_GDB, "-q", "-nx", "-batch", "-p", str(pid), "-ex", "set pagination off", "-ex", "set width 0"]
    for c in BATCH:
        argv += ["-ex", c]
    dt, rc = timed_capture(argv, min(limit, left() - 3), RAW / f"{name}.cuda-gdb-batch.txt")
    TIMINGS.append({"what": f"{name} cuda-gdb batch ({len(BATCH)} commands)", "seconds": round(dt, 3), "rc": rc,
                    "after": state(pid)})
    log(f"{name}: cuda-gdb batch {dt:.2f}s rc={rc} after={state(pid)}")


def timed_capture(argv: list[str], limit: float, raw: Path) -> tuple[float, int | None]:
    """Run a collector command with a time limit, keep its whole output in `raw`; its
    seconds and exit status (None: it ran out of time)."""
    t0 = time.monotonic()
    try:
        r = run_in_group(argv, limit, text=True)
        out, rc = r.stdout + "\n--- stderr ---\n" + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = f"TIMEOUT\n{e.stdout}\n--- stderr ---\n{e.stderr}", None
    raw.write_text(out)
    return time.monotonic() - t0, rc


def session(name: str, pid: int, limit: float = 15.0) -> None:
    """The pipe-driven DebuggerSession the collector uses, on the same hung process."""
    if CUDA_GDB is None or left() < 6:
        return
    t0 = time.monotonic()
    s = DebuggerSession(CUDA_GDB, deadline=time.monotonic() + min(limit, left() - 3))
    err = None
    try:
        s.attach(pid)
        for c in ("info cuda kernels", "info cuda threads", "thread apply all bt", "cuda kernel 0 block 0 thread 0",
                  "x/16i $pc-0x80", "x/4i $pc", "info line *$pc", "cuda block 0 thread 32", "x/4i $pc",
                  "info line *$pc"):
            s.run(c)
    except DebuggerGone as e:
        err = str(e)
    finally:
        s.close()
    dt = time.monotonic() - t0
    rows = [{"command": o.command, "seconds": o.seconds, "complete": o.complete, "text": o.text}
            for o in s.transcript]
    (RAW / f"{name}.session.json").write_text(json.dumps({"error": err, "notes": s.notes, "commands": rows}, indent=1))
    TIMINGS.append({"what": f"{name} DebuggerSession", "seconds": round(dt, 3), "error": err,
                    "per_command": {o.command: o.seconds for o in s.transcript}, "after": state(pid)})
    log(f"{name}: session {dt:.2f}s err={err} after={state(pid)}")


def pyspy(name: str, pid: int) -> None:
    if PY_SPY is None or left() < 5:
        log(f"py-spy skipped: {PY_SPY=} left={left():.0f}")
        return
    for tag, extra in (("native", ["--native"]), ("json", ["--json"]), ("native-json", ["--native", "--json"])):
        dt, rc = timed_capture([PY_SPY, "dump", "--pid", str(pid), *extra], min(15, left() - 3),
                               RAW / f"{name}.py-spy-{tag}.txt")
        TIMINGS.append({"what": f"{name} py-spy dump {' '.join(extra)}", "seconds": round(dt, 3), "rc": rc,
                        "after": state(pid)})
        log(f"{name}: py-spy {tag} {dt:.2f}s rc={rc}")


def nvml_now(name: str) -> None:
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        u = pynvml.nvmlDeviceGetUtilizationRates(h)
        m = pynvml.nvmlDeviceGetMemoryInfo(h)
        procs = [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
        d = {"gpu_util": u.gpu, "mem_util": u.memory, "mem_used": m.used, "procs": procs,
             "sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)}
    except Exception as e:  # noqa: BLE001
        d = {"error": repr(e)}
    (RAW / f"{name}.nvml.json").write_text(json.dumps(d, indent=1))


def hung(name: str, argv: list[str], *, session_too: bool) -> None:
    if left() < 10:
        log(f"{name}: skipped, {left():.0f}s left")
        return
    p, lines, t_ready = start(argv)
    (RAW / f"{name}.stdout.txt").write_text("".join(lines))
    if t_ready is None:
        log(f"{name}: never launched: {''.join(lines)[-500:]}")
        kill(p)
        return
    time.sleep(0.3)
    try:
        nvml_now(name)
        batch(name, p.pid)
        if session_too:
            session(name, p.pid)
    finally:
        kill(p)


def main() -> None:
    log(f"cuda-gdb={CUDA_GDB} py-spy={PY_SPY} left={left():.0f}s")
    env_info = {}
    for f in ("/proc/sys/kernel/yama/ptrace_scope",):
        try:
            env_info[f] = Path(f).read_text().strip()
        except OSError as e:
            env_info[f] = f"unreadable: {e}"
    env_info["CapEff"] = [ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("CapEff")]
    r = subprocess.run(["dmesg"], capture_output=True, text=True)
    env_info["dmesg_rc"] = r.returncode
    env_info["dmesg_err"] = r.stderr[-300:]
    env_info["dmesg_xid_lines_before"] = [ln for ln in r.stdout.splitlines() if "Xid" in ln][-5:]
    if CUDA_GDB:
        env_info["cuda_gdb_version"] = subprocess.run([CUDA_GDB, "--version"], capture_output=True,
                                                      text=True).stdout[:300]
    (RAW / "environment.json").write_text(json.dumps(env_info, indent=1))

    # torch's import is slow: start it now, it waits for the go file before launching
    go = OUT / "torch.go"
    torch_p = start_in_group([sys.executable, "tests/forensics/programs/hung_torch.py",
                              str(BUILD / "libhung-li.so")], stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "HZ_HANG_GO_FILE": str(go)})
    remember(torch_p.pid)
    try:
        hung("spin-li", [str(BUILD / "hung-li"), "spin"], session_too=True)
        hung("spin-noli", [str(BUILD / "hung-noli"), "spin"], session_too=False)
        hung("gridbar-li", [str(BUILD / "hung-li"), "gridbar"], session_too=True)
        hung("gridbar-noli", [str(BUILD / "hung-noli"), "gridbar"], session_too=False)
        # torch next: it has had its import time
        if left() > 15:
            go.write_text("go")
            t0 = time.monotonic()
            lines = []
            while time.monotonic() - t0 < min(30, left() - 10):
                line = torch_p.stdout.readline()
                if not line:
                    break
                lines.append(line)
                if "HZ_HANG launched" in line:
                    break
            (RAW / "torch.stdout.txt").write_text("".join(lines))
            if any("HZ_HANG launched" in ln for ln in lines):
                time.sleep(0.3)
                nvml_now("torch")
                pyspy("torch", torch_p.pid)
                batch("torch", torch_p.pid)
                session("torch", torch_p.pid)
            else:
                log(f"torch never launched: {''.join(lines)[-800:]}")
    finally:
        kill(torch_p)
    hung("mbar-li", [str(BUILD / "hung-li"), "mbar"], session_too=False)
    hung("hoisted-li", [str(BUILD / "hung-li"), "hoisted"], session_too=False)
    r = subprocess.run(["dmesg"], capture_output=True, text=True)
    (RAW / "dmesg-xid-after.txt").write_text("\n".join(ln for ln in r.stdout.splitlines() if "Xid" in ln or "NVRM" in ln)[-5000:])
    (OUT / "timings.json").write_text(json.dumps(TIMINGS, indent=1))
    log("summary:")
    for t in TIMINGS:
        print(f"  {t['what']}: {t['seconds']}s {t.get('rc', t.get('error'))}")


if __name__ == "__main__":
    main()
