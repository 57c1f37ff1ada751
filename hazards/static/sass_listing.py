"""The SASS listing as data, from `nvdisasm -c` or `cuobjdump -sass` text.

Instructions (with the registers they read and write, their address operands), functions with
their labels and control flow. The SASS checks (`hazards.static.sass`, `hazards.static.wgmma`)
and the families' SASS tests read listings through it.
"""
from __future__ import annotations

import dataclasses
import functools
import re

_INSTR_RE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL_RE = re.compile(r"^(\.L_x_\d+|[.\w$]+):")
_FUNC_RE = re.compile(r"^\s*\.text\.([\w$.]+):")
_PRED_RE = re.compile(r"^!?U?P[0-6T]$")
_MEM_LOADS = ("LDG", "LD", "LDS", "LDSM", "ATOMG", "ATOM", "ATOMS", "LDGSTS", "SUATOM", "SULD",
              "TLD", "LDL",
              "SYNCS")  # mbarrier ops: PHASECHK.TRANS64.TRYWAIT polls the barrier in smem
_MEM_STORES = ("STG", "ST", "STS", "STL", "RED", "REDG", "REDUX", "SUST", "SURED", "STSM")


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

    @property
    def routines(self) -> dict[int, str]:
        """Where each out-of-line device function in this kernel's listing starts -> its name.
        nvdisasm puts a copy of every `__noinline__` function the kernel calls after the
        kernel's body, under a `$KERNEL$CALLEE:` label (`$__internal_N_$...`: the compiler's
        own helpers); control reaches it only through a `CALL`."""
        found = self.__dict__.get("_routines")
        if found is None:
            found = self.__dict__["_routines"] = {
                at: name.rsplit("$", 1)[-1] or name for name, at in sorted(self.labels.items(), key=lambda x: x[1])
                if name.startswith("$") and at < len(self.instrs)}
        return found

    def routine_of(self, i: int) -> int | None:
        """The start of the out-of-line function instruction `i` belongs to (None: the
        kernel's own body)."""
        starts = [at for at in self.routines if at <= i]
        return max(starts) if starts else None

    def call_target(self, i: int) -> int | None:
        """Where the `CALL` at `i` jumps (None: not a call, or through a register)."""
        ins = self.instrs[i]
        m = re.search(r"\((\$[\w$.]+)\)", ins.text) if ins.base == "CALL" else None
        return self.labels.get(m.group(1)) if m else None

    def return_sites(self, i: int) -> list[int]:
        """Where a `RET` at `i` may return to: the instruction after every `CALL` of the
        out-of-line function `i` is in (none for the kernel's own body)."""
        calls = self.__dict__.get("_calls")
        if calls is None:
            calls = self.__dict__["_calls"] = {}
            for k in range(len(self.instrs) - 1):
                t = self.call_target(k)
                if t is not None:
                    calls.setdefault(t, []).append(k + 1)
        return calls.get(self.routine_of(i), [])

    def across_calls(self, i: int, stack: tuple[int, ...] = (), depth: int = 4) -> list[tuple[int, tuple[int, ...]]]:
        """Where control goes after `i` across out-of-line functions, with the return sites of
        the calls gone into (`stack`): a `CALL` into its callee (stepped over `depth` calls
        deep), a `RET` back to the latest call on `stack` or, with none, to the instruction
        after every call of its function (context-free: each caller may be the one). A
        predicated `@P RET` does both: it returns when its predicate holds and falls through
        when it does not."""
        ins = self.instrs[i]
        target = self.call_target(i)
        if target is not None and len(stack) < depth:
            return [(target, stack + (i + 1,))]
        here = [(s, stack) for s in self.successors(i)]
        if ins.base == "RET":
            back = [(stack[-1], stack[:-1])] if stack else [(r, ()) for r in self.return_sites(i)]
            return back + here  # (an unconditional RET has no successor of its own)
        return here

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
