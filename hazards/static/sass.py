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
import re
from pathlib import Path
from typing import Mapping

from hazards.static import checks
from hazards.static.compile import compile_cubin, disassemble
from hazards.static.findings import Finding

_INSTR_RE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL_RE = re.compile(r"^(\.L_x_\d+|[.\w$]+):")
_FUNC_RE = re.compile(r"^\s*\.text\.([\w$.]+):")
_PRED_RE = re.compile(r"^!?U?P[0-6T]$")
_MEM_LOADS = ("LDG", "LD", "LDS", "LDSM", "ATOMG", "ATOM", "ATOMS", "LDGSTS", "SUATOM", "SULD",
              "TLD", "LDL",
              "SYNCS")  # mbarrier ops: PHASECHK.TRANS64.TRYWAIT polls the barrier in smem
_FENCES = ("CCTL", "MEMBAR", "FENCE")
_WGMMA_RE = re.compile(r"\(C75(1[0-6])\) Potential Performance Loss: (wgmma[^\n]*)")


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
    def is_weak_global_load(self) -> bool:
        return self.base in ("LDG", "LD") and ".STRONG" not in self.opcode

    @property
    def is_acquire_fence(self) -> bool:
        return self.base in _FENCES and (self.base != "CCTL" or "IVALL" in self.opcode)

    def pred_writes(self) -> set[str]:
        if "SETP" not in self.opcode and self.base not in ("PLOP3", "R2P", "VOTE"):
            return set()
        return {op.lstrip("!") for op in self.operands[:2] if _PRED_RE.match(op) and "T" not in op}

    def reg_writes(self) -> set[str]:
        return set(re.findall(r"\bU?R\d+\b", self.operands[0])) if self.operands else set()

    def reg_reads(self) -> set[str]:
        return {r for op in self.operands[1:] for r in re.findall(r"\bU?R\d+\b", op)}


@dataclasses.dataclass
class SassFunction:
    name: str
    instrs: list[SassInstr]
    labels: dict[str, int]

    def successors(self, i: int) -> list[int]:
        ins = self.instrs[i]
        conditional = bool(ins.pred) and ins.pred not in ("@PT",)
        if ins.base in ("EXIT", "RET", "BRX", "JMX"):
            return [i + 1] if conditional and i + 1 < len(self.instrs) else []
        if ins.base in ("BRA", "JMP"):
            m = re.search(r"\((\.L_x_\d+)\)", ins.text)
            out = [self.labels[m.group(1)]] if m and m.group(1) in self.labels else []
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
    """Natural loops: for each back edge i -> t (t at or before i), t plus every
    instruction that reaches i without passing through t. Nested loops stay separate."""
    live = _reachable(func)
    preds: dict[int, list[int]] = {}
    for i in live:
        for s in func.successors(i):
            preds.setdefault(s, []).append(i)
    loops = []
    for i in sorted(live):
        for t in func.successors(i):
            if t > i or t not in live:
                continue
            body, stack = {t}, [i]
            while stack:
                x = stack.pop()
                if x in body:
                    continue
                body.add(x)
                stack.extend(preds.get(x, []))
            loops.append(body)
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
            if ins.pred and ins.pred != "@PT":
                preds.add(ins.pred.lstrip("@!"))
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


def _is_poll(func: SassFunction, loop: set[int]) -> int | None:
    """The index of a load whose value decides the loop's exit, if any: the last write of
    an exit branch's predicate before that branch reads (transitively) the loaded value."""
    body = sorted(loop)
    for b in body:
        br = func.instrs[b]
        if not br.pred or br.pred == "@PT" or all(s in loop for s in func.successors(b)):
            continue
        pred = br.pred.lstrip("@!")
        defs = [k for k in body if k < b and pred in func.instrs[k].pred_writes()]
        if not defs:
            continue
        d = defs[-1]
        for i in (k for k in body if k < d):
            ld = func.instrs[i]
            if not ld.is_load or ld.base in ("LDS", "LDSM"):
                continue
            taint = ld.reg_writes()
            for k in (k for k in body if i < k < d):
                ins = func.instrs[k]
                if ins.reg_reads() & taint:
                    taint |= ins.reg_writes()
                else:
                    taint -= ins.reg_writes()
            if func.instrs[d].reg_reads() & taint:
                return i
    return None


def check_polls(func: SassFunction, path: str) -> list[Finding]:
    """[poll-no-acquire] and the [sync-scope] note for every poll loop."""
    out = []
    for loop in _loops(func):
        p = _is_poll(func, loop)
        if p is None:
            continue
        poll = func.instrs[p]
        seen, stack, fence, bad = set(), [(s, False) for s in func.successors(p)], None, None
        while stack and bad is None:
            i, acquired = stack.pop()
            if (i, acquired) in seen or i >= len(func.instrs):
                continue
            seen.add((i, acquired))
            ins = func.instrs[i]
            if ins.is_acquire_fence:
                acquired, fence = True, fence or ins
            elif ins.is_weak_global_load and i not in loop and not acquired:
                bad = ins
                break
            stack.extend((s, acquired) for s in func.successors(i))
        if bad is not None:
            out.append(checks.POLL_NO_ACQUIRE.finding(
                path, bad.line,
                f"{func.name}: `{bad.opcode}` at /*{bad.addr:04x}*/ follows the poll "
                f"`{poll.opcode}` at /*{poll.addr:04x}*/ with no acquire in between (no "
                f"CCTL.IVALL / MEMBAR): it may read stale L1 lines of the data the flag "
                f"publishes; poll with ld.acquire.gpu or add __threadfence() after the loop",
                f"{poll.text}\n...\n{bad.text}"))
        else:
            scope = {"SYS": "system (volatile)", "GPU": "gpu"}.get(poll.opcode.split(".")[-1], poll.opcode)
            acq = f"`{fence.opcode}` at /*{fence.addr:04x}*/" if fence else "no weak load follows"
            out.append(checks.SYNC_SCOPE.finding(path, poll.line,
                               f"{func.name}: poll `{poll.opcode}` ({scope}); acquire: {acq}",
                               poll.text))
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


def compile_and_check(source: Path, *, arch: str = "sm_90a",
                      defines: Mapping[str, object] | None = None,
                      label: str | None = None) -> list[Finding]:
    """nvcc -cubin the source, then the ptxas-log and SASS checks."""
    build = compile_cubin(Path(source), arch=arch, defines=defines, label=label)
    return check_ptxas_log(build.log, str(source)) + check_cubin(build.path)
