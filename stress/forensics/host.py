"""Where the host threads of a hung process wait: py-spy for Python, gdb for native code.

Python processes: `py-spy dump --native --json` (Python frames interleaved with the C/C++
frames below them), with a plain `--json` dump as the fallback when native unwinding
fails. The summary names the main thread's innermost Python frame (where it waits) and
the innermost frame of the program's own code (the line that called it), e.g.
More in docs/hang-forensics.md.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sysconfig
import time
from pathlib import Path
from typing import Any

from ..proctree import run_in_group

PY_SPY = "py-spy"
_PYTHON_EXE = re.compile(r"^python[\d.]*[dmu]*$")
_LIBPYTHON = re.compile(r"/libpython\d[\d.]*\w*\.so")


@dataclasses.dataclass
class Frame:
    """One stack frame: function, source file and line when known, library for native code."""

    function: str
    file: str | None = None
    line: int | None = None
    library: str | None = None
    python: bool = False

    def where(self) -> str:
        if self.file and self.line:
            return f"{self.function} ({_short_path(self.file)}:{self.line})"
        if self.library:
            return f"{self.function} ({Path(self.library).name})"
        return self.function


@dataclasses.dataclass
class HostThread:
    tid: int
    name: str
    frames: list[Frame]  # innermost first


def _short_path(path: str) -> str:
    """Paths under site-packages/stdlib shortened to the package-relative part."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    stdlib = sysconfig.get_paths().get("stdlib")
    if stdlib and path.startswith(stdlib + "/"):
        return path[len(stdlib) + 1:]
    return Path(path).name if os.path.isabs(path) else path


def is_library_path(path: str | None) -> bool:
    """True for files of installed packages and the standard library (not the program's own)."""
    if not path:
        return True
    if "site-packages/" in path or "dist-packages/" in path or path.startswith("<"):
        return True
    return bool(re.search(r"/lib/python\d[\d.]*/", path))


def is_python_process(pid: int) -> bool:
    """A CPython interpreter: its executable is python*, or it maps libpython."""
    try:
        if _PYTHON_EXE.match(Path(os.readlink(f"/proc/{pid}/exe")).name):
            return True
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            return bool(_LIBPYTHON.search(f.read().decode("utf-8", "replace")))
    except OSError:
        return False


# -- py-spy -----------------------------------------------------------------------------------
def parse_py_spy_json(text: str) -> list[HostThread]:
    """Threads of `py-spy dump --json` (with or without --native)."""
    data = json.loads(text)
    threads = []
    for t in data if isinstance(data, list) else []:
        frames = []
        for f in t.get("frames", []):
            fname = f.get("filename") or ""
            native = not fname.endswith(".py") and not fname.startswith("<")
            frames.append(Frame(f.get("name") or "?", None if native else fname,
                                f.get("line") if not native else None,
                                (f.get("short_filename") or fname) if native else None, python=not native))
        threads.append(HostThread(int(t.get("os_thread_id") or t.get("thread_id") or 0),
                                  t.get("thread_name") or "", frames))
    return threads


def py_spy_dump(pid: int, *, deadline: float, env: dict[str, str] | None = None,
                path: str | None = None) -> dict[str, Any]:
    """`py-spy dump` of `pid` within `deadline` (monotonic). Returns {threads, raw, seconds,
    native} or {"skipped": reason} / {"error": reason}."""
    exe = shutil.which(PY_SPY, path=path)
    if exe is None:
        return {"skipped": "py-spy is not installed (pip install 'gpu-hazards[forensics]')"}
    t0 = time.monotonic()
    attempts = (["--native", "--json"], ["--json"])
    last_err = ""
    for extra in attempts:
        left = deadline - time.monotonic()
        if left < 0.3:
            return {"error": f"no time left for py-spy ({last_err or 'budget spent'})"}
        try:
            r = run_in_group([exe, "dump", "--pid", str(pid), *extra], left, text=True, env=env)
        except subprocess.TimeoutExpired:
            return {"error": f"py-spy did not answer within {left:.1f}s"}
        except OSError as e:
            return {"skipped": f"py-spy not runnable: {e.strerror or e}"}
        if r.returncode == 0:
            try:
                threads = parse_py_spy_json(r.stdout)
            except ValueError as e:
                last_err = f"unreadable py-spy output: {e}"
                continue
            return {"tool": "py-spy", "native": "--native" in extra, "threads": threads, "raw": r.stdout,
                    "seconds": round(time.monotonic() - t0, 3)}
        last_err = _first_error(r.stderr or r.stdout)
    return {"error": f"py-spy failed: {last_err}"}


def _first_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if re.search(r"error|permission|denied|not permitted", ln, re.IGNORECASE):
            return ln[:200]
    return (lines[0] if lines else "no output")[:200]


# -- gdb backtraces ----------------------------------------------------------------------------
_BT_THREAD = re.compile(r'^Thread \d+ \(.*?LWP (\d+)\)(?: "([^"]*)")?.*\):\s*$')
_BT_FRAME = re.compile(r"^#(\d+)\s+(?:0x[0-9a-fA-F]+ in )?(.+?)(?: \(.*\))?(?: at (\S+):(\d+)| from (\S+))?\s*$")


def parse_gdb_backtraces(text: str) -> list[HostThread]:
    """Threads of `thread apply all bt` (gdb / cuda-gdb / rocgdb host threads)."""
    threads: list[HostThread] = []
    cur: HostThread | None = None
    pending = ""
    for raw in text.splitlines():
        t = _BT_THREAD.match(raw)
        if t:
            cur = HostThread(int(t.group(1)), t.group(2) or "", [])
            threads.append(cur)
            pending = ""
            continue
        if cur is None:
            continue
        if raw.startswith("#"):
            pending = raw.strip()
        elif pending and raw.startswith(" "):  # a frame wrapped onto the next line
            pending += " " + raw.strip()
        else:
            continue
        m = _BT_FRAME.match(pending)
        if m is None:
            continue
        idx = int(m.group(1))
        frame = Frame(_strip_params(m.group(2)), m.group(3), int(m.group(4)) if m.group(4) else None, m.group(5))
        if idx < len(cur.frames):
            cur.frames[idx] = frame
        else:
            cur.frames.append(frame)
    return threads


def _strip_params(func: str) -> str:
    """`pysleep (timeout=<optimized out>)` -> `pysleep`."""
    depth = 0
    for i, ch in enumerate(func):
        if ch == "(" and depth == 0 and i > 0 and func[i - 1] == " ":
            return func[:i].strip()
        depth += ch == "<"
        depth -= ch == ">"
    return func.strip()


# -- summary -----------------------------------------------------------------------------------
def main_thread(threads: list[HostThread], pid: int) -> HostThread | None:
    for t in threads:
        if t.tid == pid or t.name == "MainThread":
            return t
    return threads[0] if threads else None


# Waiting for another thread of the same process: joining it, or a Future it will complete
# (Python frames, by file and function) ...
_JOIN_PY = {"threading.py": re.compile(r"(^|\.)(join|_wait_for_tstate_lock)$"),
            "concurrent/futures/_base.py": re.compile(r"(^|\.)(result|wait|as_completed)$")}
# ... pthread_join / std::thread::join (native frames) ...
_JOIN_NATIVE = re.compile(r"pthread_join|pthread_clockjoin|pthread_timedjoin|std::thread::join")
# ... or a mutex, which only another thread can be holding (a Python lock taken in the
# program's own code; a pthread mutex). A lock taken inside threading.py is a condition's
# waiter (Event.wait, Condition.wait): that waits for anyone, not a sibling.
_LOCK_NATIVE = re.compile(r"^(lock_PyThread_acquire_lock|rlock_acquire|PyThread_acquire_lock_timed|acquire_timed"
                          r"|_PyMutex_LockTimed|__lll_lock_wait|_*pthread_mutex_(timed)?lock)")


def waits_for_sibling(t: HostThread) -> str | None:
    """The frame where `t` waits for another thread of its own process (a join, a Future,
    a lock a sibling holds), as words; None when it waits on something else."""
    py = [f for f in t.frames if f.python]
    for f in py:  # the library frames above the program's own code
        if not is_library_path(f.file):
            break
        short = _short_path(f.file or "")
        if any(short == file and pattern.search(f.function) for file, pattern in _JOIN_PY.items()):
            return f.where()
    native_top = t.frames[:t.frames.index(py[0])] if py else t.frames
    for f in native_top:
        if _JOIN_NATIVE.search(f.function):
            return f.where()
        if f.file and not is_system_source(f.file):
            break  # the program's own native code: a wait below it is not a join
    if (not py or not is_library_path(py[0].file)) and any(_LOCK_NATIVE.match(f.function) for f in native_top):
        return next(f.where() for f in native_top if _LOCK_NATIVE.match(f.function))
    return None


def _own_frame(t: HostThread) -> Frame | None:
    """The innermost frame of the program's own code (Python first, then native with
    source outside system libraries)."""
    own = next((f for f in t.frames if f.python and not is_library_path(f.file)), None)
    return own or next((f for f in t.frames if not f.python and f.file and f.line
                        and not is_system_source(f.file)), None)


def stuck_thread(threads: list[HostThread], pid: int) -> tuple[HostThread | None, HostThread | None]:
    """(the thread the hang is about, the main thread when it only waits for that one).

    The main thread, unless it waits for another thread of its own (`waits_for_sibling`):
    then the first thread that does not, preferring one that is in the program's own code
    (a pool's idle workers and a runtime's helper threads are not); if every thread waits
    for another, the main thread (a cycle: no one thread to blame)."""
    main = main_thread(threads, pid)
    if main is None or waits_for_sibling(main) is None:
        return main, None
    others = [t for t in threads if t is not main and t.frames and waits_for_sibling(t) is None]
    if not others:
        return main, None
    chosen = next((t for t in others if _own_frame(t) is not None), others[0])
    return chosen, main


def is_system_source(path: str | None) -> bool:
    """Source paths of distribution-built libraries (glibc's `./nptl/…`, `../sysdeps/…`,
    `/build/…`, `/usr/…`): frames there are where a wait happens, not the program's line."""
    if not path:
        return True
    return (path.startswith(("./", "../", "/build/", "/usr/", "/opt/conda/", "/croot/"))
            or "/sysdeps/" in path or "/nptl/" in path)


_SYSTEM_LIB = re.compile(r"^(libc\.so|libc-|libpthread|ld-linux|\[vdso\]|libstdc\+\+|libgcc_s)")
_RUNTIME_SYMBOL = re.compile(r"^(cuda|cu[A-Z]|libcudart|hip|__|_?Py[A-Z_])")


def _named(frames: list[Frame]) -> Frame | None:
    """The innermost frame with a symbol, preferring one outside libc and the loader (the
    API the thread waits in, e.g. cuCtxSynchronize_v2, rather than the syscall under it)."""
    named = [f for f in frames if not f.function.startswith("0x") and f.function != "??"]
    return next((f for f in named if not _SYSTEM_LIB.match(Path(f.library or "").name)), None) or \
        (named[0] if named else None)


def _thread_name(t: HostThread, pid: int | None) -> str:
    return "main thread" if (pid is not None and t.tid == pid and t.name != "MainThread") else \
        (t.name or f"thread {t.tid}")


def summarize_thread(t: HostThread, pid: int | None = None) -> tuple[str, str | None]:
    """(sentence, stuck location) for one thread: where it waits and which own line called it."""
    name = _thread_name(t, pid)
    if not t.frames:
        return f"{name}: no frames", None
    py = [f for f in t.frames if f.python]
    if py:
        inner = py[0]
        own = next((f for f in py if not is_library_path(f.file)), None)
        text = f"{name} waits in {inner.where()}"
        if own is not None and own is not inner:
            text += f" called from {own.where()}"
        native = _named([f for f in t.frames[:t.frames.index(inner)] if not f.python])
        if native is not None:
            text += f", native: {native.where()}"
        stuck = own or inner
        return text, f"{_short_path(stuck.file or '')}:{stuck.line}" if stuck.file else stuck.function
    inner = _named(t.frames) or t.frames[0]
    own = next((f for f in t.frames if f.file and f.line and not is_system_source(f.file)), None)
    if own is None:  # no debug info: the first named frame in the program itself (no library)
        own = next((f for f in t.frames if f.library is None and f.function not in ("??", "")
                    and not _RUNTIME_SYMBOL.match(f.function)), None)
    text = f"{name} waits in {inner.where()}"
    if own is not None and own is not inner:
        text += f" called from {own.where()}"
    if own is not None and own.file:
        return text, f"{Path(own.file).name}:{own.line}"
    return text, (own or inner).function


def render_threads(threads: list[HostThread]) -> str:
    """Every thread's frames as text, innermost first (the hang-host-<pid>.txt artifact)."""
    out = []
    for t in threads:
        out.append(f"Thread {t.tid} \"{t.name}\":")
        out += [f"    {f.where()}" for f in t.frames]
        out.append("")
    return "\n".join(out)


def host_report(pid: int, threads: list[HostThread], tool: str) -> dict[str, Any]:
    """The JSON a host collector stores: every thread's frames and the summary of the stuck
    thread (`stuck_thread`: the main one unless it only waits for another of its own)."""
    chosen, waiting = stuck_thread(threads, pid)
    sentence, stuck = summarize_thread(chosen, pid) if chosen else (f"no threads read from pid {pid}", None)
    if waiting is not None:
        own = _own_frame(waiting)
        sentence += (f"; {_thread_name(waiting, pid)} waits for another thread in {waits_for_sibling(waiting)}"
                     + (f" called from {own.where()}" if own is not None else ""))
    return {"pid": pid, "tool": tool, "sentence": sentence, "stuck_at": stuck,
            "stuck_thread": chosen.name or str(chosen.tid) if chosen else None,
            "threads": [{"tid": t.tid, "name": t.name, "frames": [dataclasses.asdict(f) for f in t.frames[:64]]}
                        for t in threads[:64]]}
