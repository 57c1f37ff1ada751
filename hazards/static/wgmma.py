"""wgmma pipelines in SASS: which groups may be in flight where, and what touches their operands.

`wgmma.mma_async` (SASS `HGMMA`/`IGMMA`/`QGMMA`/`BGMMA`) reads its shared-memory operands and
its registers asynchronously. A batch of them ends with one that carries `gsb0` (the PTX
`wgmma.commit_group`), and `WARPGROUP.DEPBAR.LE gsb0, N` (`wgmma.wait_group N`) waits until at
most N committed groups are pending. More in docs/static-checks.md.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Iterable

from hazards.static import checks
from hazards.static.findings import Finding
from hazards.static.sass_listing import SassFunction, SassInstr, parse_sass

GROUP_CAP = 8  # groups tracked per path; older ones merge (depths beyond this saturate)
_WGMMA_OPS = ("HGMMA", "IGMMA", "QGMMA", "BGMMA")
_SHAPE_RE = re.compile(r"\.64x(\d+)x\d+\.(\w+)")
_REG_RE = re.compile(r"\bR(\d+)\b")
_PTXAS_EARLY_RE = re.compile(
    r"\(C75(1[345])\) Potential Performance Loss: wgmma\.mma_async instructions are serialized "
    r"due to (non wgmma instructions (?:defining|reading) [^']*?) between start and end of the "
    r"pipeline stage in the function '([^']+)'")


@dataclasses.dataclass(frozen=True)
class Flight:
    """Groups that may be pending on entry to an instruction: committed ones (oldest first)
    and the uncommitted batch (wgmma without `gsb0` yet), each as the registers it owns."""

    groups: tuple[frozenset[str], ...] = ()
    open: frozenset[str] | None = None

    @property
    def depth(self) -> int:
        """How many groups may be pending (the open batch counts as one)."""
        return len(self.groups) + (self.open is not None)

    @property
    def reading_depth(self) -> int:
        """How many pending groups read operands: an empty commit (the predicated-off
        `HGMMA.64x8x16 RZ, gdesc[URZ], RZ, !UPT, gsb0` ptxas emits when a `commit_group`
        follows a loop of wgmmas, after closing a group at every trip's end) reads nothing,
        so a wait that leaves only it pending has retired every real wgmma."""
        return sum(1 for g in self.groups if g) + bool(self.open)

    def registers(self) -> frozenset[str]:
        regs = frozenset().union(*self.groups) if self.groups else frozenset()
        return regs | (self.open or frozenset())

    def join(self, other: "Flight") -> "Flight":
        """Both paths at once: groups aligned from the newest, registers united."""
        n = max(len(self.groups), len(other.groups))
        a = (frozenset(),) * (n - len(self.groups)) + self.groups
        b = (frozenset(),) * (n - len(other.groups)) + other.groups
        opened = None if self.open is None and other.open is None else (self.open or frozenset()) | (other.open or frozenset())
        return Flight(tuple(x | y for x, y in zip(a, b)), opened)


def is_wgmma(ins: SassInstr) -> bool:
    return ins.base in _WGMMA_OPS


def is_smem_refill(ins: SassInstr, store_refills: bool = False) -> bool:
    """A bulk/tensor copy that writes shared memory (global -> shared); with
    `store_refills`, also a thread's shared-memory store (`STS`)."""
    return ((ins.base == "UBLKCP" and ".S.G" in ins.opcode) or ins.base == "UTMALDG"
            or (store_refills and ins.base == "STS"))


def _register_span(first: str, count: int) -> set[str]:
    m = _REG_RE.fullmatch(first)
    return {f"R{int(m.group(1)) + i}" for i in range(count)} if m else set()


def wgmma_registers(ins: SassInstr) -> frozenset[str]:
    """The accumulator registers (and register-A operands) of one wgmma instruction."""
    m = _SHAPE_RE.search(ins.opcode)
    n = int(m.group(1)) if m else 8
    per_reg = 2 if m and m.group(2) in ("F16",) else 1  # f16 accumulators pack two per register
    regs = _register_span(ins.operands[0], n // 2 // per_reg) if ins.operands else set()
    if len(ins.operands) > 1 and _REG_RE.fullmatch(ins.operands[1]):
        regs |= _register_span(ins.operands[1], 4)  # A from registers: four 32-bit registers
    return frozenset(regs)


def _depbar_level(ins: SassInstr) -> int | None:
    if not (ins.base == "WARPGROUP" and ".DEPBAR" in ins.opcode):
        return None
    try:
        return int(ins.operands[-1], 0)
    except (ValueError, IndexError):
        return 0


def step(state: Flight, ins: SassInstr) -> Flight:
    """The state after `ins`."""
    if is_wgmma(ins):
        batch = (state.open or frozenset()) | wgmma_registers(ins)
        if "gsb0" not in ins.operands:
            return Flight(state.groups, batch)
        groups = state.groups + (batch,)
        if len(groups) > GROUP_CAP:
            groups = (groups[0] | groups[1],) + groups[2:]
        return Flight(groups, None)
    level = _depbar_level(ins)
    if level is not None:
        return Flight(state.groups[max(0, len(state.groups) - level):], state.open)
    return state


def in_flight(func: SassFunction) -> list[Flight | None]:
    """The state on entry to every instruction (None: unreachable). The flow crosses calls
    into the kernel's out-of-line functions and back (`SassFunction.across_calls`, context
    free: a callee's state joins every caller's); one nothing calls starts with nothing in
    flight."""
    states: list[Flight | None] = [None] * len(func.instrs)
    if not func.instrs:
        return states
    called = {func.call_target(k) for k in range(len(func.instrs))}
    work = [0, *(at for at in func.routines if at not in called)]
    for root in work:
        states[root] = Flight()
    while work:
        i = work.pop()
        after = step(states[i], func.instrs[i])  # type: ignore[arg-type]
        for s, _ in func.across_calls(i):
            old = states[s]
            new = after if old is None else old.join(after)
            if new != old:
                states[s] = new
                work.append(s)
    return states


def _touched(ins: SassInstr) -> set[str]:
    """Registers an instruction reads or writes (vector widths of stores/loads expanded)."""
    regs: set[str] = set()
    width = 4 if ".128" in ins.opcode else 2 if ".64" in ins.opcode else 1
    for k, op in enumerate(ins.operands):
        if op.startswith(("[", "desc[", "gdesc[")) or "[" in op:
            regs |= {f"R{r}" for r in _REG_RE.findall(op)}  # an address: its base register
            continue
        for r in _REG_RE.findall(op):
            regs |= _register_span(f"R{r}", width if k in (0, len(ins.operands) - 1) else 1)
    return regs


def _last_depbar(func: SassFunction, i: int) -> SassInstr | None:
    for k in range(i - 1, -1, -1):
        if _depbar_level(func.instrs[k]) is not None:
            return func.instrs[k]
    return None


def check_function(func: SassFunction, path: str, banks: int | None = None,
                   store_refills: bool = False) -> list[Finding]:
    """The wgmma checks for one function; `banks` = operand buffers in its refill ring;
    `store_refills`: the ring is (also) refilled by the threads' `STS`."""
    if not any(is_wgmma(ins) for ins in func.instrs):
        return []
    states = in_flight(func)
    refills = [(i, s.reading_depth) for i, s in enumerate(states)
               if s is not None and is_smem_refill(func.instrs[i], store_refills)]
    out: list[Finding] = []
    hot = [(i, d) for i, d in refills if banks is not None and d >= banks]
    if hot:
        i, d = max(hot, key=lambda x: x[1])
        ins, bar = func.instrs[i], _last_depbar(func, i)
        after = f"after `{bar.text}`" if bar else "with no WARPGROUP.DEPBAR before it"
        out.append(checks.WGMMA_REFILL_IN_FLIGHT.finding(
            path, ins.line,
            f"{func.name}: `{ins.opcode}` at /*{ins.addr:04x}*/ refills shared memory with up to {d} "
            f"wgmma group(s) in flight ({after}); a ring of {banks} operand buffer(s) leaves the "
            f"refilled buffer's last reader among them: the refill can overwrite operands the "
            f"tensor core is still reading ({len(hot)} refill instruction(s) like this)",
            ins.text))
    elif refills:
        deepest = max(d for _, d in refills)
        ring = f"with {banks} operand buffer(s): safe" if banks is not None else (
            f"safe only if the ring has more than {deepest} operand buffers")
        i = next(i for i, d in refills if d == deepest)
        out.append(checks.WGMMA_REFILL_DEPTH.finding(
            path, func.instrs[i].line,
            f"{func.name}: {len(refills)} shared-memory refill instruction(s), at most {deepest} "
            f"wgmma group(s) in flight at any ({ring})", func.instrs[i].text))
    out += _register_hazards(func, states, path)
    out += _unfenced_stores(func, path, store_refills)
    return out


def _unfenced_stores(func: SassFunction, path: str, store_refills: bool) -> list[Finding]:
    """[wgmma-proxy-fence]: `STS` from which a wgmma is reachable without passing a
    `FENCE.VIEW.ASYNC` (the SASS of `fence.proxy.async`): the store is a generic-proxy write,
    the wgmma's operand read an async-proxy one, and only the proxy fence orders the two."""
    ins = func.instrs
    preds: dict[int, list[int]] = {}  # across calls: a store before a CALL reaches the callee's wgmma
    for i in range(len(ins)):
        for s, _ in func.across_calls(i):
            preds.setdefault(s, []).append(i)
    # every instruction from which a wgmma is reachable on a path with no proxy fence
    unfenced = {i for i, x in enumerate(ins) if is_wgmma(x)}
    todo = list(unfenced)
    while todo:
        for p in preds.get(todo.pop(), ()):
            if p not in unfenced and not ins[p].opcode.startswith("FENCE.VIEW.ASYNC"):
                unfenced.add(p)
                todo.append(p)
    hits = [x for i, x in enumerate(ins) if x.base == "STS" and any(j in unfenced for j, _ in func.across_calls(i))]
    if not hits:
        return []
    sts = hits[0]
    return [checks.WGMMA_PROXY_FENCE.finding(
        path, sts.line,
        f"{func.name}: `{sts.opcode}` at /*{sts.addr:04x}*/ reaches a wgmma with no FENCE.VIEW.ASYNC "
        f"(fence.proxy.async) on the way ({len(hits)} store(s) like this)"
        + ("" if store_refills else ": a hazard if the wgmma reads what was stored"),
        sts.text, severity=None if store_refills else "info")]


def _register_hazards(func: SassFunction, states: list[Flight | None], path: str) -> list[Finding]:
    hits = []
    for i, s in enumerate(states):
        ins = func.instrs[i]
        if s is None or not s.depth or is_wgmma(ins):
            continue
        clash = _touched(ins) & s.registers()
        if clash:
            hits.append((ins, sorted(clash, key=lambda r: int(r[1:]))))
    if not hits:
        return []
    ins, regs = hits[0]
    return [checks.WGMMA_REGISTER_IN_FLIGHT.finding(
        path, ins.line,
        f"{func.name}: `{ins.opcode}` at /*{ins.addr:04x}*/ touches {', '.join(regs[:4])} of a wgmma "
        f"that may still be in flight (no WARPGROUP.DEPBAR retiring it on some path; "
        f"{len(hits)} instruction(s) like this)", ins.text)]


def check_sass(text: str, path: str, banks: int | None = None,
               functions: Iterable[str] | None = None, store_refills: bool = False) -> list[Finding]:
    """The wgmma checks over a listing (only the functions whose names contain one of
    `functions`, when given); `banks` and `store_refills` as in `check_function`."""
    wanted = tuple(functions or ())
    out: list[Finding] = []
    for func in parse_sass(text):
        if wanted and not any(w in func.name for w in wanted):
            continue
        out += check_function(func, path, banks, store_refills)
    return out


def check_ptxas_log(log: str, path: str, functions: Iterable[str] | None = None) -> list[Finding]:
    """[wgmma-early-access] for every function ptxas serialized because the PTX touches the
    registers of an in-flight wgmma (C7513 input registers, C7514 reading / C7515 defining
    accumulators)."""
    wanted = tuple(functions or ())
    out = []
    for m in _PTXAS_EARLY_RE.finditer(log):
        code, what, func = m.group(1), " ".join(m.group(2).split()), m.group(3)
        if wanted and not any(w in func for w in wanted):
            continue
        out.append(checks.WGMMA_EARLY_ACCESS.finding(
            path, 0,
            f"{func}: the PTX has {what} inside a wgmma pipeline stage (undefined: the registers "
            f"of an in-flight wgmma); ptxas kept it correct by serializing every wgmma of the "
            f"function (C75{code})"))
    return out
