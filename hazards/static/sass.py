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
- the wgmma pipeline checks of `hazards.static.wgmma` (refill depth, registers of an in-flight
  wgmma), run on every function that has one.

The disassemblers come from the pip wheels `nvidia-cuda-nvdisasm` / `nvidia-cuda-cuobjdump`
(`hazards.engine.toolchain.find_tool`); without them these checks raise ToolchainMissing.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path
from typing import Mapping

from hazards.static import checks
from hazards.static.compile import compile_cubin, disassemble
from hazards.static.findings import Finding
from hazards.engine import toolchain

_INSTR_RE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL_RE = re.compile(r"^(\.L_x_\d+|[.\w$]+):")
_FUNC_RE = re.compile(r"^\s*\.text\.([\w$.]+):")
_PRED_RE = re.compile(r"^!?U?P[0-6T]$")
_MEM_LOADS = ("LDG", "LD", "LDS", "LDSM", "ATOMG", "ATOM", "ATOMS", "LDGSTS", "SUATOM", "SULD",
              "TLD", "LDL",
              "SYNCS")  # mbarrier ops: PHASECHK.TRANS64.TRYWAIT polls the barrier in smem
_MEM_STORES = ("STG", "ST", "STS", "STL", "RED", "REDG", "REDUX", "SUST", "SURED", "STSM")
_WGMMA_RE = re.compile(r"\(C75(1[0-6])\) Potential Performance Loss: (wgmma[^\n]*)")


def _memo(method):
    """Compute an instruction's register set once (callers never mutate the result)."""
    key = "_memo_" + method.__name__

    @functools.wraps(method)
    def cached(self):
        found = self.__dict__.get(key)
        if found is None:
            found = self.__dict__[key] = method(self)
        return found
    return cached


@dataclasses.dataclass
class SassInstr:
    addr: int
    pred: str
    opcode: str
    operands: list[str]
    text: str
    line: int

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]

    @property
    def is_load(self) -> bool:
        return self.base in _MEM_LOADS

    @property
    def is_memory(self) -> bool:
        """Reads or writes memory (its `[...]` operand is an address, not a value)."""
        return self.base in _MEM_LOADS or self.base in _MEM_STORES

    @property
    def polls_other_agents(self) -> bool:
        """A load that can observe another block's or GPU's write: global or generic
        memory (not local, shared, constant, or an mbarrier in shared memory)."""
        return self.base in ("LDG", "LD", "ATOMG", "ATOM", "SULD")

    @property
    def is_weak_global_load(self) -> bool:
        """A weak load that may read global memory through L1, where a stale line could
        answer: `LDG`, and a generic `LD` (a pointer the compiler could not place - one
        taken from a peer table, kept in shared memory, passed to a non-inlined function -
        is the usual multi-GPU exchange shape; it reads global memory unless the pointer is
        in fact a shared one), not `.STRONG`, not L1::no_allocate (`.NA`), and not a
        non-coherent `ld.global.nc` / `__ldg` (`.CONSTANT`: the programmer's promise that
        the data do not change while the kernel runs, so not data a flag publishes)."""
        return (self.base in ("LDG", "LD")
                and not any(m in self.opcode for m in (".STRONG", ".NA", ".CONSTANT")))

    @property
    def is_acquire_fence(self) -> bool:
        """Drops stale L1 lines for a grid- or system-scope flag: `CCTL.IVALL` (what
        ld.acquire.gpu and __threadfence() emit) or a gpu/system `MEMBAR`. A block-scope
        `MEMBAR.*.CTA` orders nothing another block wrote."""
        if self.base == "CCTL":
            return "IVALL" in self.opcode
        return self.base == "MEMBAR" and ".CTA" not in self.opcode

    def _pred_dest_count(self) -> int:
        if "SETP" in self.opcode or self.base in ("PLOP3", "R2P"):
            return 2
        if self.base == "VOTE":
            return 2 if self.operands and self.operands[0].startswith(("R", "UR")) else 1
        return 0

    @_memo
    def pred_writes(self) -> set[str]:
        n = self._pred_dest_count()
        return {op.lstrip("!") for op in self.operands[:n] if _PRED_RE.match(op) and "T" not in op}

    @_memo
    def pred_reads(self) -> set[str]:
        """Predicates this instruction reads (its guard included)."""
        n = self._pred_dest_count()
        out = {op.lstrip("!") for op in self.operands[n:] if _PRED_RE.match(op) and "T" not in op}
        if self.pred and self.pred != "@PT":
            out.add(self.pred.lstrip("@!"))
        return out

    def _width(self) -> int:
        """How many consecutive registers the destination covers."""
        if ".128" in self.opcode:
            return 4
        wide = (".64", ".WIDE")
        if any(w in self.opcode for w in wide) or (self.base == "CS2R" and ".32" not in self.opcode):
            return 2
        return 1

    @_memo
    def reg_writes(self) -> set[str]:
        """Registers written (stores and reductions write none)."""
        if not self.operands or self.base in _MEM_STORES:
            return set()
        dest = self.operands[0]
        if self.base in ("ATOM", "ATOMG", "ATOMS") and _PRED_RE.match(dest) and len(self.operands) > 1:
            dest = self.operands[1]
        return _registers(dest, self._width())

    @_memo
    def address_reads(self) -> set[str]:
        """Registers read as an address (inside `[...]`) by a memory instruction."""
        if not self.is_memory:
            return set()
        return {r for op in self.operands for m in re.finditer(r"\[([^\]]*)\]", op)
                for r in _registers(m.group(1), 2 if ".64" in m.group(1) else 1)}

    @_memo
    def reg_reads(self) -> set[str]:
        """Registers read, address registers included."""
        first = 0 if self.base in _MEM_STORES else 1
        return {r for op in self.operands[first:] for r in _registers(op, 2 if ".64" in op else 1)}

    @_memo
    def value_reads(self) -> set[str]:
        """Registers read as values (everything but the address of a memory access)."""
        addr = self.address_reads()
        first = 0 if self.base in _MEM_STORES else 1
        vals = set()
        for op in self.operands[first:]:
            vals |= _registers(re.sub(r"\[[^\]]*\]", "", op), 2 if ".64" in op else 1)
        return vals - (addr - vals)


def _registers(operand: str, width: int = 1) -> set[str]:
    """`R4` (and its `width - 1` neighbours), `UR6`, ...: the registers an operand names."""
    out = set()
    for m in re.finditer(r"\b(U?R)(\d+)\b", operand):
        out |= {f"{m.group(1)}{int(m.group(2)) + k}" for k in range(width)}
    return out - {"RZ", "URZ"}


@dataclasses.dataclass
class SassFunction:
    name: str
    instrs: list[SassInstr]
    labels: dict[str, int]

    def successors(self, i: int) -> list[int]:
        """Where control may go after instruction `i` (computed once per function)."""
        succ = self.__dict__.get("_succ")
        if succ is None:
            succ = self.__dict__["_succ"] = [self._successors(k) for k in range(len(self.instrs))]
        return succ[i]

    def _successors(self, i: int) -> list[int]:
        ins = self.instrs[i]
        conditional = bool(ins.pred) and ins.pred not in ("@PT",)
        if ins.base in ("EXIT", "RET", "BRX", "JMX") or ins.opcode.startswith("BPT.TRAP"):
            return [i + 1] if conditional and i + 1 < len(self.instrs) else []
        if ins.base in ("BRA", "JMP"):
            m = re.search(r"\((\.L_x_\d+)\)", ins.text)
            out = [self.labels[m.group(1)]] if m and m.group(1) in self.labels else []
            # BRA.DIV, or a BRA with its own predicate operand: taken only sometimes
            conditional = conditional or ".DIV" in ins.opcode or bool(
                ins.operands and re.match(r"!?U?P[0-6]|U?R\d", ins.operands[0]))
            if conditional and i + 1 < len(self.instrs):
                out.append(i + 1)
            return out
        return [i + 1] if i + 1 < len(self.instrs) else []


def parse_sass(text: str) -> list[SassFunction]:
    """Functions of an `nvdisasm -c` (or `cuobjdump -sass`) listing."""
    funcs: list[SassFunction] = []
    cur: SassFunction | None = None
    for no, raw in enumerate(text.split("\n"), start=1):
        fm = _FUNC_RE.match(raw) or re.match(r"^\s*Function : ([\w$.]+)", raw)
        if fm:
            cur = SassFunction(fm.group(1), [], {})
            funcs.append(cur)
            continue
        if cur is None:
            continue
        lm = _LABEL_RE.match(raw.strip())
        if lm and not raw.strip().startswith("/*"):
            cur.labels[lm.group(1)] = len(cur.instrs)
            continue
        im = _INSTR_RE.match(raw)
        if not im:
            continue
        body = im.group(2).strip()
        pred = ""
        if body.startswith("@"):
            pred, _, body = body.partition(" ")
        opcode, _, rest = body.strip().partition(" ")
        ops = [o.strip() for o in rest.split(",")] if rest.strip() else []
        cur.instrs.append(SassInstr(int(im.group(1), 16), pred, opcode, ops, body.strip(), no))
    return [f for f in funcs if f.instrs]


def _reachable(func: SassFunction) -> set[int]:
    seen, stack = set(), [0]
    while stack:
        i = stack.pop()
        if i in seen or i >= len(func.instrs):
            continue
        seen.add(i)
        stack.extend(func.successors(i))
    return seen


def _loops(func: SassFunction) -> list[set[int]]:
    """Natural loops, one per header: for the back edges i -> t (t at or before i) of one
    header t, t plus every instruction that reaches one of those i without passing through
    t. Nested loops (other headers) stay separate. Computed once per function."""
    cached = func.__dict__.get("_loops")
    if cached is not None:
        return cached
    live = _reachable(func)
    preds: dict[int, list[int]] = {}
    latches: dict[int, list[int]] = {}
    for i in live:
        for t in func.successors(i):
            preds.setdefault(t, []).append(i)
            if t <= i and t in live:
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
            f"{func.name}: the loop at /*{head.addr:04x}*/ loads nothing from memory and its exit "
            f"condition never changes inside it - a certain hang once entered (a polled flag "
            f"was loaded once, before the loop: make it volatile or use ld.acquire)",
            "\n".join(func.instrs[i].text for i in sorted(loop))))
    return out


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
        if not func.instrs[i].polls_other_agents or not func.instrs[i].address_reads() <= invariant:
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
    (load, add, store back) or its own write read back. No flag publishes such a word to
    this thread, so a stale L1 line of another agent's data cannot be what it reads."""
    load = func.instrs[at]
    where = re.findall(r"\[[^\]]*\]", load.text)
    if not where:
        return False
    address, regs = where[-1], load.address_reads()
    lo, hi = max(0, at - limit), min(len(func.instrs), at + limit + 1)
    for k in range(lo, hi):
        ins = func.instrs[k]
        if ins.base not in ("STG", "ST") or re.findall(r"\[[^\]]*\]", ins.text)[-1:] != [address]:
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


def _uniform(ins: SassInstr) -> set[str]:
    """The uniform registers of an access (`desc[UR36]`: the memory descriptor)."""
    return {r for r in ins.address_reads() if r.startswith("UR")}


READ_WINDOW = 64  # instructions after a poll's exit in which its data is read


def _stale_read_after(func: SassFunction, loop: set[int], poll: int, other_polls: set[int]):
    """(first weak data load within `READ_WINDOW` instructions of the poll's loop exit
    reached from the poll with no acquire on the way, how many such loads, the first
    acquire fence seen). The walk starts at the poll (an `ld.acquire`'s fence sits right
    after it, inside the loop), stops at another poll loop (what follows it is that poll's
    data) and does not count pointer loads (`_only_an_address`), a thread's own words
    (`_own_word`: its counter, its own write read back) nor a rank's own buffer
    (`_own_rank_entry`: `buffer_ptrs[rank]`)."""
    seen: set[int] = set()
    frontier = [(s, 0) for s in func.successors(poll)]
    first, count, fence = None, 0, None
    while frontier:
        i, dist = frontier.pop(0)
        if i in seen or i >= len(func.instrs) or i in other_polls or dist > READ_WINDOW:
            continue
        seen.add(i)
        ins = func.instrs[i]
        if ins.is_acquire_fence:
            fence = fence or ins
            continue  # acquired on this path
        if (i not in loop and ins.is_weak_global_load and not _only_an_address(func, i)
                and not _own_word(func, i) and not _own_rank_entry(func, i)):
            count += 1
            first = ins if first is None or ins.addr < first.addr else first
        frontier.extend((s, dist + (i not in loop)) for s in func.successors(i))
    return first, count, fence


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
        if bad is not None:
            more = f" (+{count - 1} more such loads)" if count > 1 else ""
            out.append(checks.POLL_NO_ACQUIRE.finding(
                path, bad.line,
                f"{func.name}: `{bad.opcode}` at /*{bad.addr:04x}*/ follows the poll "
                f"`{poll.opcode}` at /*{poll.addr:04x}*/ with no acquire in between (no "
                f"CCTL.IVALL / gpu-scope MEMBAR){more}: it may read stale L1 lines of the data "
                f"the flag publishes; poll with ld.acquire.gpu or add __threadfence() after "
                f"the loop", f"{poll.text}\n...\n{bad.text}"))
        else:
            scope = {"SYS": "system (volatile)", "GPU": "gpu"}.get(poll.opcode.split(".")[-1], poll.opcode)
            acq = f"`{fence.opcode}` at /*{fence.addr:04x}*/" if fence else "no weak data load follows"
            out.append(checks.SYNC_SCOPE.finding(path, poll.line,
                                                 f"{func.name}: poll `{poll.opcode}` ({scope}); "
                                                 f"acquire: {acq}", poll.text))
    return out


def check_sass(text: str, path: str) -> list[Finding]:
    """Every SASS check over one listing (the wgmma pipeline checks without a known ring
    size: refill depths are reported, not judged; see hazards/static/wgmma.py)."""
    from hazards.static import wgmma  # it builds on this module's parser

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
