"""Where every resident warp of a hung GPU process is stuck, from a cuda-gdb attach.

The debugger session (`debugger.DebuggerSession`) lists the active kernels (`info cuda
kernels`) and the active threads coalesced by PC (`info cuda threads`): each row is a
range of threads in (block, thread) order that share one PC, with the source file and
line when the code was built with `-lineinfo`. Rows are grouped by (kernel, PC) into
locations. For each location (the largest first, up to `MAX_LOCATIONS`) the session
focuses one of its threads and reads `info line *$pc` (function and offset, line) and a
window of SASS around the PC; the window's loop around the PC says what kind of wait it
is (`classify_wait`). More in docs/hang-forensics.md.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from ..forensics.debugger import DebuggerGone, DebuggerSession

MAX_LOCATIONS = 16          # distinct stuck locations reported (the largest PC groups first)
MAX_KERNELS = 8             # active kernels whose threads are listed
MAX_LOOP_INSNS = 1024       # instructions read to see the whole of a long loop through a PC
WINDOW_BEFORE = 0x100       # bytes of SASS before the PC (16 instructions on sm_90)
WINDOW_AFTER_INSNS = 16
LINEINFO_HINT = "build with -lineinfo to get source lines"

# -- parsing ---------------------------------------------------------------------------
_TRIPLE = r"\((\d+),(\d+),(\d+)\)"
_THREAD_ROW = re.compile(
    rf"^\s*\*?\s*{_TRIPLE}\s+{_TRIPLE}\s+{_TRIPLE}\s+{_TRIPLE}\s+(\d+)\s+(0x[0-9a-fA-F]+)(.*)$")
_KERNEL_HEADER = re.compile(r"^\s*Kernel\s+(\d+)\s*$")
_KERNEL_ROW = re.compile(
    rf"^\s*\*?\s*(\d+)\s+(\S+)\s+(\d+)\s+(\d+)\s+(\w+)\s+(0x[0-9a-fA-F]+)\s+{_TRIPLE}\s+{_TRIPLE}\s+(.*?)\s*$")
_INSN = re.compile(r"^\s*(=>)?\s*(0x[0-9a-fA-F]+)(?:\s+<(.*)\+(\d+)>)?:\s*(.*?)\s*$")
_LINE_OF = re.compile(r'Line (\d+) of "([^"]+)"')
_SYM_OFF = re.compile(r"<(.+?)\+(\d+)>")  # the first <symbol+offset>: where the line starts
_HEX = re.compile(r"0x[0-9a-fA-F]+")


@dataclasses.dataclass
class Kernel:
    """One row of `info cuda kernels`."""

    id: int
    device: int
    grid_id: int
    status: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    invocation: str

    @property
    def function(self) -> str:
        """The kernel's name without its argument list."""
        return _strip_args(self.invocation)


@dataclasses.dataclass
class ThreadRange:
    """One row of `info cuda threads`: threads from (block_from, thread_from) to
    (block_to, thread_to) in launch order, all at `pc`."""

    kernel: int
    block_from: tuple[int, int, int]
    thread_from: tuple[int, int, int]
    block_to: tuple[int, int, int]
    thread_to: tuple[int, int, int]
    count: int
    pc: int
    file: str | None
    line: int | None


def _strip_args(invocation: str) -> str:
    """A demangled function without its parameter list and return type:
    `void (anonymous namespace)::epoch_kernel<0>(unsigned int*, int)` ->
    `(anonymous namespace)::epoch_kernel<0>`; `spin_on_flag()` -> `spin_on_flag`."""
    name = invocation.strip()
    if name.endswith(")"):  # cut the trailing (...) group, matched from the end
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i].rstrip() if i > 0 else name
                break
    depth = 0
    last_space = -1
    for i, ch in enumerate(name):  # a return type is separated by a space outside () and <>
        depth += 1 if ch in "(<" else -1 if ch in ")>" else 0
        if ch == " " and depth == 0:
            last_space = i
    return name[last_space + 1:] if last_space >= 0 else name


def _triple(m: re.Match[str], first: int) -> tuple[int, int, int]:
    return int(m.group(first)), int(m.group(first + 1)), int(m.group(first + 2))


def parse_kernels(text: str) -> list[Kernel]:
    """Rows of `info cuda kernels` (header and blank lines skipped)."""
    out = []
    for line in text.splitlines():
        m = _KERNEL_ROW.match(line)
        if m:
            out.append(Kernel(int(m.group(1)), int(m.group(3)), int(m.group(4)), m.group(5),
                              _triple(m, 7), _triple(m, 10), m.group(13)))
    return out


def parse_threads(text: str) -> list[ThreadRange]:
    """Rows of `info cuda threads`, each tagged with the kernel of its "Kernel N" header."""
    out = []
    kernel = -1
    for line in text.splitlines():
        k = _KERNEL_HEADER.match(line)
        if k:
            kernel = int(k.group(1))
            continue
        m = _THREAD_ROW.match(line)
        if m:
            # the tail is "FILE LINE" with -lineinfo, and a bare "0" without
            rest = m.group(15).split()
            line_no = int(rest[-1]) if rest and rest[-1].isdigit() else 0
            file = " ".join(rest[:-1]) if len(rest) > 1 else None
            out.append(ThreadRange(kernel, _triple(m, 1), _triple(m, 4), _triple(m, 7), _triple(m, 10),
                                   int(m.group(13)), int(m.group(14), 16), file if line_no else None,
                                   line_no or None))
    return out


@dataclasses.dataclass
class Insn:
    """One disassembled instruction (`x/i` line)."""

    addr: int
    text: str
    at_pc: bool
    function: str | None = None
    offset: int | None = None

    @property
    def opcode(self) -> str:
        """The opcode with modifiers, without a predicate guard (`LDG.E.STRONG.SYS`)."""
        body = self.text.split(";")[0].strip()
        if body.startswith("@"):
            body = body.partition(" ")[2].strip()
        return body.partition(" ")[0]

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0].upper()

    def branch_target(self, function_start: int | None) -> int | None:
        """The absolute target of a branch (relative targets made absolute), else None."""
        if self.base not in ("BRA", "JMP", "S_BRANCH", "S_CBRANCH_SCC0", "S_CBRANCH_SCC1",
                             "S_CBRANCH_VCCZ", "S_CBRANCH_VCCNZ", "S_CBRANCH_EXECZ", "S_CBRANCH_EXECNZ"):
            return None
        found = _HEX.findall(self.text.split(";")[0].partition(self.opcode)[2])
        if not found:
            return None
        target = int(found[0], 16)
        if function_start is not None and target < function_start:
            target += function_start  # a function-relative target
        return target


def parse_insns(text: str) -> list[Insn]:
    """Lines of `x/Ni` output."""
    out = []
    for line in text.splitlines():
        m = _INSN.match(line)
        if m and m.group(5):
            out.append(Insn(int(m.group(2), 16), m.group(5), bool(m.group(1)), m.group(3),
                            int(m.group(4)) if m.group(4) else None))
    return out


def parse_line_info(text: str) -> dict[str, Any]:
    """`info line *$pc` -> {file, line, function, offset} (what is known)."""
    out: dict[str, Any] = {}
    m = _LINE_OF.search(text)
    if m:
        out["line"], out["file"] = int(m.group(1)), m.group(2)
    s = _SYM_OFF.search(text)
    if s:
        out["function"], out["offset"] = s.group(1), int(s.group(2))
    return out


# -- what kind of wait -----------------------------------------------------------------
_LOADS = ("LDG", "LD", "LDS", "LDSM", "ATOMG", "ATOM", "ATOMS", "LDL", "SULD")
WAIT_WORDS = {
    "mbarrier": "wait on an mbarrier (try-wait loop)",
    "barrier": "wait at a block barrier (bar.sync / __syncthreads)",
    "warpsync": "wait for diverged lanes of their own warp (warp sync)",
    "sleep_spin": "spin on a load with sleep backoff",
    "sleep": "sleep (nanosleep)",
    "spin": "spin on a load",
    "loop_no_load": "loop forever without loading anything (a flag read hoisted out of the loop?)",
    "running": "run (no wait recognised at this PC)",
    "unread_loop": "run inside a loop too long to read",
    "unknown": "are stopped where the code could not be read",
}
POLL_KINDS = ("spin", "sleep_spin", "mbarrier", "loop_no_load")


_CONTROL = ("BRA", "JMP", "BRX", "JMX", "EXIT", "RET", "CALL", "WARPSYNC", "BSYNC", "BSSY", "BPT")
BARRIER_LOOKBACK = 64  # instructions scanned back from the PC for a deferred-blocking BAR


def enclosing_loop(window: list[Insn], pc: int, function_start: int | None) -> tuple[list[Insn], Insn | None, bool]:
    """The innermost loop through `pc` (instructions from a backward branch's target to the
    branch), that branch, and whether the whole loop is in `window`; ([], None, True)
    when no branch of the window loops back over the PC."""
    best: Insn | None = None
    best_target = 0
    for ins in window:
        target = ins.branch_target(function_start)
        if target is None or not (target <= pc <= ins.addr):
            continue
        if best is None or ins.addr - target < best.addr - best_target:
            best, best_target = ins, target
    if best is None:
        return [], None, True
    complete = bool(window) and min(i.addr for i in window) <= best_target
    return [i for i in window if best_target <= i.addr <= best.addr], best, complete


def blocking_barrier(window: list[Insn], pc: int, function_start: int | None) -> Insn | None:
    """The BAR a warp stopped at `pc` is still held by, if any.

    A warp blocked at a block barrier does not report the BAR's address: after a plain
    `BAR.SYNC` its PC is the next instruction, and after `BAR.SYNC.DEFER_BLOCKING` it runs
    on through independent instructions and stalls further down (both measured on the
    H200: the PC at the loop's back branch nine instructions later). So: the nearest BAR
    before the PC in the same straight-line code, with no branch, warp sync or branch
    target in between.
    """
    targets = {t for i in window if (t := i.branch_target(function_start)) is not None}
    by_addr = sorted((i for i in window if i.addr < pc), key=lambda i: -i.addr)
    after = pc
    for i in by_addr[:BARRIER_LOOKBACK]:
        if after in targets or i.base in _CONTROL:
            return None  # another path leads here: the BAR before it may not have run
        if i.base == "BAR" and ".ARV" not in i.opcode.upper():
            return i
        after = i.addr
    return None


def classify_wait(window: list[Insn], pc: int, function_start: int | None = None) -> tuple[str, int]:
    """A symbolic guess of the kind of wait at `pc`, and the address that names it.

    From the SASS (or AMDGCN) around the PC: a warp held at a block barrier (the BAR at
    or before the PC, see `blocking_barrier`) is named by the BAR; lanes waiting at
    WARPSYNC for the rest of their warp are a warp sync. Otherwise the innermost loop
    through the PC decides: an mbarrier try-wait, a sleep, a load (a poll) or nothing
    loaded at all (a hoisted read: the loop can never see a change); a loop is named by
    its backward branch, which is where the loop's condition is, whatever instruction each
    warp happened to be stopped at. A loop whose start is not in `window` is
    "unread_loop" (read more code and ask again).
    """
    by_addr = {i.addr: i for i in window}
    at = by_addr.get(pc)
    if at is None:
        return "unknown", pc
    if at.base == "BAR" or at.opcode.upper().startswith("S_BARRIER"):
        return "barrier", pc
    if at.base in ("WARPSYNC", "BSYNC"):
        return "warpsync", pc
    bar = blocking_barrier(window, pc, function_start)
    if bar is not None:
        return "barrier", bar.addr
    loop, branch, complete = enclosing_loop(window, pc, function_start)
    if branch is None:
        if at.base == "NANOSLEEP" or at.opcode.upper().startswith("S_SLEEP"):
            return "sleep", pc
        return "running", pc
    if not complete:
        return "unread_loop", branch.addr
    ops = [i.opcode.upper() for i in loop]
    bases = {i.base for i in loop}
    if any(o.startswith("SYNCS.PHASECHK") or ("SYNCS" in o and "WAIT" in o) for o in ops):
        return "mbarrier", branch.addr
    loads = bases & set(_LOADS) or {o for o in ops if re.match(r"(GLOBAL|FLAT|BUFFER|S)_LOAD|DS_READ", o)}
    if "NANOSLEEP" in bases or any(o.startswith("S_SLEEP") for o in ops):
        return ("sleep_spin" if loads else "sleep"), branch.addr
    return ("spin" if loads else "loop_no_load"), branch.addr


# -- locations ---------------------------------------------------------------------------
@dataclasses.dataclass
class PcGroup:
    """Threads of one kernel stopped at one PC (rows of `info cuda threads`)."""

    kernel: int
    pc: int
    threads: int = 0
    warps: set[tuple[int, int]] = dataclasses.field(default_factory=set)
    blocks: set[int] = dataclasses.field(default_factory=set)
    focus_block: tuple[int, int, int] = (0, 0, 0)
    focus_thread: tuple[int, int, int] = (0, 0, 0)
    file: str | None = None
    line: int | None = None


@dataclasses.dataclass
class Location:
    """Where a set of warps is stuck: one wait (a loop, a barrier) named by its anchor
    instruction, with every PC the debugger saw inside it."""

    kernel: int
    anchor: int
    kind: str
    pcs: list[int] = dataclasses.field(default_factory=list)
    threads: int = 0
    warps: set[tuple[int, int]] = dataclasses.field(default_factory=set)
    blocks: set[int] = dataclasses.field(default_factory=set)
    function: str | None = None
    offset: int | None = None
    file: str | None = None
    line: int | None = None
    source: str | None = None
    instruction: str | None = None
    window: list[str] = dataclasses.field(default_factory=list)

    @property
    def where(self) -> str:
        """`file.cu:24` with line info, else `function+0x60` (the stuck location's name)."""
        if self.file and self.line:
            return f"{Path(self.file).name}:{self.line}"
        if self.function is not None and self.offset is not None:
            return f"{_strip_args(self.function)}+0x{self.offset:x}"
        return f"pc 0x{self.anchor:x}"

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["warps"] = len(self.warps)
        d["blocks"] = block_ranges(sorted(self.blocks))
        d["blocks_all"] = block_ranges(sorted(self.blocks), limit=None)
        d["block_count"] = len(self.blocks)
        d["where"] = self.where
        d["kind_words"] = WAIT_WORDS.get(self.kind, self.kind)
        d["anchor"] = hex(self.anchor)
        d["pcs"] = [hex(p) for p in self.pcs]
        return d


def _linear(idx: tuple[int, int, int], dims: tuple[int, int, int]) -> int:
    return idx[0] + dims[0] * (idx[1] + dims[1] * idx[2])


def group_by_pc(rows: list[ThreadRange], kernels: list[Kernel]) -> list[PcGroup]:
    """Rows grouped by (kernel, PC), with thread, warp and block counts; largest first."""
    by_id = {k.id: k for k in kernels}
    groups: dict[tuple[int, int], PcGroup] = {}
    for r in rows:
        k = by_id.get(r.kernel)
        grid = k.grid if k else (1 << 30, 1, 1)
        block = k.block if k else (1024, 1, 1)
        per_block = block[0] * block[1] * block[2]
        g = groups.get((r.kernel, r.pc))
        if g is None:
            g = groups[(r.kernel, r.pc)] = PcGroup(r.kernel, r.pc, focus_block=r.block_from,
                                                   focus_thread=r.thread_from, file=r.file, line=r.line)
        g.threads += r.count
        first = _linear(r.block_from, grid) * per_block + _linear(r.thread_from, block)
        last = _linear(r.block_to, grid) * per_block + _linear(r.thread_to, block)
        if last < first:  # a row whose end we cannot place: trust its count
            last = first + r.count - 1
        b0, b1 = first // per_block, last // per_block
        for b in range(b0, b1 + 1):
            g.blocks.add(b)
            lo = first - b * per_block if b == b0 else 0
            hi = last - b * per_block if b == b1 else per_block - 1
            for w in range(lo // 32, hi // 32 + 1):
                g.warps.add((b, w))
    return sorted(groups.values(), key=lambda g: (-g.threads, g.kernel, g.pc))


def block_ranges(ids: list[int], limit: int | None = 6) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0–2, 5, 7–8' (first `limit` runs, then '…'; None: all)."""
    runs: list[tuple[int, int]] = []
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    shown = runs if limit is None else runs[:limit]
    parts = [f"{a}" if a == b else f"{a}–{b}" for a, b in shown]
    return ", ".join(parts) + (", …" if len(shown) < len(runs) else "")


def parse_block_ranges(text: str) -> set[int]:
    """The inverse of `block_ranges(ids, limit=None)`: '0–2, 5' -> {0, 1, 2, 5}."""
    out: set[int] = set()
    for part in text.split(","):
        a, _, b = part.strip().partition("–")
        if a.isdigit():
            out.update(range(int(a), int(b or a) + 1))
    return out


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _who(blocks: list[int]) -> str:
    return f"block {blocks[0]}" if len(blocks) == 1 else f"blocks {block_ranges(blocks)}"


def describe(loc: Location, kernel: Kernel | None, multi_kernel: bool) -> str:
    """One sentence for one location."""
    counts = f"({_plural(loc.threads, 'thread')} in {_plural(len(loc.warps), 'warp')})"
    name = kernel.function if kernel else (_strip_args(loc.function) if loc.function else f"kernel {loc.kernel}")
    of = f" of {name}" + (f" [kernel {loc.kernel}]" if multi_kernel else "")
    src = f" `{loc.source.strip()}`" if loc.source else ""
    return f"{_who(sorted(loc.blocks))} {counts}{of} {WAIT_WORDS.get(loc.kind, loc.kind)} at {loc.where}{src}"


def absent_blocks(kernel: Kernel, seen: set[int]) -> list[int]:
    """Blocks of the grid that no listed thread belongs to (finished, or never resident)."""
    total = kernel.grid[0] * kernel.grid[1] * kernel.grid[2]
    missing = [b for b in range(total) if b not in seen] if total <= 1 << 20 else []
    return [] if len(missing) == total else missing


def describe_absent(kernel: Kernel, missing: list[int]) -> str:
    total = kernel.grid[0] * kernel.grid[1] * kernel.grid[2]
    return (f"{_who(missing)} ({len(missing)} of {total}) of {kernel.function} are not on the GPU: finished, "
            f"or never resident (a grid larger than what fits at once waits for them forever)")


# -- the session ---------------------------------------------------------------------------
def _read_source(file: str | None, line: int | None, cwd: str | None) -> str | None:
    if not file or not line:
        return None
    for candidate in (Path(file), Path(cwd or ".") / file):
        try:
            lines = candidate.read_text(errors="replace").splitlines()
        except OSError:
            continue
        if 0 < line <= len(lines):
            return lines[line - 1].strip()[:160]
    return None


class _Code:
    """Instructions and source lines read so far in one session, by address."""

    def __init__(self, s: DebuggerSession) -> None:
        self.s = s
        self.insns: dict[int, Insn] = {}
        self.lines: dict[int, dict[str, Any]] = {}

    def window(self, pc: int) -> tuple[list[Insn], int | None]:
        """Instructions around `pc` (read once per neighbourhood) and the function's start."""
        if pc not in self.insns:
            head = parse_insns(self.s.run(f"x/1i 0x{pc:x}", budget_s=5.0).text)
            offset = head[0].offset if head and head[0].offset is not None else 0
            before = min(WINDOW_BEFORE, offset)
            self.read(pc - before, before // 16 + WINDOW_AFTER_INSNS)
        at = self.insns.get(pc)
        start = pc - at.offset if at is not None and at.offset is not None else None
        near = [i for a, i in sorted(self.insns.items()) if pc - 2 * WINDOW_BEFORE <= a <= pc + 2 * WINDOW_BEFORE]
        return near, start

    def read(self, addr: int, n: int) -> None:
        """Disassemble `n` instructions from `addr` into the cache."""
        for i in parse_insns(self.s.run(f"x/{n}i 0x{addr:x}", budget_s=5.0).text):
            self.insns.setdefault(i.addr, i)

    def line(self, addr: int) -> dict[str, Any]:
        if addr not in self.lines:
            self.lines[addr] = parse_line_info(self.s.run(f"info line *0x{addr:x}", budget_s=5.0).text)
        return self.lines[addr]


def _coord(c: tuple[int, int, int]) -> str:
    """cuda-gdb's focus coordinates: `5` for (5,0,0) (the form measured on the H200), else `(x,y,z)`."""
    return str(c[0]) if c[1] == c[2] == 0 else f"({c[0]},{c[1]},{c[2]})"


def _locate(code: _Code, g: PcGroup) -> tuple[str, int, list[Insn]]:
    """(kind, anchor, window) for one PC group, reading code only when not read before."""
    if g.pc not in code.insns:  # focus a thread of this group: its kernel's code is then readable
        code.s.run(f"cuda kernel {g.kernel} block {_coord(g.focus_block)} thread {_coord(g.focus_thread)}",
                   budget_s=5.0)
    window, start = code.window(g.pc)
    kind, anchor = classify_wait(window, g.pc, start)
    if kind == "unread_loop":  # a long loop: read from its start up to what we have, once
        branch = code.insns[anchor]
        target = branch.branch_target(start) or anchor
        first = min(i.addr for i in window)
        n = min(MAX_LOOP_INSNS, (first - target) // 16 + 1)
        code.read(target, n)
        window = [i for a, i in sorted(code.insns.items()) if target <= a <= g.pc + 2 * WINDOW_BEFORE]
        kind, anchor = classify_wait(window, g.pc, start)
        if kind == "unread_loop":
            kind, anchor = "running", g.pc  # longer than we read: no claim about the wait
    return kind, anchor, window


def cuda_device_report(s: DebuggerSession, *, cwd: str | None = None) -> dict[str, Any]:
    """Kernels, locations and one sentence per location, from an attached cuda-gdb session.

    Raises DebuggerGone if the session dies; what was learned before is in `s.transcript`.
    """
    kernels = parse_kernels(s.run("info cuda kernels", budget_s=8.0).text)
    rows: list[ThreadRange] = []
    for k in kernels[:MAX_KERNELS]:
        rows += parse_threads(s.run(f"info cuda threads kernel {k.id}", budget_s=15.0).text)
    groups = group_by_pc(rows, kernels)
    code = _Code(s)
    locs: dict[tuple[int, int], Location] = {}
    notes: list[str] = []
    unexamined = 0
    for g in groups:
        if len(locs) >= MAX_LOCATIONS or s.remaining() < s.detach_reserve_s + 0.5:
            unexamined += 1
            continue
        kind, anchor, window = _locate(code, g)
        loc = locs.get((g.kernel, anchor))
        if loc is None:
            loc = locs[(g.kernel, anchor)] = Location(g.kernel, anchor, kind)
            info = code.line(anchor)
            loc.function, loc.offset = info.get("function"), info.get("offset")
            loc.file, loc.line = info.get("file"), info.get("line")
            at = code.insns.get(anchor)
            loc.instruction = at.text if at else None
            loc.source = _read_source(loc.file, loc.line, cwd)
            loc.window = [f"{'=>' if i.addr == anchor else '  '} 0x{i.addr:x}"
                          f"{' <+' + str(i.offset) + '>' if i.offset is not None else ''}: {i.text}" for i in window]
        loc.pcs.append(g.pc)
        loc.threads += g.threads
        loc.warps |= g.warps
        loc.blocks |= g.blocks
    if unexamined:
        notes.append(f"{unexamined} of {len(groups)} PCs not examined (budget or location cap)")
    # the waits that cause a hang (polls) before those they cause (barriers, warp syncs)
    ordered = sorted(locs.values(), key=lambda loc: (loc.kind not in POLL_KINDS, -len(loc.warps), -loc.threads,
                                                     loc.kernel, loc.anchor))
    by_id = {k.id: k for k in kernels}
    multi = len({loc.kernel for loc in ordered}) > 1
    sentences = [describe(loc, by_id.get(loc.kernel), multi) for loc in ordered]
    absent: dict[str, str] = {}
    for k in kernels[:MAX_KERNELS]:
        seen = set().union(*[g.blocks for g in groups if g.kernel == k.id]) if groups else set()
        missing = absent_blocks(k, seen)
        if missing:
            sentences.append(describe_absent(k, missing))
            absent[str(k.id)] = block_ranges(missing, limit=None)
    if ordered and not any(loc.line for loc in ordered):
        notes.append(f"no source lines in the device code: {LINEINFO_HINT}")
    if not kernels:
        notes.append("no active kernel: the process is not stuck on the GPU")
    return {"debugger": "cuda-gdb", "kernels": [dataclasses.asdict(k) for k in kernels],
            "locations": [loc.to_json() for loc in ordered], "pcs_total": len(groups),
            "pcs_examined": len(groups) - unexamined, "absent_blocks": absent,
            "sentences": sentences, "notes": notes,
            "stuck_at": sorted({f"{loc.where} ({loc.kind})" for loc in ordered})}


# rocgdb: waves are threads; "info threads" rows look like
#   5    AMDGPU Wave 1:1:1:1 (0,0,0)/0 "spin"  spin_kernel (...) at spin.cpp:13
_WAVE = re.compile(r'^\s*\*?\s*(\d+)\s+AMDGPU Wave\s+([\d:]+)\s+\((\d+),(\d+),(\d+)\)/(\d+).*?\s(?:0x[0-9a-f]+ in )?'
                   r'([\w:<>~]+)\s*\(.*?\)(?: at ([^:\s]+):(\d+))?\s*$')


def rocgdb_device_report(s: DebuggerSession, *, cwd: str | None = None) -> dict[str, Any]:
    """Waves grouped by function and line, from an attached rocgdb session (untested on AMD)."""
    s.run("info agents", budget_s=5.0)
    s.run("info dispatches", budget_s=5.0)
    groups: dict[tuple[str, str | None, int | None], dict[str, Any]] = {}
    for line in s.run("info threads", budget_s=10.0).text.splitlines():
        m = _WAVE.match(line)
        if not m:
            continue
        key = (m.group(7), m.group(8), int(m.group(9)) if m.group(9) else None)
        g = groups.setdefault(key, {"waves": 0, "thread": int(m.group(1)), "blocks": set()})
        g["waves"] += 1
        g["blocks"].add((int(m.group(3)), int(m.group(4)), int(m.group(5))))
    sentences, stuck, locations = [], [], []
    for (func, file, line), g in sorted(groups.items(), key=lambda kv: -kv[1]["waves"])[:MAX_LOCATIONS]:
        kind = "unknown"
        if s.remaining() > s.detach_reserve_s + 0.5:
            s.run(f"thread {g['thread']}", budget_s=3.0)
            window = parse_insns(s.run(f"x/{WINDOW_AFTER_INSNS}i $pc", budget_s=3.0).text)
            if window:
                kind = classify_wait(window, window[0].addr)[0]
        where = f"{Path(file).name}:{line}" if file and line else func
        src = _read_source(file, line, cwd)
        sentences.append(f"{_plural(len(g['blocks']), 'workgroup')} ({_plural(g['waves'], 'wave')}) of {func} "
                         f"{WAIT_WORDS.get(kind, kind)} at {where}" + (f" `{src}`" if src else ""))
        stuck.append(f"{where} ({kind})")
        locations.append({"function": func, "file": file, "line": line, "waves": g["waves"],
                          "workgroups": len(g["blocks"]), "kind": kind, "where": where})
    return {"debugger": "rocgdb", "locations": locations, "locations_total": len(groups),
            "sentences": sentences, "stuck_at": stuck,
            "notes": ["rocgdb support is written from its documentation and untested on AMD hardware"]
            + ([] if groups else ["no AMDGPU wave is active: the process is not stuck on the GPU"])}
