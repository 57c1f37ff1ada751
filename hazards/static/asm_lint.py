"""Source lint for inline asm: outputs that may be written before a later input is read.

A multi-instruction `asm` block whose register outputs are not early-clobber (`"=v"` rather
than `"=&v"`) lets the compiler give an output the same register as an input it considers
dead after the block. If an instruction writes that output and a *later* instruction of the
same block reads that input, the later instruction reads what the earlier one wrote: the
MI355 megakernel PR's four-load block, where load 1's destination `v[4:7]` covered
load 2's address `v[6:7]` (a garbage address: a nil-address fault or a wave parked on
`s_waitcnt` forever).

The rule, per asm statement with >= 2 instructions: an output operand without `&` that an
instruction writes (AMDGCN: the destination position; other ISAs: any mention, to be safe),
and a register input read by a later instruction. Tied inputs (`"0"`), in-out operands
(`"+v"`), immediates and memory operands cannot alias an output register and are ignored.
PTX templates (NVIDIA) are skipped: nvcc gives every asm operand its own virtual register and
ptxas allocates after that, so the overlap cannot arise there.

Reviewed blocks are silenced by a comment on the statement's lines or the line above:
``// hazards: allow(early-clobber) <reason>`` (the reason is required).
"""
from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Iterable

from hazards.static import checks, cscan
from hazards.static.amdgcn_isa import parse_instr
from hazards.static.findings import Finding

SOURCE_SUFFIXES = frozenset({".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".hxx", ".cu",
                             ".cuh", ".hip", ".inl", ".ipp", ".inc"})
SKIP_DIRS = frozenset({".git", ".hg", "build", ".hazards", "node_modules", "__pycache__",
                       ".venv", "venv", "site-packages", ".tox", ".pytest_cache",
                       ".hypothesis", ".mypy_cache", "dist"})
MAX_FILE_BYTES = 4 << 20
_ALLOW_RE = re.compile(r"hazards:\s*allow\(([^)]*)\)\s*(.*)")
_AMD_MNEMONIC = re.compile(r"^(v_|s_|ds_|global_|buffer_|flat_|scratch_|exp\b|image_)")
_REF_RE = re.compile(r"%(?:[a-zA-Z])?(?:(\d+)|\[(\w+)\])")
_NON_REGISTER_LETTERS = set("moVXinEFpgIJKLMNOP<>")


@dataclasses.dataclass
class Instruction:
    index: int
    text: str
    refs: set[int]
    written: set[int]


def _resolve_refs(text: str, names: dict[str, int]) -> list[tuple[int, int, int]]:
    """(operand index, start, end) for each `%N` / `%[name]` reference (not `%%`)."""
    out = []
    for m in _REF_RE.finditer(text):
        if m.start() > 0 and text[m.start() - 1] == "%":
            continue
        idx = int(m.group(1)) if m.group(1) else names.get(m.group(2), -1)
        if idx >= 0:
            out.append((idx, m.start(), m.end()))
    return out


def dialect(template: str) -> str:
    """'amdgcn', 'ptx' or 'generic' from the mnemonics a template uses."""
    mnems = []
    for line in re.split(r"[\n;]", template):
        tok = line.strip().split()
        if tok and not tok[0].endswith(":") and not tok[0].startswith(("//", "#", ".", "{", "}")):
            mnems.append(tok[0])
    if any(_AMD_MNEMONIC.match(m) for m in mnems):
        return "amdgcn"
    if "{" in template or any("." in m for m in mnems):
        return "ptx"
    return "generic"


def split_instructions(template: str, names: dict[str, int], kind: str) -> list[Instruction]:
    """The instructions of a template, each with the operands it mentions and writes."""
    out: list[Instruction] = []
    lines = template.split("\n") if kind == "amdgcn" else re.split(r"[\n;]", template)
    for raw in lines:
        line = re.split(r"//|;" if kind == "amdgcn" else r"//|#", raw)[0].strip()
        line = re.sub(r"^\w+:\s*", "", line)  # a label before the instruction
        if not line or line.startswith("."):
            continue
        refs = _resolve_refs(line, names)
        written: set[int] = set()
        if kind == "amdgcn":
            ins = parse_instr(0, line)
            if ins is not None and ins.has_dest and ins.operands:
                first = ins.operands[0]
                written = {i for i, _, _ in _resolve_refs(first, names)}
        else:
            written = {i for i, _, _ in refs}  # destination position unknown: any mention
        out.append(Instruction(len(out), line, {i for i, _, _ in refs}, written))
    return out


def _is_register_input(op: cscan.Operand) -> bool:
    for alt in op.constraints or [""]:
        letters = re.sub(r"[=+&%*!?#,\s]", "", alt)
        if letters.isdigit():
            return False
        if any(ch not in _NON_REGISTER_LETTERS for ch in letters):
            return True
    return False


def _may_lack_early_clobber(op: cscan.Operand) -> bool:
    cons = op.constraints or [""]
    return any(c.startswith("=") and "&" not in c and
               any(ch not in _NON_REGISTER_LETTERS for ch in re.sub(r"[=&%*!?#,\s]", "", c))
               for c in cons)


def _classes(op: cscan.Operand) -> set[str]:
    """Register-class letters an operand may use (AMDGPU: v, s, a; '*' = unknown/any)."""
    out: set[str] = set()
    for alt in op.constraints or [""]:
        for ch in re.sub(r"[=+&%*!?#,\s\d]", "", alt):
            if ch not in _NON_REGISTER_LETTERS:
                out.add(ch if ch in "vsa" else "*")
    return out or {"*"}


def _may_share(a: cscan.Operand, b: cscan.Operand, kind: str) -> bool:
    """Whether the allocator could give both operands the same registers."""
    if kind != "amdgcn":
        return True
    ca, cb = _classes(a), _classes(b)
    return "*" in ca or "*" in cb or bool(ca & cb)


def check_statement(st: cscan.AsmStatement) -> str | None:
    """Why this asm statement is hazardous, or None."""
    kind = dialect(st.template)
    if kind == "ptx":
        return None
    names = {op.name: op.index for op in st.outputs + st.inputs if op.name}
    instrs = split_instructions(st.template, names, kind)
    if len(instrs) < 2:
        return None
    inputs = {op.index: op for op in st.inputs if _is_register_input(op)}
    for out_op in st.outputs:
        if not _may_lack_early_clobber(out_op):
            continue
        first_write = next((ins for ins in instrs if out_op.index in ins.written), None)
        if first_write is None:
            continue
        for later in instrs[first_write.index + 1:]:
            hit = sorted(i for i in later.refs
                         if i in inputs and _may_share(out_op, inputs[i], kind))
            if hit:
                inp = inputs[hit[0]]
                alts = " or ".join(f'"{c}"' for c in out_op.constraints)
                return (f"output %{out_op.index} ({alts} {out_op.expr}) is written by "
                        f"instruction {first_write.index + 1} (`{first_write.text}`) before "
                        f"instruction {later.index + 1} (`{later.text}`) reads input "
                        f"%{inp.index} (\"{(inp.constraints or [''])[0]}\" {inp.expr}); "
                        f"without early-clobber (\"=&...\") the compiler may give them "
                        f"overlapping registers")
    return None


def _allowed(scanned: cscan.Scanned, st: cscan.AsmStatement, path: str) -> tuple[bool, list[Finding]]:
    notes = []
    for line, text in scanned.comments:
        if not st.line - 1 <= line <= st.end_line:
            continue
        m = _ALLOW_RE.search(text)
        if not m:
            continue
        ids = {x.strip() for x in m.group(1).split(",")}
        if checks.EARLY_CLOBBER.id not in ids and "all" not in ids:
            continue
        if m.group(2).strip().strip("*/").strip():
            return True, []
        notes.append(checks.ALLOW_NO_REASON.finding(path, line,
                             "allowlist comment without a reason is ignored: write "
                             "`hazards: allow(early-clobber) <why this block is safe>`"))
    return False, notes


def _unresolved_note(st: cscan.AsmStatement, path: str, lines: list[str]) -> Finding | None:
    """An `info` finding for a block whose template the lint could not read in full.

    A template spelled through a function-like macro (or a name defined elsewhere) cannot be
    expanded without preprocessing, so an overlap in it would pass unseen; say so rather
    than count the block as checked. Only blocks that could have the hazard (a register
    output without early-clobber) are reported.
    """
    if not st.template_unresolved or dialect(st.template) == "ptx":
        return None
    if not any(_may_lack_early_clobber(op) for op in st.outputs):
        return None
    directives = {"if", "ifdef", "ifndef", "elif", "else", "endif", "defined"}
    unknown = set(st.template_unresolved)
    names = ", ".join(sorted(unknown - directives)) or "preprocessor conditionals"
    if unknown & directives and unknown - directives:
        names += " and #if blocks"
    return checks.ASM_UNCHECKED.finding(path, st.line,
                   f"not checked: the asm template uses {names}, which the lint cannot expand "
                   f"without preprocessing; `hazards static` checks the compiled code, or "
                   f"spell the template with string literals / object-like string macros",
                   "\n".join(lines[st.line - 1:st.end_line]))


def lint_text(text: str, path: str, *, honor_allowlist: bool = True,
              line_map: list[tuple[str, int]] | None = None) -> list[Finding]:
    """Findings for one source text. `line_map` maps lines of preprocessed text back."""
    if "asm" not in text:
        return []
    scanned = cscan.scan(text)
    lines = text.split("\n")
    out: list[Finding] = []
    for st in cscan.asm_statements(text, scanned):
        why = check_statement(st)
        if why is None:
            unchecked = _unresolved_note(st, path, lines)
            if unchecked is not None:
                out.append(unchecked)
            continue
        if honor_allowlist:
            ok, notes = _allowed(scanned, st, path)
            out += notes
            if ok:
                continue
        where, line = path, st.line
        if line_map and st.line - 1 < len(line_map) and line_map[st.line - 1][0]:
            where, line = line_map[st.line - 1]
        snippet = "\n".join(lines[st.line - 1:st.end_line])
        out.append(checks.EARLY_CLOBBER.finding(where, line, why, snippet))
    return out


def iter_sources(paths: Iterable[Path]) -> Iterable[Path]:
    """Every C-family source under `paths` (files are taken as given), skipping build dirs."""
    for p in paths:
        p = Path(p)
        if p.is_file():
            yield p
            continue
        if not p.is_dir():
            from hazards.engine.errors import UserError

            raise UserError(f"no such file or directory: {p}")
        for root, dirs, files in os.walk(p):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
            for name in sorted(files):
                if Path(name).suffix in SOURCE_SUFFIXES:
                    yield Path(root) / name


def lint_paths(paths: Iterable[Path], *, honor_allowlist: bool = True) -> list[Finding]:
    """Source-lint every C-family file under `paths`."""
    out: list[Finding] = []
    for f in iter_sources(paths):
        try:
            if f.stat().st_size > MAX_FILE_BYTES:
                if _mentions_asm(f):  # a skipped file must not read as a clean one
                    out.append(checks.LINT_SKIPPED.finding(str(f), 0,
                                       f"not linted: larger than {MAX_FILE_BYTES >> 20} MiB "
                                       f"and it contains `asm`"))
                continue
            text = f.read_text(errors="replace")
        except OSError as e:
            out.append(checks.LINT_SKIPPED.finding(str(f), 0,
                               f"not linted: cannot read it ({e.strerror or e})"))
            continue
        out += lint_text(text, str(f), honor_allowlist=honor_allowlist)
    return out


def _mentions_asm(path: Path, chunk: int = 1 << 20) -> bool:
    """Whether a (large) file contains `asm`, read in bounded chunks."""
    tail = b""
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            if b"asm" in tail + block:
                return True
            tail = block[-2:]
    return False
