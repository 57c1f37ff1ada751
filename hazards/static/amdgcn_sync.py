"""Release/acquire sequences around flag stores and polls in gfx94x assembly.

On gfx942 (MI300: one L2 per XCD, several XCDs per agent) the memory model is spelled with
cache-coherence bits and cache maintenance instructions (LLVM AMDGPUUsage, "Memory Model
GFX942"); the sequences this checks are in docs/static-checks.md."""
from __future__ import annotations

from hazards.static import amdgcn_isa as isa
from hazards.static import checks
from hazards.static.findings import Finding
from hazards.static.flow import predecessors, reaching

_STEP_LIMIT = 400


def _bits(ins: isa.Instr) -> set[str]:
    return {m for m in ins.operands + ins.modifiers if m in ("sc0", "sc1", "nt", "glc", "slc")}


def access_scope(ins: isa.Instr) -> str:
    """The scope an access's coherence bits give it, in words."""
    b = _bits(ins)
    if {"sc0", "sc1"} <= b:
        return "system scope (sc0 sc1: written through to / read from memory)"
    if "sc1" in b:
        return "agent scope (sc1: coherent across every XCD of the GPU)"
    if "sc0" in b or "glc" in b:
        return "workgroup scope (sc0)"
    return "no scope bits (may be served by this CU's vL1)"


def fence_scope(ins: isa.Instr) -> str:
    """What a `buffer_wbl2` / `buffer_inv` covers, in words."""
    b = _bits(ins)
    if ins.mnemonic.startswith("buffer_wbl2"):
        if {"sc0", "sc1"} <= b:
            return "system-scope release (L2 written back to memory for other agents/host)"
        return "agent-scope release (this XCD's dirty L2 lines written back for other XCDs)"
    if {"sc0", "sc1"} <= b:
        return "system-scope acquire (vL1 and L2 invalidated)"
    if "sc1" in b:
        return "agent-scope acquire (vL1 and this XCD's L2 copies of remote data invalidated)"
    if "sc0" in b:
        return "workgroup-scope acquire (vL1, matters in threadgroup-split mode)"
    return ("CU-local acquire (only this CU's vL1 dropped: enough when producer and consumer "
            "share one XCD's L2)")


_COND_REG = {"vccz": "vcc", "vccnz": "vcc", "execz": "exec", "execnz": "exec",
             "scc0": "scc", "scc1": "scc"}


def _implicit_writes(ins: isa.Instr) -> set[tuple[str, int]]:
    m = ins.mnemonic
    if m.startswith("v_cmpx"):
        return {("exec", 0), ("exec", 1)}
    if m.startswith(("s_cmp", "s_bitcmp")) or (m.startswith("s_") and m.endswith(("_b32", "_b64"))
                                               and not m.startswith(("s_mov", "s_load"))):
        out = {("scc", 0)}
        if "saveexec" in m:
            out |= {("exec", 0), ("exec", 1)}
        return out
    return set()


def _is_data_load(ins: isa.Instr) -> bool:
    """A load of memory another agent may have written: not `scratch_` (a thread's private
    memory: its stack, a local array indexed at run time), which no flag publishes."""
    return ins.mnemonic.startswith(("global_load", "flat_load", "buffer_load"))


def lds_pointer_accesses(func: isa.Function, reach: int = 4000) -> set[int]:
    """Indices of `flat_` accesses whose address is a generic pointer to LDS (its high dword
    comes from `src_shared_base`, through moves): a `volatile` shared-memory
    reduction through a plain pointer compiles to `flat_store ... sc0 sc1`, which is neither
    a flag another agent polls nor data it reads. Every write of the high dword that may
    reach the access (each path back through the CFG to its nearest writer, within `reach`
    steps) must come from `src_shared_base`: a pointer that is LDS on one branch and global
    memory on another is a global access on that path."""
    cached = func.__dict__.get("_lds_accesses")
    if cached is not None:
        return cached
    preds = predecessors(func)

    def writers(unit: tuple[str, int], at: int) -> set[int] | None:
        """The writes of `unit` that may reach instruction `at`; None when some path back
        reaches the function's entry with no write of it (or the walk passes `reach` steps)."""
        found: set[int] = set()
        seen: set[int] = set()
        stack = [at]
        while stack:
            i = stack.pop()
            if i == 0 or not preds.get(i):
                return None  # the entry: the value comes from outside what was read
            for j in preds[i]:
                if j in seen:
                    continue
                seen.add(j)
                if len(seen) > reach:
                    return None
                if unit in isa.units(func.instrs[j].writes()):
                    found.add(j)
                else:
                    stack.append(j)
        return found

    def from_shared_base(unit: tuple[str, int], at: int, moves: int) -> bool:
        ws = writers(unit, at)
        if not ws:
            return False
        for w in ws:
            ins = func.instrs[w]
            if "src_shared_base" in ins.text:
                continue
            srcs = isa.units(ins.reads())
            if not (moves and srcs and ins.mnemonic.startswith(_MOVES)
                    and all(from_shared_base(u, w, moves - 1) for u in srcs)):
                return False
        return True

    out: set[int] = set()
    if any("src_shared_base" in ins.text for ins in func.instrs):
        for k, ins in enumerate(func.instrs):
            at = 1 if ins.has_dest else 0  # a load's (or returning atomic's) destination comes first
            if not ins.mnemonic.startswith("flat_") or len(ins.operands) <= at:
                continue
            addr = isa.units(isa.parse_regs(ins.operands[at]))
            # the high dword's writers, through moves (v_mov v17, v9; v9, s7)
            if addr and from_shared_base(max(addr, key=lambda u: u[1]), k, moves=4):
                out.add(k)
    func.__dict__["_lds_accesses"] = out
    return out


_MOVES = ("v_mov_b32", "s_mov_b32", "s_mov_b64", "v_mov_b64")


def _is_shared_write(ins: isa.Instr) -> bool:
    """A store or atomic to memory other agents can read (not scratch, not LDS)."""
    return ins.is_vmem and (ins.is_store or ins.is_atomic) and not ins.mnemonic.startswith("scratch_")


def _is_call(ins: isa.Instr) -> bool:
    """A call or return: what the other function loads and stores is not in this one's listing."""
    return ins.mnemonic.startswith(("s_swappc", "s_setpc", "s_call"))


def _is_return(ins: isa.Instr) -> bool:
    """A function's return (`s_setpc_b64` to the return address the call left in s[30:31]),
    not a long branch through another register pair."""
    return ins.mnemonic == "s_setpc_b64" and bool(ins.operands) and ins.operands[0] == "s[30:31]"


def _store_data(ins: isa.Instr) -> set[tuple[str, int]]:
    """The register units a store writes to memory (buffer_*: the first operand; global_,
    flat_: the second)."""
    k = 0 if ins.mnemonic.startswith("buffer_") else 1
    return isa.units(isa.parse_regs(ins.operands[k])) if len(ins.operands) > k else set()


def _arrive(func: isa.Function, head: int, back: int, poll: int,
            preds: dict[int, list[int]]) -> tuple[int | None, set[int]]:
    """(the arrive of an arrive-then-wait barrier, what may run before the loop): a flag
    store before the poll loop of the very value the loop compares the polled value with
    (directly or through a move), as aiter's all-reduce `start_sync`/`end_sync` do - every
    rank stores the value it then waits for in its peers' slots."""
    polled = isa.units(func.instrs[poll].writes())
    compared: set[tuple[str, int]] = set()
    for k in range(poll + 1, back + 1):
        ins = func.instrs[k]
        if ins.mnemonic.startswith(("v_cmp", "s_cmp")) and isa.units(ins.reads()) & polled:
            compared |= isa.units(ins.reads()) - polled
    before = reaching(preds, head) - set(range(head, back + 1))
    if not compared:
        return None, before
    for k in sorted(before, reverse=True):
        ins = func.instrs[k]
        if not (_is_flag_store(ins) and ins.is_store):
            continue
        value = _store_data(ins)
        for unit in list(value):  # a copy of the compared register: `v_mov_b32 v6, s2`
            w = next((j for j in range(k - 1, -1, -1) if j in before and unit in isa.units(func.instrs[j].writes())), None)
            if w is not None and func.instrs[w].mnemonic.startswith(("v_mov_b32", "s_mov_b32")):
                value |= isa.units(func.instrs[w].reads())
        if value & compared:
            return k, before
    return None, before


def _data_load_after(func: isa.Function, head: int, back: int, poll: int) -> bool:
    """Whether a data load may follow the poll loop (within the walk's step limit): a load,
    an atomic that returns what it read, or a call (its callee may load)."""
    seen: set[int] = set()
    stack = list(func.successors(poll))
    while stack and len(seen) < _STEP_LIMIT:
        i = stack.pop()
        if i >= len(func.instrs) or i in seen:
            continue
        seen.add(i)
        ins = func.instrs[i]
        reads = _is_data_load(ins) or _is_call(ins) or (ins.is_atomic and ins.has_dest and _is_shared_write(ins))
        if reads and not head <= i <= back:
            return True
        stack.extend(func.successors(i))
    return bool(stack)


def _loop_variant(func: isa.Function, t: int, b: int) -> set[tuple[str, int]]:
    """Register units of the loop [t, b] whose value may differ between iterations: read
    before any write of them in the body (carried round the back edge) or computed from
    such a value; a load's result counts as invariant when its address is (a pointer
    re-read from one slot), the clock (`s_memtime`, `s_getreg`) does not. A register an
    inner loop updates from itself (`s_add_u32 s20, s20, 4`: a search walking addresses,
    reset before that inner loop) differs between the inner trips, so it is variant too."""
    first_write: dict[tuple[str, int], int] = {}
    for k in range(t, b + 1):
        for u in isa.units(func.instrs[k].writes()) | _implicit_writes(func.instrs[k]):
            first_write.setdefault(u, k)
    inner = {k for j in range(t, b + 1) for s in func.successors(j) if t < s <= j
             for k in range(s, j + 1)}  # the bodies of loops nested in this one
    variant: set[tuple[str, int]] = set()
    changed = True
    while changed:
        changed = False
        for k in range(t, b + 1):
            ins = func.instrs[k]
            outs = (isa.units(ins.writes()) | _implicit_writes(ins)) - variant
            if not outs:
                continue
            reads = isa.units(ins.reads())
            carried = {u for u in reads if first_write.get(u, -1) >= k}
            if k in inner:
                carried |= reads & isa.units(ins.writes())
            if reads & variant or carried or ins.mnemonic.startswith(("s_memtime", "s_memrealtime",
                                                                      "s_getreg")):
                variant |= outs
                changed = True
    return variant


def poll_loops(func: isa.Function) -> list[tuple[int, int, int]]:
    """(loop head, back-branch, poll load) for loops that wait on a value another agent
    writes: a memory load from a loop-invariant address (one flag re-read each time; a
    reduction or quantization loop walks addresses) whose value decides the exit - the
    last write of the branch's condition (vcc/exec/scc) before it is computed from it."""
    loops = []
    for b, ins in enumerate(func.instrs):
        t = func.target_index(b) if ins.is_conditional else None
        if t is None or t > b:
            continue
        cond = _COND_REG.get(ins.mnemonic.removeprefix("s_cbranch_"))
        if cond is None:
            continue
        variant = _loop_variant(func, t, b)
        for i in range(t, b):
            ld = func.instrs[i]
            if not (ld.is_vmem and ld.is_load) or ld.mnemonic.startswith("scratch_") \
                    or isa.units(ld.reads()) & variant:
                continue  # (scratch: this thread's private memory, which no other agent writes)
            taint = isa.units(ld.writes())
            for k in range(i + 1, b):
                nxt = func.instrs[k]
                outs = isa.units(nxt.writes()) | _implicit_writes(nxt)
                if isa.units(nxt.reads()) & taint and not nxt.is_load:
                    taint |= outs
                else:
                    taint -= outs
            if any(f == cond for f, _ in taint):
                loops.append((t, b, i))
                break
    return loops


def _is_flag_store(ins: isa.Instr) -> bool:
    if not ins.is_vmem:
        return False
    if ins.is_atomic:
        return True
    # sc1: agent or system scope (an atomic store's spelling); `nt` alone is a nontemporal
    # (streaming) hint on a data store (`__builtin_nontemporal_store`), not a flag
    return ins.is_store and "sc1" in _bits(ins)


def _is_data_write(ins: isa.Instr) -> bool:
    """A plain store: the data a flag publishes (flags and atomics are not data, nor a
    `scratch_` store to a thread's private memory)."""
    return _is_shared_write(ins) and ins.is_store and not _is_flag_store(ins)


def _waits_all_vm(ins: isa.Instr) -> bool:
    if ins.mnemonic != "s_waitcnt":
        return False
    text = " ".join(ins.operands + ins.modifiers)
    return "vmcnt(0)" in text or text.strip() == "0"


def check_sync(funcs: list[isa.Function], path: str) -> list[Finding]:
    """Every release/acquire check over the functions of one listing."""
    out: list[Finding] = []
    for func in funcs:
        loops = poll_loops(func)
        lds = lds_pointer_accesses(func)
        has_wt = any(i.is_store and {"sc0", "sc1"} <= _bits(i) for k, i in enumerate(func.instrs) if k not in lds)
        preds = predecessors(func)
        final: dict[int, int] = {}  # arrive -> poll of a barrier after whose wait nothing is read
        for head, back, poll in loops:
            arrive, before = _arrive(func, head, back, poll, preds)
            start = arrive is not None and not any(  # (a call before it may store anything)
                _is_shared_write(func.instrs[k]) or _is_call(func.instrs[k]) for k in before if k != arrive)
            out += _check_acquire(func, path, head, back, poll, func.instrs[arrive] if start else None)
            if arrive is not None and not _data_load_after(func, head, back, poll):
                final[arrive] = poll
        for f_idx, ins in enumerate(func.instrs):
            if not _is_flag_store(ins) or f_idx in lds:
                continue
            if f_idx in final:
                out.append(checks.SYNC_SCOPE.finding(
                    path, ins.line, f"flag `{ins.mnemonic}` ({access_scope(ins)}); release: none "
                    f"needed - the arrive of a final barrier: nothing is read after its wait "
                    f"(line {func.instrs[final[f_idx]].line}), so it publishes nothing another rank "
                    f"reads in this kernel, assuming every rank runs this same code", ins.text))
                continue
            if loops or has_wt:
                out += _check_release(func, path, f_idx, preds)
            elif ins.is_atomic:  # an arrival: only other waves' data (across a barrier) count
                out += _check_release(func, path, f_idx, preds, after_barrier_only=True)
    return out


def _check_acquire(func, path, head, back, poll, start_arrive: isa.Instr | None = None) -> list[Finding]:
    """[acquire-missing] on the paths out of one poll loop; `start_arrive`: the loop is the
    wait of a start barrier (its arrive stores the value waited for and no store to shared
    memory may run before it), which publishes nothing written in the kernel: what is read
    after it was written before the launch, so no acquire is needed (said in sync-scope)."""
    p = func.instrs[poll]
    seen: set[tuple[int, bool]] = set()
    stack: list[tuple[int, isa.Instr | None]] = [(s, None) for s in func.successors(poll)]
    steps, out, scopes = 0, [], set()
    while stack and steps < _STEP_LIMIT:
        i, inv = stack.pop()
        steps += 1
        if i >= len(func.instrs) or (i, inv is not None) in seen:
            continue
        seen.add((i, inv is not None))
        ins = func.instrs[i]
        if ins.mnemonic.startswith("buffer_inv"):
            inv = ins
        elif _is_return(ins) and inv is not None:
            scopes.add(f"`{inv.text}` at line {inv.line} before the return to its callers: {fence_scope(inv)}")
        elif _is_return(ins) and start_arrive is None:
            # an out-of-line wait: its callers read what the flag publishes, in functions this
            # walk does not enter - unacquired on this path, never "no data load follows"
            out.append(checks.ACQUIRE_MISSING.finding(
                path, ins.line,
                f"the poll loop at line {p.line} is in an out-of-line function that returns "
                f"(`{ins.text}`) with no `buffer_inv` (acquire) on some path: its callers read "
                f"the data the flag publishes after the call, and this check does not follow "
                f"them into the caller - acquire in the wait itself (a `buffer_inv` after the loop, "
                f"or an acquire load)", f"{p.text}\n...\n{ins.text}"))
            break
        elif _is_data_load(ins) and not head <= i <= back and i not in lds_pointer_accesses(func):
            if inv is not None:
                scopes.add(f"`{inv.text}` at line {inv.line}: {fence_scope(inv)}")
            elif "sc1" in _bits(ins):
                scopes.add(f"the load itself: {access_scope(ins)}")
            elif start_arrive is not None:
                scopes.add(f"none needed - a start barrier: its arrive `{start_arrive.mnemonic}` at line "
                           f"{start_arrive.line} stores the value it waits for and no store to memory "
                           f"other agents read comes before it, so the loads after it read data written "
                           f"before the launch, assuming every rank runs this same code")
            else:
                out.append(checks.ACQUIRE_MISSING.finding(
                    path, ins.line,
                    f"`{ins.mnemonic}` after the poll loop at line {p.line} is not preceded by "
                    f"a `buffer_inv` (acquire) on some path, and has no sc1 bit: it may read "
                    f"stale vL1/L2 lines of the data the flag publishes",
                    f"{p.text}\n...\n{ins.text}"))
                break
            continue  # one data load per path is enough
        stack.extend((s, inv) for s in func.successors(i))
    if not out:
        where = "; ".join(sorted(scopes)) or "no data load follows"
        out.append(checks.SYNC_SCOPE.finding(path, p.line,
                           f"poll `{p.mnemonic}` ({access_scope(p)}); acquire: {where}", p.text))
    return out


def _check_release(func, path, f_idx, preds, after_barrier_only: bool = False) -> list[Finding]:
    """Walk back from a flag store: every data store reaching it must be waited for
    (`s_waitcnt vmcnt(0)`), and written back (`buffer_wbl2`) when the flag is written
    through. Stores of other waves (before an `s_barrier`) are data whatever their bits:
    the MI355 megakernel PR's TopK block wrote its data write-through too. `after_barrier_only`: an atomic
    in a function that neither polls nor writes through is a release only of what other
    waves stored before a barrier (a relaxed counter after this wave's own stores is not a
    flag)."""
    flag = func.instrs[f_idx]
    flag_wt = flag.is_store and {"sc0", "sc1"} <= _bits(flag)
    seen: set[tuple[int, bool, bool, bool]] = set()
    stack = [(p, False, None, False) for p in preds.get(f_idx, [])]
    steps, out, fences = 0, [], set()
    while stack and steps < _STEP_LIMIT:
        i, waited, wb, crossed = stack.pop()
        steps += 1
        key = (i, waited, wb is not None, crossed)
        if key in seen:
            continue
        seen.add(key)
        ins = func.instrs[i]
        if _waits_all_vm(ins):
            waited = True
        elif ins.mnemonic.startswith("buffer_wbl2"):
            wb = ins
        elif ins.mnemonic == "s_barrier":
            crossed = True
        elif i in lds_pointer_accesses(func):
            pass  # a store to LDS through a generic pointer: this block's, never another agent's
        elif _is_data_write(ins) or (crossed and _is_shared_write(ins) and ins.is_store):
            if after_barrier_only and not crossed:
                continue
            who = ", made by every wave of the block before the s_barrier," if crossed else ""
            if not waited:
                out.append(checks.RELEASE_ORDER.finding(
                    path, flag.line,
                    f"`{ins.text}` (line {ins.line}){who} reaches the flag `{flag.mnemonic}` "
                    f"without `s_waitcnt vmcnt(0)` (or a release fence): the flag may become "
                    f"visible before that write" + (" - s_barrier orders execution, not "
                                                    "memory" if crossed else ""),
                    f"{ins.text}\n...\n{flag.text}"))
                return out
            if flag_wt and wb is None:
                out.append(checks.RELEASE_SCOPE.finding(
                    path, flag.line,
                    f"the flag is written through to memory (sc0 sc1) but `{ins.text}` "
                    f"(line {ins.line}) stays in this XCD's L2 with no `buffer_wbl2 sc1`: "
                    f"another XCD can see the flag before the data",
                    f"{ins.text}\n...\n{flag.text}"))
                return out
            fences.add(f"`{wb.text}`: {fence_scope(wb)}" if wb is not None
                       else "s_waitcnt only: the data reach this XCD's L2 (no write-back)")
            continue
        stack.extend((p, waited, wb, crossed) for p in preds.get(i, []))
    if after_barrier_only and not fences:
        return out  # a counter, not a release: nothing to say
    rel = "; ".join(sorted(fences)) or "no earlier write on any path"
    out.append(checks.SYNC_SCOPE.finding(path, flag.line,
                                         f"flag `{flag.mnemonic}` ({access_scope(flag)}); release: {rel}",
                                         flag.text))
    return out
