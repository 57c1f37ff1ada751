"""NVIDIA checks on SASS (nvdisasm/cuobjdump output) and on ptxas' own diagnostics.

- [spin-no-load] a loop reachable from the kernel entry with no memory load in its body
  whose exits (if any) test predicates the loop never writes: once entered it can never
  leave. The classic cause is a poll of a plain (non-volatile, non-atomic) flag: the
  compiler loads it once before the loop and spins on a register - a certain hang
  (../shared/notes/h200-measurements.md: "spin on a non-volatile flag ... hang").
- [poll-no-acquire] a poll loop (its exit depends on a value loaded in the loop) followed by
  weak global loads with no acquire in between: no `CCTL.IVALL` (what `ld.acquire.gpu`
  and `__threadfence()` emit to drop stale L1 lines) and no `MEMBAR`. On an H200 ~100% of
  such reads returned stale data (same notes).
- [wgmma-serialized] (perf) ptxas reports that `wgmma.mma_async` instructions were
  serialized (C7510-C7516 "Potential Performance Loss"), with its reason.
- [sync-scope] (info) the scope of each poll and its acquire, in words.
- a kernel's out-of-line (`__noinline__`) functions, after its body in its listing and reached
  only by `CALL`: their loops and polls are found (`_reachable`) and judged against what the
  callers read after the call returns (`SassFunction.across_calls`).
- the wgmma pipeline checks of `hazards.static.wgmma` (refill depth, registers of an in-flight
  wgmma), run on every function that has one. More in docs/static-checks.md.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

from hazards.static import checks
from hazards.static.compile import compile_cubin, disassemble
from hazards.static.findings import Finding
from hazards.static.flow import predecessors, reaching
from hazards.static.sass_listing import SassFunction, SassInstr, _registers, parse_sass  # noqa: F401 (sass.parse_sass stays)
from hazards.static import wgmma
from hazards.engine import toolchain

_WGMMA_RE = re.compile(r"\(C75(1[0-6])\) Potential Performance Loss: (wgmma[^\n]*)")


def _reachable(func: SassFunction) -> set[int]:
    """The instructions reachable from the kernel's entry or from the entry of an out-of-line
    function in its listing (a `CALL` target: `successors` steps over calls, so without
    these roots the loops and polls of a `__noinline__` wait were never looked at)."""
    seen, stack = set(), [0, *func.routines]
    while stack:
        i = stack.pop()
        if i in seen or i >= len(func.instrs):
            continue
        seen.add(i)
        stack.extend(func.successors(i))
    return seen


def _live_preds(func: SassFunction) -> dict[int, list[int]]:
    """Each instruction's predecessors among those reachable from the entry; computed once per
    function (the loops and every poll's `_reaching` read it)."""
    cached = func.__dict__.get("_live_preds")
    if cached is None:
        cached = func.__dict__["_live_preds"] = predecessors(func, _reachable(func))
    return cached


def _loops(func: SassFunction) -> list[set[int]]:
    """Natural loops, one per header: for the back edges i -> t (t at or before i) of one
    header t, t plus every instruction that reaches one of those i without passing through
    t. Nested loops (other headers) stay separate. Computed once per function."""
    cached = func.__dict__.get("_loops")
    if cached is not None:
        return cached
    preds = _live_preds(func)
    latches: dict[int, list[int]] = {}
    for t, sources in preds.items():
        for i in sources:
            if t <= i:  # a back edge (t, at or before a reachable i, is reachable too)
                latches.setdefault(t, []).append(i)
    loops = []
    for t in sorted(latches):
        body, stack = {t}, list(latches[t])
        while stack:
            x = stack.pop()
            if x in body:
                continue
            body.add(x)
            stack.extend(preds.get(x, []))
        loops.append(body)
    func.__dict__["_loops"] = loops
    return loops


def _exit_preds(func: SassFunction, loop: set[int]) -> tuple[bool, set[str]]:
    """(has an exit, predicates that control the exits)."""
    has_exit, preds = False, set()
    for i in loop:
        succ = func.successors(i)
        ins = func.instrs[i]
        leaves = [s for s in succ if s not in loop] or (ins.base in ("EXIT", "RET") and [i])
        if leaves:
            has_exit = True
            preds |= ins.pred_reads()  # the guard and a branch's own predicate operand
    return has_exit, preds


def check_spin_loops(func: SassFunction, path: str) -> list[Finding]:
    """[spin-no-load]: load-free loops that cannot exit once entered."""
    out = []
    for loop in _loops(func):
        if any(func.instrs[i].is_load for i in loop):
            continue
        has_exit, preds = _exit_preds(func, loop)
        written = set().union(*(func.instrs[i].pred_writes() for i in loop))
        if has_exit and preds & written:
            continue
        if has_exit and not preds:
            continue  # an unconditional way out
        head = func.instrs[min(loop)]
        out.append(checks.SPIN_NO_LOAD.finding(
            path, head.line,
            f"{_place(func, min(loop))}: the loop at /*{head.addr:04x}*/ loads nothing from memory and its exit "
            f"condition never changes inside it - a certain hang once entered (a polled flag "
            f"was loaded once, before the loop: make it volatile or use ld.acquire)",
            "\n".join(func.instrs[i].text for i in sorted(loop))))
    return out


def _place(func: SassFunction, i: int) -> str:
    """The kernel, and the out-of-line function in its listing instruction `i` is in."""
    at = func.routine_of(i)
    return func.name if at is None else f"{func.name}, in out-of-line `{func.routines[at]}`"


MAX_POLL_LOOP = 1024  # instructions


def _loop_invariant(func: SassFunction, loop: set[int]) -> set[str]:
    """Registers whose value is the same in every iteration of the loop: not written in it,
    or written only from invariant registers (a pointer re-read from one table slot counts:
    the same address each time). A register read before any write of it in the loop body
    (its value comes round the back edge) and one set from the clock are not."""
    body = sorted(loop)
    first_write: dict[str, int] = {}
    for pos, k in enumerate(body):
        for r in func.instrs[k].reg_writes():
            first_write.setdefault(r, pos)
    variant: set[str] = set()
    changed = True
    while changed:
        changed = False
        for pos, k in enumerate(body):
            ins = func.instrs[k]
            outs = ins.reg_writes() - variant
            if not outs:
                continue
            reads = ins.address_reads() if ins.is_load else ins.reg_reads()
            carried = {r for r in reads if first_write.get(r, -1) >= pos}
            if reads & variant or carried or ins.base in ("S2R", "CS2R", "S2UR") or (
                    ins.is_load and not ins.polls_other_agents and ins.base != "LDC"):
                variant |= outs
                changed = True
    return {r for k in body for r in func.instrs[k].reg_reads()} - variant


def _is_poll(func: SassFunction, loop: set[int]) -> int | None:
    """The index of the load whose *value* decides an exit of the loop, if any.

    A poll re-reads one address until another agent changes it: the load's address is
    loop-invariant (a data loop walks addresses) and it reads global/generic memory (not
    local, shared or constant memory, nor an mbarrier in shared memory). Its value must
    reach an exit branch: taint flows forward through the registers and predicates
    computed from it (`__all_sync`/`__any_sync` votes included), never through the address
    of another access - a pointer loaded from a table is not the poll; the load through it
    is."""
    if len(loop) > MAX_POLL_LOOP:
        return None  # a loop this long does work; a poll inside it is its own inner loop
    body = sorted(loop)
    exits = [b for b in body if func.instrs[b].pred_reads()
             and not all(s in loop for s in func.successors(b))]
    if not exits:
        return None
    invariant = _loop_invariant(func, loop)
    for n, i in enumerate(body):
        if not func.instrs[i].polls_other_agents or not func.instrs[i].address_reads() - _descriptor(
                func.instrs[i]) <= invariant:
            continue
        taint = set(func.instrs[i].reg_writes())
        for k in body[n + 1:]:
            ins = func.instrs[k]
            if k in exits and ins.pred_reads() & taint:
                return i
            if ins.is_load:
                taint -= ins.reg_writes()  # loaded from memory: not computed from the taint
                continue
            if (ins.value_reads() | ins.pred_reads()) & taint:
                taint |= ins.reg_writes() | ins.pred_writes()
            else:
                taint -= ins.reg_writes() | ins.pred_writes()
    return None


def _only_an_address(func: SassFunction, at: int, limit: int = 96) -> bool:
    """Whether what the load at `at` returns is used only to form addresses (a pointer
    read from a table), never as a value, on the code after it (every path, `limit`
    instructions deep)."""
    derived = set(func.instrs[at].reg_writes())
    used_as_address = False
    seen: set[int] = set()
    frontier = list(func.successors(at))
    while frontier and len(seen) < limit:
        k = frontier.pop(0)
        if k in seen or k >= len(func.instrs):
            continue
        seen.add(k)
        ins = func.instrs[k]
        if ins.is_memory:
            if ins.value_reads() & derived:
                return False
            used_as_address |= bool(ins.address_reads() & derived)
            derived -= ins.reg_writes()
        elif ins.reg_reads() & derived:
            if ins.pred_writes() or ins.base in ("BRX", "JMX", "RET", "CALL"):
                return False  # tested or jumped through: a value
            derived |= ins.reg_writes()
        else:
            derived -= ins.reg_writes()
        if not derived:
            break
        frontier.extend(func.successors(k))
    return used_as_address


def _own_word(func: SassFunction, at: int, limit: int = 96) -> bool:
    """Whether the load at `at` reads a word this thread writes itself: a store within
    `limit` instructions, before or after it, to the same address expression (registers
    and offset) with those registers unchanged in between - a thread's own counter
    (load, add, store back) or its own write read back. For a store at `at`, the same with
    a load of that word: the store of a thread's own counter. No flag publishes such a word to
    this thread, so a stale L1 line of another agent's data cannot be what it reads."""
    access = func.instrs[at]
    where = re.findall(r"\[[^\]]*\]", access.text)
    if not where:
        return False
    address, regs = where[-1], access.address_reads()
    partner = ("LDG", "LD") if access.base in ("STG", "ST") else ("STG", "ST")  # a store's own word: its load
    lo, hi = max(0, at - limit), min(len(func.instrs), at + limit + 1)
    for k in range(lo, hi):
        ins = func.instrs[k]
        if ins.base not in partner or re.findall(r"\[[^\]]*\]", ins.text)[-1:] != [address]:
            continue
        between = range(min(k, at) + 1, max(k, at))
        if not any(func.instrs[j].reg_writes() & regs for j in between):
            return True
    return False


def _writer(func: SassFunction, reg: str, before: int, lo: int) -> int | None:
    """The last instruction before `before` (not before `lo`) that writes `reg`."""
    return next((k for k in range(before - 1, lo - 1, -1) if reg in func.instrs[k].reg_writes()), None)


def _from_arguments(func: SassFunction, regs: set[str], before: int, lo: int) -> bool:
    """Whether `regs` hold only values computed from kernel arguments (constant bank: LDC,
    ULDC) and immediates in the straight-line code before `before`."""
    todo, seen = list(regs), set()
    while todo:
        r = todo.pop()
        if r in seen:
            continue
        seen.add(r)
        k = _writer(func, r, before, lo)
        if k is None:
            return False
        ins = func.instrs[k]
        if ins.is_load and ins.base not in ("LDC", "ULDC") or ins.base in ("S2R", "S2UR", "CS2R"):
            return False
        todo += ins.reg_reads()
        before = min(before, k + 1)
    return True


def _own_rank_entry(func: SassFunction, at: int, window: int = 48) -> bool:
    """Whether the load at `at` reads through a pointer taken from a pointer table at an
    entry chosen by a kernel argument as it is (`buffer_ptrs[rank]`: the launching rank's
    own buffer, DeepEP's `rank_prefix_matrix`): a rank's own input, which no peer's flag
    publishes. Every 64-bit pointer load the address is computed from must be such an
    entry: base and index kernel arguments, the index loaded as it is (a peer's entry,
    `(rank + i) % n`, is computed)."""
    lo = max(0, at - window)
    tables, todo, seen = [], [(r, at) for r in func.instrs[at].address_reads() - _uniform(func.instrs[at])], set()
    while todo:
        r, before = todo.pop()
        if (r, before) in seen:
            continue
        seen.add((r, before))
        k = _writer(func, r, before, lo)
        if k is None:
            continue
        ins = func.instrs[k]
        if ins.base in ("LDG", "LD") and ".64" in ins.opcode:
            tables.append(k)
        elif not ins.is_load:
            todo += [(x, k) for x in ins.reg_reads()]
    return bool(tables) and all(_argument_entry(func, k, lo) for k in tables)


def _argument_entry(func: SassFunction, k: int, lo: int) -> bool:
    """Whether the pointer load at `k` reads table entry `base + index * 8` with `base` an
    argument-only value and `index` a kernel argument loaded as it is."""
    for r in func.instrs[k].address_reads() - _uniform(func.instrs[k]):
        w = _writer(func, r, k, lo)
        step = func.instrs[w] if w is not None else None
        if step is None or step.base != "IMAD" or ".WIDE" not in step.opcode or len(step.operands) < 4 \
                or step.operands[2] != "0x8":
            continue
        idx = _registers(step.operands[1])
        writers = [_writer(func, i, w, lo) for i in idx]
        if idx and all(x is not None and func.instrs[x].base == "LDC" for x in writers) \
                and _from_arguments(func, _registers(step.operands[3], 2), w, lo):
            return True
    return False


def _descriptor(ins: SassInstr) -> set[str]:
    """The registers of an access's memory descriptor (`desc[UR36]`): not its address. A
    loop that also touches shared memory rebuilds them from `SR_CgaCtaId` on each trip
    (the tripwire's out-of-line wait does), which made its poll look like a walk."""
    return {r for m in re.finditer(r"desc\[([^\]]*)\]", ins.text) for r in _registers(m.group(1))}


def _uniform(ins: SassInstr) -> set[str]:
    """The uniform registers of an access (`desc[UR36]`: the memory descriptor)."""
    return {r for r in ins.address_reads() if r.startswith("UR")}


def _reaching(func: SassFunction, target: int) -> set[int]:
    """The instructions (reachable from the entry) from which `target` can be reached."""
    return reaching(_live_preds(func), target)


_PUBLISHING_STORES = ("STG", "ST", "RED", "REDG", "ATOM", "ATOMG")  # what a flag can publish to another block or GPU


def _start_barrier(func: SassFunction, loop: set[int], poll: int) -> SassInstr | None:
    """The arrive of an arrive-then-wait barrier that publishes nothing written in this
    kernel, if the poll is one: a strong store (`st.volatile`/`st.relaxed`: `.STRONG`) of
    the very register the loop compares the polled value with, and no other global store
    (a thread's own counter word aside, `_own_word`) on any path from the entry to the poll.
    Every rank (block) runs the same code, so what a peer published with its arrive is what
    it stored before it: nothing. The reads after such a barrier (flashinfer's vLLM
    all-reduce start barrier) are of data written before the launch, which the kernel
    boundary orders; a store before it, or an arrive of another value than the one waited
    for (an ack to a different producer), and the check judges the reads as usual."""
    if func.routine_of(poll) is not None:
        return None  # a poll in an out-of-line function: what its callers stored before is not judged here
    polled = func.instrs[poll].reg_writes()
    compared: set[str] = set()
    for k in loop:
        ins = func.instrs[k]
        if ins.pred_writes() and ins.value_reads() & polled:
            compared |= ins.value_reads() - polled
    if not compared:
        return None
    before = _reaching(func, poll) - loop
    arrives = [k for k in sorted(before) if func.instrs[k].base in ("STG", "ST")
               and ".STRONG" in func.instrs[k].opcode
               and (func.instrs[k].value_reads() - func.instrs[k].address_reads()) & compared
               and not any(compared & func.instrs[j].reg_writes() for j in range(k + 1, poll) if j in before)]
    if not arrives:
        return None
    for k in before:
        ins = func.instrs[k]
        if ins.base in _PUBLISHING_STORES and k not in arrives and not _own_counter(func, k, compared):
            return None
        if ins.base == "CALL":  # the callee's stores are not in this function's listing
            return None
    return func.instrs[arrives[-1]]


def _own_counter(func: SassFunction, k: int, compared: set[str]) -> bool:
    """Whether the store at `k` is this thread's own barrier counter: a word it loads and
    stores back (`_own_word`) whose new value is the very value the barrier waits for (vLLM's
    `counter += 1` then arrive with it). Data read, changed and stored back (`out[i] += x`)
    stores another value: the arrive publishes it."""
    ins = func.instrs[k]
    stored = ins.value_reads() - ins.address_reads()
    return ins.base in ("STG", "ST") and bool(stored) and stored <= compared and _own_word(func, k)


READ_WINDOW = 64  # instructions after a poll's exit in which its data is read


def _stale_read_after(func: SassFunction, loop: set[int], poll: int, other_polls: set[int]):
    """(first weak data load within `READ_WINDOW` instructions of the poll's loop exit
    reached from the poll with no acquire on the way, how many such loads, the first
    acquire fence seen). The walk starts at the poll (an `ld.acquire`'s fence sits right
    after it, inside the loop), follows calls into out-of-line functions and returns out of
    them (`SassFunction.across_calls`: a `__noinline__` wait's data is read by its callers), stops at
    another poll loop (what follows it is that poll's data) and does not count pointer loads
    (`_only_an_address`), a thread's own words (`_own_word`: its counter, its own write read
    back) nor a rank's own buffer (`_own_rank_entry`: `buffer_ptrs[rank]`)."""
    seen: set[tuple[int, tuple[int, ...]]] = set()
    frontier = [(s, 0, st) for s, st in func.across_calls(poll)]
    first, fence, stale = None, None, set()
    while frontier:
        i, dist, stack = frontier.pop(0)
        if (i, stack) in seen or i >= len(func.instrs) or i in other_polls or dist > READ_WINDOW:
            continue
        seen.add((i, stack))
        ins = func.instrs[i]
        if ins.is_acquire_fence:
            fence = fence or ins
            continue  # acquired on this path
        if (i not in loop and ins.is_weak_global_load and not _only_an_address(func, i)
                and i not in stale and not _own_word(func, i) and not _own_rank_entry(func, i)):
            stale.add(i)  # once, whichever call it was reached through
            first = ins if first is None or ins.addr < first.addr else first
        # a step counts only at the poll's own call level: a long out-of-line callee with no load
        # (an index hash) must not use up the window before the read its result feeds
        frontier.extend((s, dist + (i not in loop and not stack), st) for s, st in func.across_calls(i, stack))
    return first, len(stale), fence


def poll_loops(func: SassFunction) -> dict[int, set[int]]:
    """Each poll load (instruction index) -> the instructions of the loop(s) it decides."""
    polls: dict[int, set[int]] = {}
    for loop in _loops(func):
        p = _is_poll(func, loop)
        if p is not None:
            polls.setdefault(p, set()).update(loop)
    return polls


def check_polls(func: SassFunction, path: str) -> list[Finding]:
    """[poll-no-acquire] and the [sync-scope] note, once per poll loop."""
    out = []
    polls = poll_loops(func)
    for p, loop in sorted(polls.items()):
        poll = func.instrs[p]
        others = set().union(*(body for q, body in polls.items() if q != p)) - loop
        bad, count, fence = _stale_read_after(func, loop, p, others)
        arrive = _start_barrier(func, loop, p) if bad is not None else None
        if bad is not None and arrive is None:
            more = f" (+{count - 1} more such loads)" if count > 1 else ""
            out.append(checks.POLL_NO_ACQUIRE.finding(
                path, bad.line,
                f"{_place(func, p)}: `{bad.opcode}` at /*{bad.addr:04x}*/ follows the poll "
                f"`{poll.opcode}` at /*{poll.addr:04x}*/ with no acquire in between (no "
                f"CCTL.IVALL / gpu-scope MEMBAR){more}: it may read stale L1 lines of the data "
                f"the flag publishes; poll with ld.acquire.gpu or add __threadfence() after "
                f"the loop", f"{poll.text}\n...\n{bad.text}"))
        else:
            scope = {"SYS": "system (volatile)", "GPU": "gpu"}.get(poll.opcode.split(".")[-1], poll.opcode)
            acq = f"`{fence.opcode}` at /*{fence.addr:04x}*/" if fence else "no weak data load follows"
            if arrive is not None:
                acq = (f"none, and none needed: a start barrier - its arrive `{arrive.opcode}` at "
                       f"/*{arrive.addr:04x}*/ stores the value it waits for and no store of this "
                       f"kernel comes before it, so the {count} weak load(s) after it read data "
                       f"written before the launch (ordered by the kernel boundary), assuming every "
                       f"rank runs this same code")
            out.append(checks.SYNC_SCOPE.finding(path, poll.line,
                                                 f"{_place(func, p)}: poll `{poll.opcode}` ({scope}); "
                                                 f"acquire: {acq}", poll.text))
    return out


def check_sass(text: str, path: str) -> list[Finding]:
    """Every SASS check over one listing (the wgmma pipeline checks without a known ring
    size: refill depths are reported, not judged; see hazards/static/wgmma.py)."""
    out: list[Finding] = []
    for func in parse_sass(text):
        out += check_spin_loops(func, path) + check_polls(func, path) + wgmma.check_function(func, path)
    return out


def check_ptxas_log(log: str, path: str) -> list[Finding]:
    """[wgmma-serialized] performance findings from ptxas' diagnostics."""
    return [checks.WGMMA_SERIALIZED.finding(path, 0, f"ptxas C75{m.group(1)}: {m.group(2)}")
            for m in _WGMMA_RE.finditer(log)]


def check_cubin(cubin: Path) -> list[Finding]:
    """Disassemble a cubin and run the SASS checks on it."""
    listing = disassemble(Path(cubin))
    return check_sass(listing.text, str(listing.path))


def compile_and_check(source: Path, *, arch: str = toolchain.SM90A,
                      defines: Mapping[str, object] | None = None,
                      label: str | None = None) -> list[Finding]:
    """nvcc -cubin the source, then the ptxas-log and SASS checks."""
    build = compile_cubin(Path(source), arch=arch, defines=defines, label=label)
    return check_ptxas_log(build.log, str(source)) + check_cubin(build.path)
