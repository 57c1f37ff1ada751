"""Release/acquire sequences around flag stores and polls in gfx94x assembly.

On gfx942 (MI300: one L2 per XCD, several XCDs per agent) the memory model is spelled with
cache-coherence bits and cache maintenance instructions (LLVM AMDGPUUsage, "Memory Model
GFX942"); the sequences this checks are in docs/static-checks.md."""
from __future__ import annotations

from hazards.static import amdgcn_isa as isa
from hazards.static import checks
from hazards.static.findings import Finding

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


def _preds(func: isa.Function) -> dict[int, list[int]]:
    preds: dict[int, list[int]] = {}
    for i in range(len(func.instrs)):
        for s in func.successors(i):
            preds.setdefault(s, []).append(i)
    return preds


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
    return ins.mnemonic.startswith(("global_load", "flat_load", "buffer_load", "scratch_load"))


def _loop_variant(func: isa.Function, t: int, b: int) -> set[tuple[str, int]]:
    """Register units of the loop [t, b] whose value may differ between iterations: read
    before any write of them in the body (carried round the back edge) or computed from
    such a value; a load's result counts as invariant when its address is (a pointer
    re-read from one slot), the clock (`s_memtime`, `s_getreg`) does not."""
    first_write: dict[tuple[str, int], int] = {}
    for k in range(t, b + 1):
        for u in isa.units(func.instrs[k].writes()) | _implicit_writes(func.instrs[k]):
            first_write.setdefault(u, k)
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
            if not (ld.is_vmem and ld.is_load) or isa.units(ld.reads()) & variant:
                continue
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
    return ins.is_store and bool({"sc1", "nt"} & _bits(ins))


def _is_data_write(ins: isa.Instr) -> bool:
    """A plain store: the data a flag publishes (flags and atomics are not data)."""
    return ins.is_vmem and ins.is_store and not _is_flag_store(ins)


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
        has_wt = any(i.is_store and {"sc0", "sc1"} <= _bits(i) for i in func.instrs)
        for head, back, poll in loops:
            out += _check_acquire(func, path, head, back, poll)
        preds = _preds(func)
        for f_idx, ins in enumerate(func.instrs):
            if not _is_flag_store(ins):
                continue
            if loops or has_wt:
                out += _check_release(func, path, f_idx, preds)
            elif ins.is_atomic:  # an arrival: only other waves' data (across a barrier) count
                out += _check_release(func, path, f_idx, preds, after_barrier_only=True)
    return out


def _check_acquire(func, path, head, back, poll) -> list[Finding]:
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
        elif _is_data_load(ins) and not head <= i <= back:
            if inv is not None:
                scopes.add(f"`{inv.text}` at line {inv.line}: {fence_scope(inv)}")
            elif "sc1" in _bits(ins):
                scopes.add(f"the load itself: {access_scope(ins)}")
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
        elif _is_data_write(ins) or (crossed and ins.is_vmem and ins.is_store):
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
