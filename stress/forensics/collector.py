"""The on-hang collector: where a hung program is stuck, on the device and on the host.

Registered with the watchdog (`install_hang_collector`, order 100: after the tripwire's
passive snapshots, because a debugger attach stops the process). More in docs/hang-forensics.md.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ..forensics.debugger import (DEBUGGERS, HOST_DEBUGGERS, AttachRefused, DebuggerGone,
                                               DebuggerSession, attach_refusal, find_debugger)
from ..forensics.device import (LINEINFO_HINT, POLL_KINDS, block_ranges, cuda_device_report,
                                             parse_block_ranges, rocgdb_device_report)
from ..forensics.host import (host_report, is_python_process, parse_gdb_backtraces,
                                           py_spy_dump, render_threads)
from ..forensics.policy import FULL, NONE, SUMMARY
from ..forensics.system import describe_system, system_report
from ..tripwire.analysis import NO_BREADCRUMBS
from ..tripwire.session import MARKER as TRIPWIRE_MARKER, ONE_READ, read_once_on_hang
from ..watchdog import find_marked

MARKER = "hz_forensics"           # identifies this collector's output inside evidence
ORDER = 100                       # after passive collectors (the tripwire reads first)
MAX_HOST_PROCESSES = 4            # processes of the run whose stacks are read
FINISH_RESERVE_S = 0.3            # kept for writing the artifacts
_GPU_DEVICES = ("/dev/nvidia", "/dev/kfd", "/dev/dri/renderD")
_MARK_PREFIX = "HZ_SUPERVISED_"


# -- which processes --------------------------------------------------------------------------
def run_processes(pid: int, pgid: int) -> list[int]:
    """The run's live processes: the child first, then its process group, by pid."""
    from ..proctree import scan_for

    found = scan_for(pgid) | ({pid} if Path(f"/proc/{pid}").exists() else set())
    return sorted(found, key=lambda p: (p != pid, p))


def uses_gpu(pid: int) -> str | None:
    """'nvidia' or 'amd' when `pid` holds a GPU device file open, else None."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            return "nvidia"
        if target.startswith(("/dev/kfd", "/dev/dri/renderD")):
            return "amd"
    return None


def _tool_env(ctx_env: dict[str, str]) -> dict[str, str]:
    """Our environment plus the run's supervision marker: the watchdog's kill finds a
    debugger or py-spy that outlived its step."""
    env = dict(os.environ)
    env.update({k: v for k, v in (ctx_env or {}).items() if k.startswith(_MARK_PREFIX)})
    return env


def _cwd_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


# -- steps -----------------------------------------------------------------------------------------
def _transcript(s: DebuggerSession) -> str:
    parts = [f"(debugger) {o.command}    # {o.seconds:.3f}s{'' if o.complete else ' INCOMPLETE'}\n{o.text}"
             for o in s.transcript]
    return "\n\n".join(parts + [f"note: {n}" for n in s.notes]) + "\n"


def device_step(pid: int, vendor: str, *, deadline: float, env: dict[str, str],
                want_host_stacks: bool, debuggers: tuple[str, ...] = DEBUGGERS,
                path: str | None = None) -> dict[str, Any]:
    """Attach the GPU debugger to `pid`; the device report (and host stacks when asked)."""
    names = ("cuda-gdb",) if vendor == "nvidia" else ("rocgdb",)
    exe = find_debugger([n for n in debuggers if n in names], path=path)
    if exe is None:
        return {"skipped": f"no {names[0]} on PATH: device state not read"}
    refusal = attach_refusal(pid)
    if refusal:
        return {"skipped": refusal}
    t0 = time.monotonic()
    out: dict[str, Any] = {"debugger": exe}
    try:
        s = DebuggerSession(exe, deadline=deadline, env=env)
    except (DebuggerGone, OSError) as e:
        return {**out, "error": f"{Path(exe).name} did not start: {e}", "seconds": round(time.monotonic() - t0, 3)}
    try:
        attach = s.attach(pid)
        out["attach_s"] = attach.seconds
        if want_host_stacks:  # host focus still: before any device focus switch
            bt = s.run("thread apply all bt", budget_s=max(0.5, (deadline - time.monotonic()) / 3))
            out["host"] = host_report(pid, parse_gdb_backtraces(bt.text), Path(exe).name)
        report = (cuda_device_report if vendor == "nvidia" else rocgdb_device_report)(s, cwd=_cwd_of(pid))
        out.update(report)
    except AttachRefused as e:
        out["skipped"] = str(e)
    except DebuggerGone as e:
        out["error"] = str(e)
    finally:
        s.close()
        out["transcript"] = _transcript(s)
        out["commands"] = [{"command": o.command, "seconds": o.seconds, "complete": o.complete, "text": o.text}
                           for o in s.transcript]
        out["notes"] = out.get("notes", []) + s.notes
        out["seconds"] = round(time.monotonic() - t0, 3)
    return out


def native_host_step(pid: int, *, deadline: float, env: dict[str, str], path: str | None = None) -> dict[str, Any]:
    """Native stacks of every thread of `pid` through gdb."""
    exe = find_debugger(HOST_DEBUGGERS, path=path)
    if exe is None:
        return {"skipped": "no debugger (gdb, cuda-gdb or rocgdb) on PATH: native stacks not read"}
    refusal = attach_refusal(pid)
    if refusal:
        return {"skipped": refusal}
    t0 = time.monotonic()
    out: dict[str, Any]
    try:
        s = DebuggerSession(exe, deadline=deadline, env=env, detach_reserve_s=min(1.0, max(0.2, (deadline - t0) / 4)))
    except (DebuggerGone, OSError) as e:
        return {"pid": pid, "error": f"{Path(exe).name} did not start: {e}", "seconds": round(time.monotonic() - t0, 3)}
    try:
        s.attach(pid)
        bt = s.run("thread apply all bt")
        out = host_report(pid, parse_gdb_backtraces(bt.text), Path(exe).name)
    except AttachRefused as e:
        out = {"pid": pid, "skipped": str(e)}
    except DebuggerGone as e:
        out = {"pid": pid, "error": str(e)}
    finally:
        s.close()
    out["raw"] = _transcript(s)
    out["notes"] = s.notes
    out["seconds"] = round(time.monotonic() - t0, 3)
    return out


def python_host_step(pid: int, *, deadline: float, env: dict[str, str], path: str | None = None) -> dict[str, Any]:
    """Python (and native) stacks of `pid` through py-spy."""
    refusal = attach_refusal(pid)
    if refusal:
        return {"pid": pid, "skipped": refusal}
    r = py_spy_dump(pid, deadline=deadline, env=env, path=path)
    if "threads" not in r:
        return {"pid": pid, **r}
    out = host_report(pid, r["threads"], "py-spy" + (" --native" if r["native"] else ""))
    out.update(raw=render_threads(r["threads"]) + "\npy-spy dump --json" + (" --native" if r["native"] else "")
               + ":\n" + r["raw"], seconds=r["seconds"])
    return out


# -- the collector -------------------------------------------------------------------------------
def collect(ctx: Any, *, path: str | None = None) -> dict[str, Any]:
    """Everything this module knows about a hung run (docs/hang-forensics.md, In the code); only the
    summary when the hang's plan says so."""
    t_start = time.monotonic()
    deadline = (ctx.deadline if getattr(ctx, "deadline", None) else t_start + 10.0) - FINISH_RESERVE_S
    env = _tool_env(ctx.env)
    pids = run_processes(ctx.pid, ctx.pgid)
    seconds: dict[str, float] = {}
    skipped: dict[str, str] = {}
    plan = getattr(ctx, "plan", None)
    result: dict[str, Any] = {MARKER: 1, "pid": ctx.pid, "processes": pids}

    vendors = {p: uses_gpu(p) for p in pids}
    gpu_pids = [p for p in pids if vendors[p]]
    python = {p for p in pids[:MAX_HOST_PROCESSES] if is_python_process(p)}
    hosts: dict[int, dict[str, Any]] = {}

    def host_steps(kind: str, chosen: list[int], step: Any) -> None:
        t = time.monotonic()
        for p in chosen:
            if deadline - time.monotonic() < 0.5:
                skipped[f"host {p}"] = "no time left in the hang budget"
                continue
            hosts[p] = step(p, deadline=deadline, env=env, path=path)
        if chosen:
            seconds[f"host_{kind}"] = round(time.monotonic() - t, 3)

    host_steps("python", sorted(python, key=pids.index), python_host_step)  # the summary: no attach
    if plan is not None and plan.level == SUMMARY:
        found = next((h.get("stuck_at") for h in hosts.values() if h.get("stuck_at")), None)
        if plan.is_new_location(found):
            plan.upgrade(found)
    if plan is not None and plan.level == SUMMARY:
        return _finish(ctx, result, hosts, {}, seconds,
                       {**skipped, "full collection": plan.why}, t_start)

    t = time.monotonic()
    result["system"] = system_report(ctx.started_at, set(pids), deadline=deadline)
    seconds["system"] = round(time.monotonic() - t, 3)

    device: dict[str, Any] = {}
    if not gpu_pids:
        skipped["device"] = "no process of the run holds a GPU open: nothing on a device to read"
    elif deadline - time.monotonic() < 1.0:
        skipped["device"] = "no time left in the hang budget for a debugger attach"
    else:
        g = gpu_pids[0]
        t = time.monotonic()
        device = device_step(g, vendors[g] or "nvidia", deadline=deadline, env=env,
                             want_host_stacks=g not in python, path=path)
        seconds["device"] = round(time.monotonic() - t, 3)
        device["pid"] = g
        if "host" in device:
            hosts[g] = device.pop("host")
        if "skipped" in device:
            skipped["device"] = device["skipped"]
        if len(gpu_pids) > 1:
            device.setdefault("notes", []).append(f"other GPU processes of the run not attached: {gpu_pids[1:]}")
    result["device"] = device

    host_steps("native", [p for p in pids[:MAX_HOST_PROCESSES] if p not in hosts], native_host_step)
    return _finish(ctx, result, hosts, device, seconds, skipped, t_start)


def _finish(ctx: Any, result: dict[str, Any], hosts: dict[int, dict[str, Any]], device: dict[str, Any],
            seconds: dict[str, float], skipped: dict[str, str], t_start: float) -> dict[str, Any]:
    """The sentence, the tripwire side by side, the artifacts; what the evidence keeps. A
    full collection tells the policy where the item's hang is located."""
    plan = getattr(ctx, "plan", None)
    for p, h in hosts.items():
        if "skipped" in h:
            skipped[f"host {p}"] = h["skipped"]
    result.setdefault("system", {})
    result["device"] = device
    result["host"] = {str(p): h for p, h in hosts.items()}
    result["skipped"] = skipped
    result["seconds"] = seconds
    result["level"] = plan.level if plan is not None else FULL
    if plan is not None:
        result["plan"] = plan.to_json()
    if getattr(ctx, "last_progress", ""):
        result["last_progress"] = ctx.last_progress
    tripwire = find_marked(getattr(ctx, "collected", None) or {}, TRIPWIRE_MARKER)
    result["sentence"], result["stuck_at"] = summarize(result, tripwire)
    if result["level"] != FULL and not result["stuck_at"] and not any(h.get("sentence") for h in hosts.values()):
        # a summary of a native program, or no collection, read nothing: the reason stays as
        # the watchdog said it (it has the stall's place), and hang.md leads with `summarize`'s
        result["headline"], result["sentence"] = result["sentence"], ""
    if tripwire:
        result["tripwire"] = {"sentence": tripwire.get("sentence"), "counts": tripwire.get("counts"),
                              "when": tripwire.get("when"), "agreement": agreement(tripwire, result)}
    if plan is not None and plan.policy is not None and result["level"] == FULL:
        host_stuck = [str(h["stuck_at"]) for h in hosts.values() if h.get("stuck_at")]
        plan.policy.learn(plan.key, [*result["stuck_at"], *host_stuck])
    result["seconds"]["total"] = round(time.monotonic() - t_start, 3)  # all but writing the files
    result["artifacts"] = write_artifacts(ctx.artifact_dir, result, target=getattr(ctx, "target", ""))
    return _slim(result)


def no_collection(ctx: Any, plan: Any) -> dict[str, Any]:
    """What a hang that the policy gave no forensics keeps: why, and a hang.md saying it, led
    by the best place read without a collector: the tripwire file's diagnosis (one read,
    `read_once_on_hang`, which the target keeps instead of its post-mortem read), else the
    run's last progress event (the stall verdict's place)."""
    t_start = time.monotonic()
    ctx.plan = plan  # where `_finish` reads it (the policy put it there too)
    tripwire = read_once_on_hang(ctx)
    if tripwire is not None:
        ctx.collected["read_once_on_hang"] = tripwire
    return _finish(ctx, {MARKER: 1, "pid": ctx.pid, "processes": [ctx.pid]}, {}, {}, {},
                   {"forensics": plan.why}, t_start)


def hang_forensics(ctx: Any) -> dict[str, Any]:
    """The watchdog collector (`ctx`: a `hazards.engine.watchdog.HangContext`)."""
    return collect(ctx)


def install_hang_collector() -> None:
    """Register `hang_forensics` with the watchdog, after the passive collectors (idempotent)."""
    from ..watchdog import register_on_hang

    register_on_hang(hang_forensics, order=ORDER)


def uninstall_hang_collector() -> None:
    from ..watchdog import unregister_on_hang

    unregister_on_hang(hang_forensics)


# -- words -------------------------------------------------------------------------------------
def summarize(result: dict[str, Any], tripwire: dict[str, Any] | None = None) -> tuple[str, list[str]]:
    """(one sentence, stuck locations) for the run: device locations first, then the host.
    When neither located it: the `tripwire`'s sentence (its snapshot's summary) if it has one,
    else the run's last progress event (`last_progress`, where the progress stream last said it
    was), each named as such and followed by what was not read."""
    dev = result.get("device") or {}
    parts: list[str] = []
    stuck: list[str] = []
    if dev.get("sentences"):
        n_locs = len(dev.get("locations", []))
        located, absent = dev["sentences"][:n_locs], dev["sentences"][n_locs:]
        parts += located[:3] + absent  # blocks that never became resident explain a hang on their own
        if len(located) > 3:
            parts.append(f"{len(located) - 3} more location{'s' if len(located) > 4 else ''}")
        stuck += dev.get("stuck_at", [])
    elif dev.get("kernels") == [] and "error" not in dev:
        parts.append("no kernel active on the GPU")
    hosts = result.get("host") or {}
    first = next((h for h in hosts.values() if h.get("sentence")), None)
    if first is not None:
        parts.append(f"host: {first['sentence']}")
        if not stuck and first.get("stuck_at"):
            stuck.append(str(first["stuck_at"]))
    if not parts:
        reasons = "; ".join(f"{k}: {v}" for k, v in (result.get("skipped") or {}).items())
        errors = [v.get("error") for v in [dev, *hosts.values()] if isinstance(v, dict) and v.get("error")]
        if none := examined_none(dev):
            errors.insert(0, f"device: the debugger {none}")
        not_read = "; ".join(e for e in errors if e) or reasons or "nothing read"
        # a tripwire file with no breadcrumbs says nothing of where the run is: the stall's last
        # progress place does, so it comes first; "no breadcrumbs" still heads the tripwire's section
        read_breadcrumbs = tripwire and tripwire.get("sentence") and tripwire.get("verdict") != NO_BREADCRUMBS
        if read_breadcrumbs:
            return f"tripwire: {tripwire['sentence']} (not read: {not_read})", []
        if result.get("last_progress"):
            return f"{LAST_PROGRESS}: {result['last_progress']} (not read: {not_read})", []
        if tripwire and tripwire.get("sentence"):
            return f"tripwire: {tripwire['sentence']} (not read: {not_read})", []
        return UNKNOWN + not_read, []
    return "; ".join(parts), stuck


UNKNOWN = "where it hangs is unknown: "
LAST_PROGRESS = "the last progress event before the hang (not a debugger)"


def debugger_did_not_look(result: dict[str, Any]) -> str | None:
    """Why no debugger read the device (a summary, a skipped attach, a failed one), or None when
    one did: only then may hang.md put its findings, or its finding nothing, beside the tripwire's."""
    dev = result.get("device") or {}
    if dev.get("locations"):
        return None
    if none := examined_none(dev):  # blocks it found absent are in the device section; no warp was examined
        return f"it {none}"
    if dev.get("sentences"):
        return None
    return _device_skipped(result) or (f"it failed: {dev['error']}" if dev.get("error") else None)


def _device_skipped(result: dict[str, Any]) -> str | None:
    """Why the device was not read: its collector skipped it, the collection skipped it, or
    the forensics level (summary, none) does not read it; None when it was to be read."""
    return ((result.get("device") or {}).get("skipped") or (result.get("skipped") or {}).get("device")
            or (f"not read ({result['level']})" if result.get("level", FULL) != FULL else None))


def examined_none(device: dict[str, Any]) -> str | None:
    """Why a debugger that listed the warps located none of them: the budget ran out before it
    examined one PC (cuda_device_report's pcs_examined; a location cap needs locations)."""
    total = device.get("pcs_total")
    if total and device.get("pcs_examined") == 0:
        return f"examined none of the {total} PCs it found: no time left in the hang budget"
    return None


def _examined_part(device: dict[str, Any]) -> str:
    """'' when the debugger examined every PC it found, else how many it examined."""
    total, seen = device.get("pcs_total"), device.get("pcs_examined")
    if not total or seen is None or seen >= total:
        return ""
    return f"{seen} of the {total} PCs it found (no time or location cap left for the rest)"


def agreement(tripwire: dict[str, Any], result: dict[str, Any]) -> str:
    """Do the tripwire and the debugger (`result`: the collection's, its device section, level
    and skips) tell the same story? Not compared when the debugger did not look
    (`debugger_did_not_look`). Else group by group, assuming one worker per block (the
    `deadlock` family's layout): the tripwire's main wait against the debugger's largest poll
    location, its stragglers against the blocks polling elsewhere, its never-started workers
    against the blocks that are not on the GPU."""
    if not_looked := debugger_did_not_look(result):
        return f"not compared: the debugger did not look ({not_looked})"
    device = result.get("device") or {}
    counts = tripwire.get("counts") or {}
    polls = [loc for loc in device.get("locations", []) if loc.get("kind") in POLL_KINDS]
    partial = _examined_part(device)
    if not counts or not polls:
        return "not compared: " + ("the tripwire saw no worker" if not counts
                                   else "the debugger found no warp in a poll loop"
                                   + (f" in the {partial}" if partial else ""))
    stragglers = set(tripwire.get("stragglers") or [])
    never = counts.get("never_started", len(tripwire.get("never_started") or []))
    main_tw = counts.get("waiting", 0) + counts.get("running", 0) - len(stragglers)
    main = max(polls, key=lambda loc: loc.get("block_count", 0))
    elsewhere: dict[int, str] = {}
    for loc in polls:
        if loc is not main:
            elsewhere.update({b: loc.get("where", "?") for b in parse_block_ranges(loc.get("blocks_all", ""))})
    absent = sum(len(parse_block_ranges(r)) for r in (device.get("absent_blocks") or {}).values())
    checks = [(main.get("block_count") == main_tw,
               f"the tripwire's main wait ({main_tw} workers) {{}} the debugger's {main.get('block_count')} blocks "
               f"polling at {main.get('where')}")]
    if stragglers or elsewhere:
        where = ", ".join(sorted(set(elsewhere.values())))
        checks.append((stragglers == set(elsewhere),
                       f"its stragglers ({block_ranges(sorted(stragglers)) or 'none'}) {{}} the blocks polling "
                       f"elsewhere ({block_ranges(sorted(elsewhere)) or 'none'}{', at ' + where if where else ''})"))
    if never or absent:
        checks.append((never == absent, f"its {never} never-started workers {{}} the {absent} blocks not on the GPU"))
    verdict = "agree" if all(ok for ok, _ in checks) else "differ"
    if partial and verdict == "differ":  # the blocks at the PCs it did not examine are in no count
        verdict = f"not compared in full (the debugger examined {partial})"
    return f"{verdict} (one worker per block): " + "; ".join(text.format("=" if ok else "≠") for ok, text in checks)


def _slim(result: dict[str, Any]) -> dict[str, Any]:
    """What goes into the run's evidence (the store): no raw transcripts, those are files."""
    out = dict(result)
    dev = dict(out.get("device") or {})
    dev.pop("transcript", None)
    dev.pop("commands", None)
    dev.pop("kernels", None)
    dev["locations"] = [{k: v for k, v in loc.items() if k not in ("window",)} for loc in dev.get("locations", [])]
    out["device"] = dev
    out["host"] = {p: {k: v for k, v in h.items() if k not in ("raw", "threads")} for p, h in out["host"].items()}
    return out


def hang_markdown(result: dict[str, Any], target: str = "") -> str:
    """hang.md: the sentence, then device, host, system, tripwire and collector times."""
    tw = result.get("tripwire")
    headline = result["sentence"] or result.get("headline") or (
        f"tripwire: {tw['sentence']}" if tw and tw.get("sentence") else "where it hangs was not read (see Forensics)")
    lines = [f"# Hang{': ' + target if target else ''} (pid {result.get('pid')})", "", headline, ""]
    plan = result.get("plan") or {}
    lines += ["## Forensics", f"{result.get('level', FULL)}: {plan.get('why') or 'every collector'}"
              + (f" (budget {plan['budget_s']:.1f} s)" if plan.get("budget_s") else "")]
    if result.get("last_progress"):
        lines.append(f"last progress event before the hang: {result['last_progress']} (from the run's progress "
                     "events, not a debugger)")
    lines.append("")
    dev = result.get("device") or {}
    lines.append(f"## Device{' (' + Path(dev['debugger']).name + ')' if dev.get('debugger') else ''}")
    skipped_device = _device_skipped(result)
    not_looked = debugger_did_not_look(result)
    if skipped_device:
        lines.append(f"skipped: {skipped_device}")
    if dev.get("error"):
        lines.append(f"error: {dev['error']}")
    for k in dev.get("kernels", []):
        lines.append(f"- kernel {k['id']}: {k['invocation']} grid {tuple(k['grid'])} block {tuple(k['block'])} "
                     f"({k['status']})")
    for s in dev.get("sentences", []):
        lines.append(f"- {s}")
    for loc in dev.get("locations", [])[:4]:
        if loc.get("window"):
            lines += ["", f"SASS around {loc['where']} ({loc.get('function')}+0x{loc.get('offset') or 0:x}):", "```"]
            lines += loc["window"]
            lines.append("```")
    lines += [f"note: {n}" for n in dev.get("notes", [])]
    lines += ["", "## Host"]
    for p, h in (result.get("host") or {}).items():
        what = h.get("sentence") or h.get("skipped") or h.get("error") or "nothing read"
        lines.append(f"- pid {p} ({h.get('tool', '?')}): {what}")
    if not result.get("host"):
        lines.append("no host stacks read")
    lines += ["", "## System"] + (describe_system(result["system"]) if result.get("system")
                                  else [f"not read ({result.get('level', FULL)})"])
    if tw and not_looked:  # a debugger column would read as "found nothing": there is nothing to compare
        lines += ["", "## Tripwire" + (" (one read of its file before the kill, no collector)"
                                       if tw.get("when") == ONE_READ else ""),
                  "", tw.get("sentence") or "—", "", tw.get("agreement", "")]
    elif tw:
        lines += ["", "## Tripwire and debugger, side by side", "", "| tripwire | debugger |", "|---|---|",
                  f"| {tw.get('sentence') or '—'} | {'; '.join(dev.get('sentences', [])[:3]) or '—'} |", "",
                  tw.get("agreement", "")]
    lines += ["", "## Collectors"]
    lines.append(", ".join(f"{k} {v:.2f} s" for k, v in (result.get("seconds") or {}).items()))
    for k, v in (result.get("skipped") or {}).items():
        lines.append(f"- skipped {k}: {v}")
    return "\n".join(lines) + "\n"


def write_artifacts(dest: Path | None, result: dict[str, Any], target: str = "") -> list[str]:
    """hang.md, hang.json, hang-device.txt and hang-host-<pid>.txt in `dest` (None: nothing)."""
    if dest is None:
        return []
    dest = Path(dest)
    try:
        dest.mkdir(parents=True, exist_ok=True)
        written = []
        dev = result.get("device") or {}
        if dev.get("transcript"):
            (dest / "hang-device.txt").write_text(dev["transcript"])
            written.append(str(dest / "hang-device.txt"))
        for p, h in (result.get("host") or {}).items():
            if h.get("raw"):
                f = dest / f"hang-host-{p}.txt"
                f.write_text(h["raw"] if isinstance(h["raw"], str) else json.dumps(h["raw"]))
                written.append(str(f))
        md = dest / "hang.md"
        md.write_text(hang_markdown(result, target))
        js = dest / "hang.json"
        whole = {k: v for k, v in result.items() if k != "artifacts"}
        whole["device"] = {k: v for k, v in dev.items() if k != "transcript"}  # that one is hang-device.txt
        js.write_text(json.dumps(whole, indent=1, default=str))
        return written + [str(md), str(js)]
    except OSError as e:
        result.setdefault("skipped", {})["artifacts"] = f"could not write to {dest}: {e.strerror or e}"
        return []


# -- readers for the rest of the engine -----------------------------------------------------------
def find_forensics_evidence(evidence: Any) -> dict[str, Any] | None:
    """This collector's output wherever it sits inside a run's evidence."""
    return find_marked(evidence, MARKER)


def hang_reason(reason: str, evidence: dict[str, Any]) -> str:
    """A hang's reason with the forensics sentence appended ('timed out after 5s: …'), unless
    that sentence is only the last progress place which the (stall's) reason already names."""
    found = find_forensics_evidence(evidence)
    if not found or not found.get("sentence"):
        return reason
    place = found.get("last_progress")
    if place and place in reason and found["sentence"].startswith(LAST_PROGRESS):
        return reason  # nothing was read, and the stall's reason already names its last place
    return f"{reason}: {found['sentence']}"


def stuck_locations(evidence: dict[str, Any]) -> list[str]:
    """The sorted, de-duplicated stuck locations a hang's signature groups by."""
    found = find_forensics_evidence(evidence)
    return sorted(set(found.get("stuck_at") or [])) if found else []


__all__ = ["MARKER", "collect", "hang_forensics", "install_hang_collector", "uninstall_hang_collector",
           "find_forensics_evidence", "hang_reason", "stuck_locations", "hang_markdown", "LINEINFO_HINT"]
