"""Hazard checks on AMDGCN assembly emitted by clang (gfx942; gfx950 mnemonics pass through).

Its check ids are registered in `hazards.static.checks`; what each one reads is in
docs/static-checks.md."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

from hazards.static import amdgcn_isa as isa
from hazards.static import checks, cscan, mfma_table
from hazards.static.compile import compile_amdgcn
from hazards.static.findings import Finding

_NON_REGISTER = set("moVXinEFp<>gsIJKLMNOP")  # GCC generic letters; AMDGPU's 's' handled below


def _operand_kind(op: cscan.Operand, *, tied_ok: bool = True) -> str:
    """o: output, e: early-clobber output, b: in-out, i: register input, t: tied, x: none."""
    cons = op.constraints or [""]
    c = cons[0]
    if op.is_output:
        if c.startswith("+"):
            return "b"
        return "e" if all("&" in alt for alt in cons) else "o"
    letters = re.sub(r"[=+&%*!?#,\s]", "", c)
    if letters.isdigit() and tied_ok:
        return "t"
    regs = [ch for ch in letters if ch in "vsa" or ch not in _NON_REGISTER]
    return "i" if regs or not letters else "x"


def annotate_source(text: str) -> tuple[str, list[cscan.AsmStatement]]:
    """`text` with a `; HZ_ASM <id> <kind>:%N | ...` comment line appended to every asm
    template, so the emitted listing says which registers each operand received."""
    stmts = cscan.asm_statements(text)
    pieces, last = [], 0
    for sid, st in enumerate(stmts):
        items = []
        for op in st.outputs + st.inputs:
            kind = _operand_kind(op)
            items.append(f"{kind}:" + ("-" if kind == "x" else f"%{op.index}"))
        if not items:
            continue
        pieces.append(text[last:st.template_end])
        pieces.append(f' "\\n; HZ_ASM {sid} ' + " | ".join(items) + '\\n"')
        last = st.template_end
    pieces.append(text[last:])
    return "".join(pieces), stmts


def _parse_annotation(ann: str) -> tuple[int, list[tuple[str, list[isa.Reg]]]] | None:
    head, _, rest = ann.partition(" ")
    if not head.isdigit():
        return None
    ops = []
    for item in rest.split("|"):
        kind, _, regs = item.strip().partition(":")
        ops.append((kind, isa.parse_regs(regs)))
    return int(head), ops


def _region_text(func: isa.Function, reg: isa.Region) -> str:
    return "\n".join(func.instrs[i].text for i in range(reg.first, reg.last + 1))


def check_asm_overlap(funcs: list[isa.Function], path: str,
                      stmts: list[cscan.AsmStatement] | None = None,
                      source_path: str | None = None,
                      line_map: list[tuple[str, int]] | None = None) -> list[Finding]:
    """[asm-overlap]: an output and an input of an asm region that got overlapping registers,
    with an instruction writing the output before one that may run after it (later, or
    around an asm-written loop) reads the input.

    Precise when the region carries its `; HZ_ASM` annotation and `stmts` (the annotated
    source's statements) are given: the template says which operand each instruction
    writes and reads, the annotation which registers each operand got. Otherwise the
    registers alone are compared (see `_overlap_reason`). `line_map` maps the statements'
    lines (preprocessed text) back to the user's source."""
    out: list[Finding] = []
    for func in funcs:
        for reg in func.regions:
            parsed = _parse_annotation(reg.annotation) if reg.annotation else None
            st = stmts[parsed[0]] if parsed and stmts is not None and parsed[0] < len(stmts) else None
            reasons = _template_overlaps(func, reg, st, parsed[1]) if st is not None else None
            if reasons is None:
                reasons = _register_overlaps(func, reg, _annotated_pairs(parsed) if parsed else None)
            if not reasons:
                continue
            line, where = reg.start_line, path
            if st is not None and source_path:
                line, where = st.line, source_path
                if line_map and st.line - 1 < len(line_map) and line_map[st.line - 1][0]:
                    where, line = line_map[st.line - 1]
            more = f" (+{len(reasons) - 1} more overlaps in this block)" if len(reasons) > 1 else ""
            out.append(checks.ASM_OVERLAP.finding(
                where, line,
                f"{reasons[0][1]}{more} [listing {path}:{reasons[0][0]}, function {func.name}]",
                _region_text(func, reg)))
    return out


def _template_overlaps(func: isa.Function, reg: isa.Region, st: cscan.AsmStatement,
                       ops: list[tuple[str, list[isa.Reg]]]) -> list[tuple[int, str]] | None:
    """(listing line, why) for each output/input pair that shares registers and is written
    then read in that order; None when the template's instructions do not match the
    region's one for one (then only registers can be compared)."""
    from hazards.static.asm_lint import may_follow, split_instructions

    names = {op.name: op.index for op in st.outputs + st.inputs if op.name}
    instrs = split_instructions(st.template, names, "amdgcn")
    if len(instrs) != reg.last - reg.first + 1:
        return None
    after = may_follow(instrs)
    kinds = {k: kind for k, (kind, _) in enumerate(ops)}
    units = {k: isa.units(regs) for k, (_, regs) in enumerate(ops)}
    reasons = []
    for ko in (k for k, kind in kinds.items() if kind in ("o", "b")):
        for ki in (k for k, kind in kinds.items() if kind == "i" and units[k] & units[ko]):
            pair = next(((i, j) for i, ins in enumerate(instrs) if ko in ins.written
                         for j in sorted(after[i]) if ki in instrs[j].refs), None)
            if pair is None:
                continue  # the input is read before the output is written: sharing is fine
            a, b = (func.instrs[reg.first + k] for k in pair)
            how = ('make the output early-clobber ("=&v")' if kinds[ko] == "o" else
                   'a read-write ("+") output shares an input\'s registers only when its value '
                   'is undefined or equal to that input: initialise it or make it "+&v"')
            loop = " (around the asm-written loop)" if pair[1] <= pair[0] else ""
            reasons.append((a.line, f"output %{ko} and input %{ki} were allocated overlapping "
                                    f"registers ({isa.describe_units(units[ko] & units[ki])}): "
                                    f"`{a.text}` writes %{ko} before `{b.text}`{loop} reads "
                                    f"%{ki}; {how}"))
    return reasons


def _register_overlaps(func: isa.Function, reg: isa.Region,
                       pairs: list[tuple[int, int, set]] | None) -> list[tuple[int, str]]:
    """(listing line, why) from registers alone: a write, then a read of the same registers
    by an instruction that may run after it inside the region."""
    reasons = []
    for i in range(reg.first, reg.last + 1):
        w = isa.units(func.instrs[i].writes())
        if not w:
            continue
        for j in sorted(_reach_in_region(func, reg, i)):
            hit = w & isa.units(func.instrs[j].reads())
            why = _overlap_reason(func, i, j, hit, pairs) if hit else None
            if why is not None:
                reasons.append((func.instrs[i].line, why))
    return reasons


def _reach_in_region(func: isa.Function, reg: isa.Region, start: int) -> set[int]:
    """Instructions of the region that may execute after `start` without leaving it."""
    seen: set[int] = set()
    stack = list(func.successors(start))
    while stack:
        k = stack.pop()
        if k in seen or not reg.first <= k <= reg.last:
            continue
        seen.add(k)
        stack.extend(func.successors(k))
    return seen


def _annotated_pairs(parsed) -> list[tuple[int, int, set]]:
    """(output index, input index, shared units) for every output/input register overlap."""
    _, ops = parsed
    outs = [(k, isa.units(r)) for k, (kind, r) in enumerate(ops) if kind in ("o", "e", "b")]
    ins = [(k, isa.units(r)) for k, (kind, r) in enumerate(ops) if kind in ("i", "b")]
    return [(ko, ki, uo & ui) for ko, uo in outs for ki, ui in ins if ko != ki and uo & ui]


def _overlap_reason(func: isa.Function, i: int, j: int, hit: set,
                    pairs: list[tuple[int, int, set]] | None) -> str | None:
    a, b = func.instrs[i], func.instrs[j]
    regs = isa.describe_units(hit)
    if pairs is not None:
        for ko, ki, shared in pairs:
            if shared & hit:
                return (f"output %{ko} and input %{ki} were allocated overlapping registers "
                        f"({isa.describe_units(shared)}): `{a.text}` writes {regs} before "
                        f"`{b.text}` reads it as input %{ki}; make the outputs early-clobber "
                        f"(\"=&v\")")
        return None  # a temporary the template itself writes and reads: intended
    # Bare listing: an input is a register the compiler materialised before the region
    # (e.g. `v_mov_b64 v[2:3], s[4:5]`) that a later instruction reads as that tuple; a
    # hard-coded temporary (clobbered, so never live into the region) does not qualify.
    region_first = min((k for k in range(min(i, j) + 1) if func.instrs[k].in_asm == a.in_asm), default=i)
    before = {str(r) for k in range(region_first) for r in func.instrs[k].writes()}
    r_tuples = [r for r in b.reads() if isa.units([r]) & hit and str(r) in before]
    if not r_tuples:
        return None
    w_tuples = sorted({str(r) for r in a.writes()})
    return (f"`{a.text}` writes {regs}, which `{b.text}` then reads as "
            f"{', '.join(map(str, r_tuples))}, a value computed before the asm block: the "
            f"allocator placed an output over an input; make the outputs early-clobber "
            f"(\"=&v\")")


def _reader_kind(reader: isa.Instr, dst: set) -> str | None:
    if reader.is_mfma:
        if isa.units(reader.sources(0)) & dst or isa.units(reader.sources(1)) & dst:
            return "srcab"
        c = reader.sources(2)
        if isa.units(c) & dst:
            return "srcc_full" if isa.units(c) == dst else "srcc_partial"
        return None
    if reader.is_valu:
        return "valu"
    if reader.is_vmem or reader.is_lds or reader.mnemonic.startswith("exp"):
        return "mem"
    return None


def check_mfma_waits(funcs: list[isa.Function], path: str, target: str = "any") -> list[Finding]:
    """[mfma-acc-read] read-after-MFMA wait states, [mfma-src-war] loads over in-flight MFMA
    sources, and [mfma-unknown-shape] for MFMAs the table does not know (a warning: they
    cannot be checked)."""
    out: list[Finding] = []
    for func in funcs:
        for m_idx, m in enumerate(func.instrs):
            if not m.is_mfma:
                continue
            shape = (mfma_table.lookup(m.mnemonic, target, m.text)
                     or mfma_table.lookup(m.mnemonic, "any", m.text))
            # (a gfx950 mnemonic in a gfx942 listing: inline asm passes through -S unassembled)
            if shape is None:
                out.append(checks.MFMA_UNKNOWN_SHAPE.finding(path, m.line,
                                   f"{m.mnemonic} is not in the wait-state table for "
                                   f"{target}; its hazards cannot be checked", m.text))
                continue
            out += _acc_read(func, m_idx, shape, path)
            out += _src_war(func, m_idx, shape, path)
    return out


def _acc_read(func: isa.Function, m_idx: int, shape, path: str) -> list[Finding]:
    m = func.instrs[m_idx]
    dst = isa.units(m.writes())
    cap = max(mfma_table.required_wait_states(shape, k)
              for k in ("valu", "mem", "srcab", "srcc_partial", "srcc_full")) + 1

    def stop(i: int) -> bool:
        ins = func.instrs[i]
        return bool(isa.units(ins.reads()) & dst) or dst <= isa.units(ins.writes())

    out = []
    for i, waited in sorted(isa.min_wait_reach(func, m_idx, cap, stop).items()):
        reader = func.instrs[i]
        if not isa.units(reader.reads()) & dst:
            continue
        kind = _reader_kind(reader, dst)
        if kind is None:
            continue
        need = mfma_table.required_wait_states(shape, kind)
        if waited < need:
            out.append(checks.MFMA_ACC_READ.finding(
                path, reader.line,
                f"`{reader.mnemonic}` reads the result of {m.mnemonic} (line {m.line}, "
                f"{shape.passes} passes, {shape.kind}) after {waited} wait states on some "
                f"path; it needs {need} ({kind} read; s_nop N provides N+1)",
                f"{m.text}\n...\n{reader.text}"))
    return out


def _src_war(func: isa.Function, m_idx: int, shape, path: str) -> list[Finding]:
    m = func.instrs[m_idx]
    srcs = isa.units(m.sources(0) + m.sources(1) + m.sources(2))
    dst = isa.units(m.writes())
    need = mfma_table.retire_wait_states(shape)

    def stop(i: int) -> bool:  # a dependent MFMA cannot issue before this one retired
        ins = func.instrs[i]
        return ins.is_mfma and bool(isa.units(ins.sources(2)) & dst)

    out = []
    for i, waited in sorted(isa.min_wait_reach(func, m_idx, need, stop).items()):
        ld = func.instrs[i]
        if not ld.is_load or (ld.in_asm < 0 and m.in_asm < 0):
            continue
        hit = isa.units(ld.writes()) & srcs
        if hit:
            out.append(checks.MFMA_SRC_WAR.finding(
                path, ld.line,
                f"`{ld.mnemonic}` writes {isa.describe_units(hit)}, a source of {m.mnemonic} "
                f"(line {m.line}) that may still be in flight ({waited} wait states since "
                f"issue, {need} to retire, no dependent MFMA in between); lgkmcnt/vmcnt say "
                f"when data lands, not when the MFMA finished reading - use a second bank",
                f"{m.text}\n...\n{ld.text}"))
    return out


def check_exit_parity(funcs: list[isa.Function], path: str) -> list[Finding]:
    """[mfma-exit-parity]: a load into MFMA operand registers dropped on some path out of its asm region."""
    out: list[Finding] = []
    for func in funcs:
        for reg in func.regions:
            span = range(reg.first, reg.last + 1)
            operand_units: set = set()
            for i in span:
                if func.instrs[i].is_mfma:
                    ins = func.instrs[i]
                    operand_units |= isa.units(ins.sources(0) + ins.sources(1))
            if not operand_units:
                continue
            for i in span:
                ld = func.instrs[i]
                bank = isa.units(ld.writes()) & operand_units if ld.is_load else set()
                if bank:
                    exit_line = _dropped_on(func, reg, i, bank)
                    if exit_line is not None:
                        out.append(checks.MFMA_EXIT_PARITY.finding(
                            path, ld.line,
                            f"the operands `{ld.mnemonic}` loads into "
                            f"{isa.describe_units(bank)} are never read by an MFMA on a path "
                            f"that leaves the loop at line {exit_line}: that exit consumes the "
                            f"other bank (each exit parity needs its own tail)",
                            ld.text))
    return out


def _dropped_on(func: isa.Function, reg: isa.Region, start: int, bank: set) -> int | None:
    """Line where a path from `start` leaves the region (or overwrites `bank`) unread."""
    seen: set[int] = set()
    stack = [(s, func.instrs[start].line) for s in func.successors(start)]
    while stack:
        i, last_line = stack.pop()
        if i < reg.first or i > reg.last:
            return last_line
        if i in seen:
            continue
        seen.add(i)
        ins = func.instrs[i]
        if ins.is_mfma and isa.units(ins.sources(0) + ins.sources(1)) & bank:
            continue  # consumed on this path
        if ins.is_load and isa.units(ins.writes()) & bank:
            return ins.line  # overwritten before being consumed
        if not func.successors(i):
            return ins.line
        stack.extend((s, ins.line) for s in func.successors(i))
    return None


def check_listing(text: str, path: str, *, target: str = "any",
                  stmts: list[cscan.AsmStatement] | None = None,
                  source_path: str | None = None,
                  line_map: list[tuple[str, int]] | None = None) -> list[Finding]:
    """Every AMDGCN check over one listing's text (`stmts`, `source_path`, `line_map`: see
    `check_asm_overlap`)."""
    from hazards.static import amdgcn_sync

    funcs = isa.parse_listing(text)
    m = re.search(r'\.amdgcn_target\s+"[^"]*--(gfx\w+)', text)
    target = m.group(1) if target == "any" and m else target
    return (check_asm_overlap(funcs, path, stmts, source_path, line_map)
            + check_mfma_waits(funcs, path, target)
            + check_exit_parity(funcs, path)
            + amdgcn_sync.check_sync(funcs, path))


def compile_annotated(source: Path, *, arch: str = "gfx942",
                      defines: Mapping[str, object] | None = None,
                      label: str | None = None):
    """(build, asm statements): `source` compiled by clang for `arch` with every asm
    template carrying its `; HZ_ASM` operand annotation."""
    source = Path(source)
    annotated, stmts = annotate_source(source.read_text(errors="replace"))
    build = compile_amdgcn(source, arch=arch, defines=defines, text=annotated, label=label)
    return build, stmts


def compile_and_check(source: Path, *, arch: str = "gfx942",
                      defines: Mapping[str, object] | None = None,
                      label: str | None = None) -> list[Finding]:
    """Compile `source` with clang for `arch` (operand-annotated) and run every AMDGCN check."""
    build, stmts = compile_annotated(source, arch=arch, defines=defines, label=label)
    return check_listing(build.text, str(build.path), target=arch, stmts=stmts,
                         source_path=str(source))
