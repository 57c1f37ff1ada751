"""AMDGCN assembly as data: registers as ranges, instructions with reads/writes, a CFG.

Parses the text clang-19 writes with `-S` for gfx9 targets (gfx942/gfx950): functions,
labels (including GNU local labels `1:` with `1f`/`1b` references inside inline asm),
`;;#ASMSTART`/`;;#ASMEND` inline-asm regions and the `; HZ_ASM` operand annotations that
`hazards.static.amdgcn` plants in templates. Registers are ranges per file, so `v[4:7]`
overlaps `v[6:7]`; which operand an instruction writes follows the ISA's operand order
(destination first, none for stores, atomics return only with `sc0`/`glc`).
"""
from __future__ import annotations

import dataclasses
import heapq
import re
from typing import Callable, Iterable

_REG_RE = re.compile(r"\b(v|s|a|ttmp)(?:(\d+)|\[(\d+):(\d+)\])")
_SPECIAL = {"vcc": ("vcc", 0, 1), "vcc_lo": ("vcc", 0, 0), "vcc_hi": ("vcc", 1, 1),
            "exec": ("exec", 0, 1), "exec_lo": ("exec", 0, 0), "exec_hi": ("exec", 1, 1),
            "m0": ("m0", 0, 0), "scc": ("scc", 0, 0)}
_LABEL_RE = re.compile(r"^([.\w$]+):")
_NO_DEST = re.compile(
    r"^(s_waitcnt|s_nop|s_barrier|s_branch|s_cbranch|s_endpgm|s_setprio|s_sleep|s_sethalt|"
    r"s_trap|s_icache_inv|s_dcache|s_cmp|s_bitcmp|s_sendmsg|s_setpc|s_set_gpr_idx|s_ttrace|"
    r"buffer_wbl2|buffer_inv|buffer_wbinvl1|buffer_gl|exp\b|s_store|s_buffer_store|"
    r"global_store|flat_store|buffer_store|scratch_store|ds_write|ds_store|ds_nop|"
    r"v_cmpx|s_waitcnt_|s_sched_barrier|sched_barrier|s_dcache_wb)")
_DS_DEST = re.compile(r"^ds_\w*(read|load|rtn|swizzle|permute|append|consume)")
_ATOMIC = re.compile(r"^(global|flat|buffer|scratch)_atomic")
_SECOND_DEST = re.compile(r"^(v_\w*_co_|v_div_scale|v_mad_u64_u32|v_mad_i64_i32|v_add_co|"
                          r"v_sub_co|v_subrev_co|v_addc_co|v_subb_co)")


@dataclasses.dataclass(frozen=True, order=True)
class Reg:
    """A register range: file ('v', 's', 'a', 'vcc', ...) and inclusive index bounds."""

    file: str
    lo: int
    hi: int

    def overlaps(self, other: "Reg") -> bool:
        return self.file == other.file and self.lo <= other.hi and other.lo <= self.hi

    def units(self) -> set[tuple[str, int]]:
        return {(self.file, i) for i in range(self.lo, self.hi + 1)}

    def __str__(self) -> str:
        if self.file in ("vcc", "exec", "m0", "scc"):
            return self.file
        return f"{self.file}{self.lo}" if self.lo == self.hi else f"{self.file}[{self.lo}:{self.hi}]"


def parse_regs(text: str) -> list[Reg]:
    """Every register named in an operand string (`v[4:7]`, `a3`, `vcc`, `-|v2|`)."""
    regs = [Reg(m.group(1), int(m.group(2) or m.group(3)), int(m.group(2) or m.group(4)))
            for m in _REG_RE.finditer(text)]
    for word in re.findall(r"[a-z_0-9]+", text):
        if word in _SPECIAL:
            regs.append(Reg(*_SPECIAL[word]))
    return regs


def units(regs: Iterable[Reg]) -> set[tuple[str, int]]:
    """The single-register units covered by some ranges (for overlap arithmetic)."""
    out: set[tuple[str, int]] = set()
    for r in regs:
        out |= r.units()
    return out


def describe_units(us: set[tuple[str, int]]) -> str:
    """`v[2:3]`-style text for a set of register units."""
    parts, by_file = [], {}
    for f, i in us:
        by_file.setdefault(f, []).append(i)
    for f in sorted(by_file):
        idx = sorted(by_file[f])
        start = prev = idx[0]
        for i in idx[1:] + [None]:
            if i is not None and i == prev + 1:
                prev = i
                continue
            parts.append(str(Reg(f, start, prev)))
            if i is not None:
                start = prev = i
    return ", ".join(parts)


@dataclasses.dataclass
class Instr:
    """One instruction line of a listing."""

    line: int
    text: str
    mnemonic: str
    operands: list[str]
    modifiers: list[str]
    in_asm: int = -1  # index of the ;;#ASMSTART region it lies in, -1 outside

    @property
    def is_mfma(self) -> bool:
        return self.mnemonic.startswith(("v_mfma", "v_smfmac"))

    @property
    def is_valu(self) -> bool:
        return self.mnemonic.startswith("v_") and not self.is_mfma

    @property
    def is_lds(self) -> bool:
        return self.mnemonic.startswith("ds_")

    @property
    def is_vmem(self) -> bool:
        return self.mnemonic.startswith(("global_", "buffer_", "flat_", "scratch_"))

    @property
    def is_atomic(self) -> bool:
        return bool(_ATOMIC.match(self.mnemonic))

    @property
    def is_load(self) -> bool:
        """A memory read that writes VGPRs when its data returns (VMEM, LDS, atomics-with-return)."""
        m = self.mnemonic
        if self.is_atomic:
            return self.has_dest
        return (m.startswith(("global_load", "buffer_load", "flat_load", "scratch_load"))
                or bool(_DS_DEST.match(m)))

    @property
    def is_store(self) -> bool:
        return self.mnemonic.startswith(("global_store", "buffer_store", "flat_store",
                                         "scratch_store", "ds_write", "ds_store"))

    @property
    def has_dest(self) -> bool:
        m = self.mnemonic
        if _NO_DEST.match(m) or not self.operands:
            return False
        if self.is_atomic:
            return "sc0" in self.modifiers or "glc" in self.modifiers
        if m.startswith("ds_"):
            return bool(_DS_DEST.match(m))
        if m.startswith(("buffer_load", "global_load", "flat_load", "scratch_load")):
            return "lds" not in self.modifiers
        return True

    def writes(self) -> list[Reg]:
        """Registers this instruction writes (explicit destinations only)."""
        if not self.has_dest:
            return []
        out = parse_regs(self.operands[0])
        if _SECOND_DEST.match(self.mnemonic) and len(self.operands) > 2:
            out += parse_regs(self.operands[1])
        return out

    def reads(self) -> list[Reg]:
        """Registers this instruction reads (every explicit operand that is not a destination)."""
        skip = 0
        if self.has_dest:
            skip = 2 if _SECOND_DEST.match(self.mnemonic) and len(self.operands) > 2 else 1
        out: list[Reg] = []
        for op in self.operands[skip:]:
            out += parse_regs(op)
        return out

    def sources(self, index: int) -> list[Reg]:
        """Registers of source operand `index` (0 = first operand after the destination)."""
        pos = index + (1 if self.has_dest else 0)
        return parse_regs(self.operands[pos]) if pos < len(self.operands) else []

    @property
    def branch_target(self) -> str | None:
        if self.mnemonic == "s_branch" or self.mnemonic.startswith("s_cbranch"):
            return self.operands[0] if self.operands else None
        return None

    @property
    def is_conditional(self) -> bool:
        return self.mnemonic.startswith("s_cbranch")

    @property
    def ends_wave(self) -> bool:
        return self.mnemonic in ("s_endpgm", "s_endpgm_saved", "s_setpc_b64", "s_trap")

    def wait_states(self) -> int:
        """Wait states this instruction itself provides: `s_nop N` gives N+1, others 1."""
        if self.mnemonic == "s_nop" and self.operands:
            try:
                return int(self.operands[0], 0) + 1
            except ValueError:
                return 1
        return 1


def parse_instr(line_no: int, text: str) -> Instr | None:
    """One instruction from a code line (comments and directives give None)."""
    code = re.split(r";|//", text, maxsplit=1)[0].strip()
    if not code or code.startswith(".") or _LABEL_RE.match(code):
        return None
    # Inline asm reaches the listing verbatim, so the mnemonic may end in a tab.
    mnem, _, rest = code.replace("\t", " ").partition(" ")
    ops, depth, cur = [], 0, ""
    for ch in rest:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            ops.append(cur.strip())
            cur = ""
        else:
            cur += ch
    mods: list[str] = []
    if cur.strip():
        last = cur.strip().split()
        ops.append(last[0])
        mods = last[1:]
    # Modifiers such as `offset:16` or `sc0` may also trail earlier; keep them all.
    mods = [m for m in mods if m]
    return Instr(line_no, text.strip(), mnem.strip(), ops, mods)


@dataclasses.dataclass
class Region:
    """An inline-asm region (`;;#ASMSTART` .. `;;#ASMEND`): instruction index range."""

    index: int
    start_line: int
    end_line: int
    first: int  # first instruction index (may equal `last` + 1 for an empty region)
    last: int
    annotation: str = ""  # text after `; HZ_ASM ` inside the region, if any


@dataclasses.dataclass
class Function:
    """One function of a listing: its instructions, labels, inline-asm regions and CFG."""

    name: str
    line: int
    instrs: list[Instr]
    labels: dict[str, int]
    local_labels: list[tuple[str, int]]  # GNU numeric labels in order: (name, instr index)
    regions: list[Region]

    def target_index(self, i: int) -> int | None:
        """Instruction index a branch at `i` jumps to (None when unresolved)."""
        tgt = self.instrs[i].branch_target
        if tgt is None:
            return None
        m = re.fullmatch(r"(\d+)([fb])", tgt)
        if m:
            name, fwd = m.group(1), m.group(2) == "f"
            cands = [idx for (n, idx) in self.local_labels if n == name]
            if fwd:
                return next((idx for idx in cands if idx > i), None)
            return next((idx for idx in reversed(cands) if idx <= i), None)
        return self.labels.get(tgt)

    def successors(self, i: int) -> list[int]:
        """Where control goes after instruction `i` (indices; len(instrs) = function end)."""
        ins = self.instrs[i]
        if ins.ends_wave:
            return []
        tgt = self.target_index(i)
        if ins.branch_target is not None:
            out = [] if tgt is None else [tgt]
            if ins.is_conditional:
                out.append(i + 1)
            return [s for s in out if s <= len(self.instrs)]
        return [i + 1]


def parse_listing(text: str) -> list[Function]:
    """The functions of an AMDGCN `.s` listing: each starts at an unindented symbol label."""
    funcs: list[Function] = []
    cur: Function | None = None
    region: tuple[int, int] | None = None
    annotation = ""
    in_metadata = False
    for no, raw in enumerate(text.split("\n"), start=1):
        stripped = raw.strip()
        if stripped.startswith((".amdgpu_metadata", ".end_amdgpu_metadata")):
            in_metadata = stripped.startswith(".amdgpu_metadata")
            cur = None
            continue
        if not stripped or in_metadata:
            continue
        lab = _LABEL_RE.match(stripped)
        if (lab and region is None and not raw[:1].isspace()
                and not lab.group(1).startswith((".", "$")) and not lab.group(1).isdigit()):
            cur = Function(lab.group(1), no, [], {}, [], [])
            funcs.append(cur)
            continue
        if cur is None:
            continue
        if stripped.startswith(";;#ASMSTART"):
            region, annotation = (no, len(cur.instrs)), ""
            continue
        if stripped.startswith(";;#ASMEND") and region is not None:
            cur.regions.append(Region(len(cur.regions), region[0], no, region[1],
                                      len(cur.instrs) - 1, annotation))
            region = None
            continue
        if stripped.startswith("; HZ_ASM ") and region is not None:
            annotation = stripped[len("; HZ_ASM "):]
            continue
        if lab:
            name = lab.group(1)
            if name.isdigit():
                cur.local_labels.append((name, len(cur.instrs)))
            else:
                cur.labels[name] = len(cur.instrs)
            stripped = stripped[lab.end():].strip()
            if not stripped:
                continue
        ins = parse_instr(no, stripped)
        if ins is not None:
            ins.in_asm = len(cur.regions) if region is not None else -1
            cur.instrs.append(ins)
    return [f for f in funcs if f.instrs]


def min_wait_reach(func: Function, start: int, cap: int,
                   stop: Callable[[int], bool] | None = None) -> dict[int, int]:
    """Fewest wait states that can have elapsed between instruction `start` and each
    instruction reachable from it (over every control-flow path, loops included).

    The wait states of the instructions strictly between the two are summed (`s_nop N`
    counts N+1, anything else 1). Exploration stops at an instruction for which `stop`
    says so (it is still reported) and once `cap` wait states have passed.
    """
    best: dict[int, int] = {}
    heap = [(0, s) for s in func.successors(start)]
    heapq.heapify(heap)
    while heap:
        w, i = heapq.heappop(heap)
        if i >= len(func.instrs) or w >= cap or best.get(i, cap) <= w:
            continue
        best[i] = w
        if stop is not None and stop(i):
            continue
        step = func.instrs[i].wait_states()
        for s in func.successors(i):
            heapq.heappush(heap, (w + step, s))
    return best
