"""A fake command target: `fake_command.py MODE [ARG]` behaves as MODE says.

Every process it starts records its pid (fakelib.record_pid) before it does anything
else, and a hanging mode prints "ready" on stdout only once all its processes exist.
"""
import json
import os
import signal
import subprocess
import sys
import time

from fakelib import record_pid

HERE = os.path.dirname(os.path.abspath(__file__))
SLEEPER = [sys.executable, os.path.join(HERE, "sleeper.py")]


def ready() -> None:
    print("ready", flush=True)


def passes() -> int:
    params = json.loads(os.environ.get("HZ_PARAMS", "{}"))
    print("computing...")
    launches = {"launches": int(os.environ["HZ_LAUNCHES"])} if "HZ_LAUNCHES" in os.environ else {}
    print("HZ_RESULT " + json.dumps({"ok": True, "mismatched": 0, "params": params, **launches}))
    return 0


def busy_loop() -> int:
    ready()
    while True:
        pass


def block_with_child() -> int:
    """Blocks in wait() on a child that itself blocks (sleeps) forever."""
    child = subprocess.Popen(SLEEPER)
    record_pid(child.pid)
    ready()
    child.wait()
    return 0


def setsid_grandchild(clear_env: bool, keep_pipes: bool, linger_s: float) -> int:
    """Child starts a grandchild that setsid()s (leaves our group); the child exits after
    `linger_s`, so the grandchild is reparented to init; we block forever.

    `clear_env` drops the supervisor's HZ_SUPERVISED_* marker from the grandchild;
    `keep_pipes=False` points its stdio at /dev/null, as a daemon would.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("HZ_SUPERVISED_")}
    stdio = "None" if keep_pipes else "subprocess.DEVNULL"
    code = ("import subprocess, sys, time; "
            f"sys.path.insert(0, {HERE!r}); from fakelib import record_pid; record_pid(); "
            f"p = subprocess.Popen({SLEEPER!r}, start_new_session=True, "
            f"env={env if clear_env else None!r}, stdin={stdio}, stdout={stdio}, "
            f"stderr={stdio}); record_pid(p.pid); time.sleep({linger_s})")
    subprocess.run([sys.executable, "-c", code], check=True)
    ready()
    while True:
        time.sleep(3600)


def daemonize() -> int:
    """The escape nothing but a cgroup catches: fork, setsid, fork again, the middle process
    exits at once; the daemon closes every descriptor (our pipes too) and runs the sleeper
    with an empty environment (no marker). Then we block forever."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.closerange(0, 1024)
            os.open(os.devnull, os.O_RDWR)  # fds 0-2: nothing of ours
            os.dup(0), os.dup(0)
            os.execve(SLEEPER[0], SLEEPER + ["--record", os.environ.get("HZ_FAKE_PIDFILE", "")], {})
        os._exit(0)
    os.wait()
    ready()
    while True:
        time.sleep(3600)


def leftover() -> int:
    """Exits 0 at once, leaving a background process in its group."""
    record_pid(subprocess.Popen(SLEEPER).pid)
    print("HZ_RESULT {\"ok\": true}")
    return 0


def ignore_sigterm() -> int:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready()
    while True:
        time.sleep(3600)


def segfault() -> int:
    os.kill(os.getpid(), signal.SIGSEGV)
    return 0


def aborts() -> int:
    os.abort()


def cuda_fault() -> int:
    print("Traceback (most recent call last):\n  File \"demo.py\", line 3, in <module>\n"
          "    torch.cuda.synchronize()\nRuntimeError: CUDA error: an illegal memory access "
          "was encountered\nCUDA kernel errors might be asynchronously reported",
          file=sys.stderr)
    return 1


def wrong_result() -> int:
    print("HZ_RESULT " + json.dumps({"ok": False, "mismatched": 3, "max_rel_err": 0.51}))
    return 0


def exit_with(code: str) -> int:
    return int(code)


def raises(exc_name: str) -> int:
    raise getattr(__builtins__, exc_name, RuntimeError)(f"fake {exc_name}")


def chatty_fault() -> int:
    """A fault line early, then far more output than any tail keeps, then exit 1."""
    print("CUDA error: misaligned address", file=sys.stderr, flush=True)
    for i in range(20000):
        print(f"filler line {i} " + "x" * 40, file=sys.stderr)
    return 1


def progress_bar(what: str, code: str = "0") -> int:
    """A tqdm-style progress bar (carriage returns, no newline) in which `what` is printed
    past column 1,000 (a fault message, or a result line after a carriage return), then
    more than 64 KB of further output; exit `code`."""
    lines = {"fault": "RuntimeError: CUDA error: an illegal memory access was encountered",
             "result": 'HZ_RESULT {"ok": false, "mismatched": 2}'}
    bar = "".join(f"\r{i:3d}%|{'#' * (i // 10):10s}| {i}/100 [00:0{i % 10}<00:09, 99.9it/s]"
                  for i in range(100))
    sys.stderr.write(bar[:2000] + "\r" + lines[what] + bar)
    sys.stderr.write("\n" + "".join(f"epoch {i} loss 0.{i:04d}\n" for i in range(8000)))
    return int(code)


def floods(megabytes: str) -> int:
    """`megabytes` MB on stdout: one endless line with a fault message in its middle,
    then short lines; exit 0."""
    half = int(float(megabytes) * (1 << 20)) // 2
    chunk = b"." * (1 << 20)
    out = sys.stdout.buffer
    for _ in range(half // len(chunk) // 2):
        out.write(chunk)
    out.write(b" CUDA error: misaligned address ")
    for _ in range(half // len(chunk) // 2):
        out.write(chunk)
    row = b"".join(b"row %06d of the flood\n" % i for i in range(40000))
    for _ in range(half // len(row)):
        out.write(row)
    out.flush()
    return 0


def prints(text: str) -> int:
    print(text)
    return 0


def progresses(events: str, every_s: str, then: str = "block", how: str = "line") -> int:
    """`events` progress events `every_s` apart (HZ_PROGRESS lines on stderr, or touches of
    HZ_PROGRESS_FILE with `how` = file), then `then`: block forever (sleeping, no more
    progress) or exit 0."""
    for k in range(int(events)):
        if how == "file":
            with open(os.environ["HZ_PROGRESS_FILE"], "a") as f:
                f.write(f"step {k}\n")
        else:
            print(f"HZ_PROGRESS step {k} of {events}", file=sys.stderr, flush=True)
        time.sleep(float(every_s))
    if then == "block":
        ready()
        while True:
            time.sleep(3600)
    return 0


MODES = {
    "progress": progresses,
    "pass": passes, "busy": busy_loop, "block_with_child": block_with_child,
    # Each escape is found by a different mechanism of the watchdog (see its docstring):
    "setsid_grandchild": lambda: setsid_grandchild(False, False, 0.0),       # env marker
    "setsid_grandchild_noenv": lambda: setsid_grandchild(True, False, 1.0),  # psutil samples
    "setsid_grandchild_pipe": lambda: setsid_grandchild(True, True, 0.0),    # pipe holder
    "daemonize": daemonize,  # only a cgroup finds it
    "leftover": leftover, "ignore_sigterm": ignore_sigterm, "segfault": segfault,
    "abort": aborts, "cuda_fault": cuda_fault, "wrong_result": wrong_result,
    "exit": exit_with, "raise": raises, "chatty_fault": chatty_fault, "print": prints,
    "progress_bar": progress_bar, "flood": floods,
}

if __name__ == "__main__":
    record_pid()
    sys.exit(MODES[sys.argv[1]](*sys.argv[2:]))
