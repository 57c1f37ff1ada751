"""Source lint for inline asm: outputs that may be written before a later input is read.

A multi-instruction `asm` block whose register outputs are not early-clobber (`"=v"` rather
than `"=&v"`) lets the compiler give an output the same register as an input it considers
dead after the block. If an instruction writes that output and a *later* instruction of the
same block reads that input, the later instruction reads what the earlier one wrote: the
MI355 megakernel PR's four-load block, where load 1's destination `v[4:7]` covered load 2's
address `v[6:7]` (a garbage address: a nil-address fault or a wave parked on `s_waitcnt`
forever). More in docs/static-checks.md.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import re
from pathlib import Path
from typing import Callable, Iterable

from hazards.engine.errors import ToolchainMissing
from hazards.static import checks, cscan
from hazards.static.amdgcn_isa import parse_instr
from hazards.static.findings import Finding

SOURCE_SUFFIXES = frozenset({".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".hxx", ".cu",
                             ".cuh", ".hip", ".inl", ".ipp", ".inc"})
SKIP_DIRS = frozenset({".git", ".hg", "build", ".hazards", "node_modules", "__pycache__",
                       ".venv", "venv", "site-packages", ".tox", ".pytest_cache",
                       ".hypothesis", ".mypy_cache", "dist"})
MAX_FILE_BYTES = 4 << 20
# Why a block was not checked (the keys of `FileReport.skipped`).
SKIP_REASONS = {
    "ptx": "PTX templates: nvcc gives every operand its own virtual register",
    "macro": "template built from macros the lint could not expand",
    "allowlisted": "allowlisted with a reason (`hazards: allow(early-clobber) ...`)",
}
_ALLOW_RE = re.compile(r"hazards:\s*allow\(([^)]*)\)\s*(.*)")
_AMD_MNEMONIC = re.compile(r"^(v_|s_|ds_|global_|buffer_|flat_|scratch_|exp\b|image_)")
_REF_RE = re.compile(r"%(?:[a-zA-Z])?(?:(\d+)|\[(\w+)\])")
_LABEL_RE = re.compile(r"^([A-Za-z_.$][\w.$]*(?:%=[\w.$]*)?|\d+)\s*:(?!:)\s*")
_LOCAL_REF_RE = re.compile(r"^(\d+)([fb])$")
_UNCONDITIONAL = re.compile(r"^(s_branch|s_setpc_b64|jmp|bra\.uni|b|br)$")
_NON_REGISTER_LETTERS = set("moVXinEFpgIJKLMNOP<>")
_DIRECTIVES = {"if", "ifdef", "ifndef", "elif", "else", "endif", "defined"}

# Preprocess a file: returns its text with `# N "file"` line markers, or raises ExpandError.
Expander = Callable[[Path], str]


class ExpandError(Exception):
    """The preprocessor could not expand a file (the message says why, in one line)."""


@dataclasses.dataclass
class Instruction:
    """One instruction of a template: the operands it mentions and writes, the labels that
    name it and the labels it may branch to."""

    index: int
    text: str
    refs: set[int]
    written: set[int]
    labels: list[str] = dataclasses.field(default_factory=list)
    targets: list[str] = dataclasses.field(default_factory=list)
    falls_through: bool = True


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
        line = _LABEL_RE.sub("", line.strip())
        tok = line.split()
        if tok and not tok[0].endswith(":") and not tok[0].startswith(("//", "#", ".", "{", "}")):
            mnems.append(tok[0])
    if any(_AMD_MNEMONIC.match(m) for m in mnems):
        return "amdgcn"
    if "{" in template or any("." in m for m in mnems):
        return "ptx"
    return "generic"


def split_instructions(template: str, names: dict[str, int], kind: str) -> list[Instruction]:
    """The instructions of a template, each with the operands it mentions and writes, the
    labels defined on it and the labels it branches to (an asm-written loop)."""
    out: list[Instruction] = []
    pending: list[str] = []
    lines = template.split("\n") if kind == "amdgcn" else re.split(r"[\n;]", template)
    for raw in lines:
        line = re.split(r"//|;" if kind == "amdgcn" else r"//|#", raw)[0].strip()
        while (lab := _LABEL_RE.match(line)) is not None:
            pending.append(lab.group(1))
            line = line[lab.end():]
        if not line or line.startswith("."):
            continue
        refs = _resolve_refs(line, names)
        written: set[int] = set()
        if kind == "amdgcn":
            ins = parse_instr(0, line)
            if ins is not None and ins.has_dest and ins.operands:
                written = {i for i, _, _ in _resolve_refs(ins.operands[0], names)}
        else:
            written = {i for i, _, _ in refs}  # destination position unknown: any mention
        mnemonic = line.replace("\t", " ").split(" ", 1)[0]
        words = re.findall(r"[\w.$%=]+", line[len(mnemonic):])
        out.append(Instruction(len(out), line, {i for i, _, _ in refs}, written, pending, words,
                               not _UNCONDITIONAL.match(mnemonic)))
        pending = []
    _resolve_targets(out)
    return out


_BRANCH = re.compile(r"^(s_branch|s_cbranch\w*|s_setpc\w*|j[a-z]*|b|b\.[a-z]+|b[a-z]{2}|cb[n]?z|tb[n]?z|"
                     r"bra(\.\w+)?|loop[a-z]*)$")


def _resolve_targets(instrs: list[Instruction]) -> None:
    """Keep only the label references of branch instructions: a named label of this block,
    or a GNU local label as `1b`/`1f` (a plain number is an immediate, not a label)."""
    named = {lab for ins in instrs for lab in ins.labels if not lab.isdigit()}
    for ins in instrs:
        mnemonic = ins.text.replace("\t", " ").split(" ", 1)[0]
        ins.targets = ([w for w in ins.targets if w in named or _LOCAL_REF_RE.match(w)]
                       if _BRANCH.match(mnemonic) else [])


def _target_index(instrs: list[Instruction], at: int, target: str) -> int | None:
    local = _LOCAL_REF_RE.match(target)
    if local:  # GNU local labels: `1b` = the nearest `1:` at or before, `1f` = after
        name, forward = local.group(1), local.group(2) == "f"
        cands = [k for k, ins in enumerate(instrs) if name in ins.labels]
        if forward:
            return next((k for k in cands if k > at), None)
        return next((k for k in reversed(cands) if k <= at), None)
    return next((k for k, ins in enumerate(instrs) if target in ins.labels), None)


def may_follow(instrs: list[Instruction]) -> list[set[int]]:
    """For each instruction, the instructions that may execute after it inside the block
    (later ones in a straight line; around a loop, those before it too, itself included)."""
    succ: list[list[int]] = []
    for k, ins in enumerate(instrs):
        nxt = [t for t in (_target_index(instrs, k, w) for w in ins.targets) if t is not None]
        if ins.falls_through and k + 1 < len(instrs):
            nxt.append(k + 1)
        succ.append(nxt)
    out = []
    for k in range(len(instrs)):
        seen: set[int] = set()
        stack = list(succ[k])
        while stack:
            j = stack.pop()
            if j not in seen:
                seen.add(j)
                stack.extend(succ[j])
        out.append(seen)
    return out


def _is_register_input(op: cscan.Operand) -> bool:
    for alt in op.constraints or [""]:
        letters = re.sub(r"[=+&%*!?#,\s]", "", alt)
        if letters.isdigit():
            return False
        if any(ch not in _NON_REGISTER_LETTERS for ch in letters):
            return True
    return False


def _has_register(constraint: str) -> bool:
    return any(ch not in _NON_REGISTER_LETTERS for ch in re.sub(r"[=+&%*!?#,\s]", "", constraint))


def _may_lack_early_clobber(op: cscan.Operand) -> bool:
    """A write-only output (`=`) some alternative of which has no `&`."""
    return any(c.startswith("=") and "&" not in c and _has_register(c) for c in op.constraints or [""])


def _read_write_without_early_clobber(op: cscan.Operand) -> bool:
    """A read-write output (`+`) some alternative of which has no `&`."""
    return any(c.startswith("+") and "&" not in c and _has_register(c) for c in op.constraints or [""])


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


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the lint concluded about one asm statement: `hazard` (with why), `clean`, or
    `skipped` (with a key of `SKIP_REASONS`)."""

    status: str
    reason: str = ""


# Whether the value of a read-write operand is undefined where the asm statement runs.
UndefinedValue = Callable[[cscan.Operand], bool]
# The expression an operand's variable was last assigned before the statement (or None).
AssignedValue = Callable[[cscan.Operand], "str | None"]


def check_statement(st: cscan.AsmStatement, undefined: UndefinedValue | None = None,
                    value_of: AssignedValue | None = None) -> Verdict:
    """The lint's verdict on one asm statement (`undefined` decides `"+"` operands; without
    it they are never flagged for an undefined value, only for one equal to an input -
    the same expression, or, with `value_of`, a variable assigned that input's value)."""
    kind = dialect(st.template)
    if kind == "ptx":
        return Verdict("skipped", "ptx")
    names = {op.name: op.index for op in st.outputs + st.inputs if op.name}
    instrs = split_instructions(st.template, names, kind)
    after = may_follow(instrs)
    inputs = {op.index: op for op in st.inputs if _is_register_input(op)}
    ties = _tied_inputs(st)
    for out_op in st.outputs:
        shareable = _shareable_inputs(out_op, inputs, kind, undefined, ties.get(out_op.index), value_of)
        if not shareable:
            continue
        for first in (ins for ins in instrs if out_op.index in ins.written):
            for later in sorted(after[first.index]):
                hit = sorted(i for i in instrs[later].refs if i in shareable)
                if hit:
                    value = ties.get(out_op.index) or out_op
                    same = bool(_values(value, value_of) & _values(inputs[hit[0]], value_of)) and not (
                        undefined is not None and undefined(value))
                    return Verdict("hazard", _why(out_op, inputs[hit[0]], first, instrs[later],
                                                  ties.get(out_op.index), same))
    return Verdict("clean")


def written_inputs(st: cscan.AsmStatement) -> list[tuple[cscan.Operand, Instruction]]:
    """AMDGCN: (input, instruction) where an instruction's destination is an operand the
    statement lists only as an input (not an output, not tied to one). The compiler assumes
    the input's register still holds the input after the block."""
    if dialect(st.template) != "amdgcn":
        return []  # elsewhere the destination position is not known
    names = {op.name: op.index for op in st.outputs + st.inputs if op.name}
    inputs = {op.index: op for op in st.inputs if _is_register_input(op)}
    out = []
    for ins in split_instructions(st.template, names, "amdgcn"):
        out += [(inputs[i], ins) for i in sorted(ins.written) if i in inputs]
    return out


def _shareable_inputs(out_op: cscan.Operand, inputs: dict[int, cscan.Operand], kind: str,
                      undefined: UndefinedValue | None,
                      tied: cscan.Operand | None = None,
                      value_of: AssignedValue | None = None) -> dict[int, cscan.Operand]:
    """The register inputs this output may be allocated onto. An output with an input tied
    to it (`"0"(x)`) holds that input's value on entry, like a `"+"` operand: it can share
    another input's register only when that value is undefined or the same value."""
    if _may_lack_early_clobber(out_op) and tied is None:
        return {i: op for i, op in inputs.items() if _may_share(out_op, op, kind)}
    if tied is None and not _read_write_without_early_clobber(out_op):
        return {}
    value = tied if tied is not None else out_op
    if undefined is not None and undefined(value):
        return {i: op for i, op in inputs.items() if _may_share(out_op, op, kind)}
    same = _values(value, value_of)
    return {i: op for i, op in inputs.items() if same & _values(op, value_of)}


def _values(op: cscan.Operand, value_of: AssignedValue | None) -> set[str]:
    """What an operand is known to hold: its expression, and the expression its variable was
    last assigned (`acc = x;` before the block: `acc` holds `x`)."""
    out = {_normalized(op.expr)} - {""}
    assigned = value_of(op) if value_of is not None else None
    return out | ({_normalized(assigned)} if assigned else set())


def _tied_inputs(st: cscan.AsmStatement) -> dict[int, cscan.Operand]:
    """Output index -> the input tied to it by a matching constraint (`"0"`, `"1"`, ...)."""
    out = {}
    for op in st.inputs:
        letters = re.sub(r"[=+&%*!?#,\s]", "", (op.constraints or [""])[0])
        if letters.isdigit():
            out[int(letters)] = op
    return out


def _normalized(expr: str) -> str:
    return re.sub(r"\s+", "", expr)


def _why(out_op: cscan.Operand, inp: cscan.Operand, first: Instruction, later: Instruction,
         tied: cscan.Operand | None = None, same_value: bool = False) -> str:
    alts = " or ".join(f'"{c}"' for c in out_op.constraints)
    if _may_lack_early_clobber(out_op) and not tied:
        how = "without early-clobber (\"=&...\") the compiler may give them overlapping registers"
    elif _normalized((tied or out_op).expr) == _normalized(inp.expr) or same_value:
        how = ("both carry the same value, so the compiler may pass them in one register; "
               "make the output early-clobber (\"+&...\")")
    else:
        how = ("its value is uninitialised here, so the compiler may give it any register, "
               "that input's included; initialise it or make it early-clobber (\"+&...\")")
    loop = " (around the asm-written loop)" if later.index <= first.index else ""
    return (f"output %{out_op.index} ({alts} {out_op.expr}) is written by instruction "
            f"{first.index + 1} (`{first.text}`) before instruction {later.index + 1} "
            f"(`{later.text}`){loop} reads input %{inp.index} "
            f"(\"{(inp.constraints or [''])[0]}\" {inp.expr}); {how}")


def undefined_at(scanned: cscan.Scanned, st: cscan.AsmStatement) -> UndefinedValue:
    """Whether a read-write operand's variable is undefined where `st` runs: it is declared
    in the enclosing code without an initializer, nothing mentions it between the
    declaration and the statement, and no loop between them could carry a value into it;
    or it is a reference parameter of the enclosing function and a call in this text
    passes it a variable that is undefined there (the value comes from the caller)."""
    def undefined(op: cscan.Operand) -> bool:
        m = re.match(r"\s*([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*|\.\s*\w+\s*)*$", op.expr)
        return bool(m) and (_declared_without_value(scanned, st.start, m.group(1))
                            or _reference_parameter_undefined(scanned, st.start, m.group(1)))
    return undefined


def _strip_qualifiers(head: str) -> str:
    """`head` without the trailing `const`, `noexcept`, `override`, `final` and blanks."""
    while True:
        trimmed = head.rstrip()
        for word in ("const", "noexcept", "override", "final"):
            if trimmed.endswith(word) and not (trimmed[-len(word) - 1:-len(word)] or " ").isidentifier():
                trimmed = trimmed[:-len(word)]
                break
        if trimmed == head:
            return head
        head = trimmed


_NOT_FUNCTIONS = {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype", "alignof"}


def _enclosing_function(scanned: cscan.Scanned, at: int) -> tuple[str, str, int] | None:
    """(name, parameter list, where the head starts) of the function whose body holds `at`:
    the innermost unmatched `{` before `at` that follows `name(params)`."""
    code = scanned.code
    depth = 0
    for m in reversed(list(re.finditer(r"[{}]", code[:at]))):
        if scanned.in_string(m.start()):
            continue
        if m.group(0) == "}":
            depth += 1
            continue
        if depth:
            depth -= 1
            continue
        head = code[max(0, m.start() - 400):m.start()]
        close = len(_strip_qualifiers(head)) - 1
        if close < 0 or head[close] != ")":
            continue  # a block, a class or namespace body, an initializer: look further out
        level, k = 0, close
        while k >= 0:
            level += (head[k] == ")") - (head[k] == "(")
            if level == 0:
                break
            k -= 1
        name = re.search(r"([A-Za-z_]\w*)\s*(?:<[^;{}()]*>\s*)?$", head[:max(k, 0)])
        if k < 0 or name is None or name.group(1) in _NOT_FUNCTIONS:
            continue
        return name.group(1), head[k + 1:close], m.start() - len(head) + name.start()
    return None


def _reference_parameter_undefined(scanned: cscan.Scanned, at: int, name: str) -> bool:
    """`name` is a `T& name` parameter of the function around `at`, and some call of that
    function in this text passes, in that position, a variable undefined at the call."""
    head = _enclosing_function(scanned, at)
    if head is None:
        return False
    fname, param_text, head_at = head
    params = [p.strip() for p in param_text.split(",")]
    pos = next((k for k, p in enumerate(params)
                if re.search(rf"&\s*{re.escape(name)}\s*$", p) and "&&" not in p), None)
    if pos is None:
        return False
    code = scanned.code
    for call in re.finditer(rf"\b{re.escape(fname)}\s*(?:<[^;{{}}()]*>\s*)?\(", code):
        if call.start() == head_at or scanned.in_string(call.start()):
            continue
        close = cscan._matching_paren(code, scanned, call.end() - 1)
        if close < 0:
            continue
        args = [code[a:b].strip() for a, b in cscan._split_top(code, scanned, call.end(), close, ",")]
        if pos < len(args) and re.fullmatch(r"[A-Za-z_]\w*", args[pos]) \
                and _declared_without_value(scanned, call.start(), args[pos]):
            return True
    return False


def _last_mention(scanned: cscan.Scanned, name: str, before: int) -> int:
    """Where `name` (a whole word, outside strings) last occurs before `before`, or -1."""
    code, end = scanned.code, before
    while (at := code.rfind(name, 0, end)) >= 0:
        word = (at == 0 or not (code[at - 1].isalnum() or code[at - 1] == "_")) and not (
            code[at + len(name):at + len(name) + 1].isalnum() or code[at + len(name):at + len(name) + 1] == "_")
        if word and not scanned.in_string(at):
            return at
        end = at
    return -1


def assigned_at(scanned: cscan.Scanned, st: cscan.AsmStatement) -> AssignedValue:
    """The expression a plain variable operand was last assigned before `st` (`acc = x;`,
    `T acc = x;`, `T acc{x};`), when nothing mentions the variable or that expression's
    names between the assignment and `st` and no loop between could change them."""
    code = scanned.code

    def value_of(op: cscan.Operand) -> str | None:
        if not re.fullmatch(r"[A-Za-z_]\w*", op.expr):
            return None
        at = _last_mention(scanned, op.expr, st.start)
        if at < 0:
            return None
        after = at + len(op.expr)
        rhs = re.match(r"\s*(?:=(?!=)|(?=[{(]))", code[after:st.start])
        if rhs is None:
            return None
        begin = after + rhs.end()
        end = code.find(";", begin, st.start)
        if end < 0:
            return None
        value = code[begin:end].strip()
        if value[:1] in "({" and value[-1:] in ")}":
            value = value[1:-1].strip()
        between = code[end:st.start]
        if not value or any(re.search(rf"\b{re.escape(n)}\b", between)
                            for n in re.findall(r"[A-Za-z_]\w*", value)) or _loop_between(code, end, st.start):
            return None
        return value
    return value_of


def _declared_without_value(scanned: cscan.Scanned, at: int, name: str) -> bool:
    code = scanned.code
    last = None
    for m in re.finditer(rf"\b{re.escape(name)}\b", code[:at]):
        if not scanned.in_string(m.start()):
            last = m
    if last is None:
        return False
    stmt_start = max(code.rfind(c, 0, last.start()) for c in ";{}") + 1
    head = code[stmt_start:last.start()].replace("\\\n", " ").lstrip()
    # A declaration statement: a type (and earlier declarators) before the name; not a
    # parameter, an argument, a condition, an assignment or a label.
    if not _DECLARATION_HEAD.match(head) or _NOT_A_TYPE.search(head):
        return False
    after = re.match(r"\s*(?:\[[^\]]*\]\s*)*([,;])", code[last.end():at])
    if not after:
        return False  # `= ...`, `{...}` or `(...)`: initialised
    return not _loop_between(code, last.end(), at)


_DECLARATION_HEAD = re.compile(r"^[A-Za-z_][\w\s:<>,*&\[\]]*[\s*&>]$")
_NOT_A_TYPE = re.compile(r"\b(?:return|case|goto|else|do|throw|co_return|co_yield|delete|new)\b|"
                         r"(?<!:):(?!:)")


def _loop_between(code: str, lo: int, hi: int) -> bool:
    """Whether a loop opened between `lo` and `hi` is still open at `hi` (a value may then
    come round from the previous iteration)."""
    stack: list[bool] = []
    for m in re.finditer(r"\b(?:for|while|do)\b|[{}]", code[lo:hi]):
        tok = m.group(0)
        if tok == "{":
            before = code[lo:lo + m.start()].rstrip()
            stack.append(before.endswith("do") or bool(re.search(r"\b(?:for|while)\s*\(", before[-200:])
                                                           and before.endswith(")")))
        elif tok == "}":
            if stack:
                stack.pop()
    tail = code[max(lo, hi - 300):hi].rstrip()
    braceless = bool(re.search(r"\b(?:for|while)\s*\([^;{}]*(?:;[^;{}]*){0,2}\)\s*$", tail)) or tail.endswith("do")
    return any(stack) or braceless


def _allowed(scanned: cscan.Scanned, st: cscan.AsmStatement, path: str) -> tuple[bool, list[Finding]]:
    """Whether an allowlist comment with a reason covers `st`: on one of its lines, or in the
    comment block right above it (the line above and the comment lines running up from it)."""
    notes = []
    commented = {line for line, _ in scanned.comments}
    first = st.line - 1
    while first - 1 in commented and first in commented:
        first -= 1
    for line, text in scanned.comments:
        if not first <= line <= st.end_line:
            continue
        m = _ALLOW_RE.search(text)
        if not m:
            continue
        ids = {x.strip() for x in m.group(1).split(",")}
        if checks.EARLY_CLOBBER.id not in ids and "all" not in ids:
            continue
        if m.group(2).strip().strip("*/").strip():
            return True, []
        notes.append(checks.ALLOW_NO_REASON.finding(
            path, line, "allowlist comment without a reason is ignored: write "
                        "`hazards: allow(early-clobber) <why this block is safe>`"))
    return False, notes


def _could_have_hazard(st: cscan.AsmStatement) -> bool:
    return any(_may_lack_early_clobber(op) or _read_write_without_early_clobber(op)
               for op in st.outputs)


def _needs_expansion(st: cscan.AsmStatement) -> bool:
    """A block the lint cannot read in full - its template or an output's constraint spelled
    through a function-like macro or a name defined elsewhere - that could have the hazard
    (an output constraint it cannot read might lack `&`)."""
    if dialect(st.template) == "ptx":
        return False
    if any(op.unresolved for op in st.outputs):
        return True
    return bool(st.template_unresolved) and _could_have_hazard(st)


def _unchecked_note(st: cscan.AsmStatement, path: str, lines: list[str], why: str,
                    line: int | None = None) -> Finding:
    unknown = set(st.template_unresolved) | {n for op in st.outputs for n in op.unresolved}
    names = ", ".join(sorted(unknown - _DIRECTIVES)) or "preprocessor conditionals"
    if unknown & _DIRECTIVES and unknown - _DIRECTIVES:
        names += " and #if blocks"
    return checks.ASM_UNCHECKED.finding(
        path, line or st.line,
        f"not checked: the asm block uses {names}, which the lint could not expand ({why}); "
        f"give the compile flags (-I/-D, or --compile-commands compile_commands.json) or check "
        f"the compiled code: `hazards static --compile {path} -- FLAGS`",
        "\n".join(lines[st.line - 1:st.end_line]))


@dataclasses.dataclass
class FileReport:
    """What the lint did with one file: its findings, and how many asm blocks it checked
    and skipped (by reason, keys of `SKIP_REASONS`)."""

    path: str
    findings: list[Finding] = dataclasses.field(default_factory=list)
    checked: int = 0
    skipped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    expanded: bool = False  # the preprocessor ran on it

    @property
    def blocks(self) -> int:
        return self.checked + sum(self.skipped.values())


@dataclasses.dataclass
class LintReport:
    """The lint over many files: every finding, per-file counts, files not linted."""

    files: list[FileReport] = dataclasses.field(default_factory=list)
    not_linted: list[str] = dataclasses.field(default_factory=list)

    @property
    def findings(self) -> list[Finding]:
        return [f for r in self.files for f in r.findings]

    @property
    def checked(self) -> int:
        return sum(r.checked for r in self.files)

    @property
    def skipped(self) -> collections.Counter:
        total: collections.Counter = collections.Counter()
        for r in self.files:
            total.update(r.skipped)
        return total

    def summary(self) -> str:
        """One line: files, blocks checked and skipped (and why)."""
        skipped = self.skipped
        why = ", ".join(f"{n} {k}" for k, n in sorted(skipped.items()))
        files = len(self.files)
        out = (f"{files} source file(s), {self.checked + sum(skipped.values())} asm block(s): "
               f"{self.checked} checked, {sum(skipped.values())} skipped" + (f" ({why})" if why else ""))
        if self.not_linted:
            out += f"; {len(self.not_linted)} file(s) not linted"
        return out


def _judge(text: str, path: str, *, honor_allowlist: bool, line_map, scanned=None,
           stmts=None) -> list[tuple[cscan.AsmStatement, Verdict, list[Finding]]]:
    """Each statement of `text` with its verdict and findings (hazards mapped back)."""
    scanned = scanned or cscan.scan(text)
    lines = text.split("\n")
    out = []
    for st in stmts if stmts is not None else cscan.asm_statements(text, scanned):
        verdict = check_statement(st, undefined_at(scanned, st), assigned_at(scanned, st))
        found: list[Finding] = []
        if verdict.status == "hazard" and honor_allowlist:
            ok, found = _allowed(scanned, st, path)
            if ok:
                verdict = Verdict("skipped", "allowlisted")
        where, line = path, st.line
        if line_map and st.line - 1 < len(line_map) and line_map[st.line - 1][0]:
            where, line = line_map[st.line - 1]
            where = path if _same_file(where, path) else where
        block = "\n".join(lines[st.line - 1:st.end_line])
        if verdict.status == "hazard":
            found.append(checks.EARLY_CLOBBER.finding(where, line, verdict.reason, block))
        written = written_inputs(st) if verdict.status != "skipped" or verdict.reason != "ptx" else []
        if written:  # one finding per block, naming every input it writes
            what = "; ".join(f"instruction {ins.index + 1} (`{ins.text}`) writes %{inp.index} "
                             f"(\"{(inp.constraints or [''])[0]}\" {inp.expr})" for inp, ins in written)
            found.append(checks.ASM_WRITES_INPUT.finding(
                where, line, f"{what}, which the block lists only as an input: the compiler assumes "
                f"an input's register still holds its value after the block (and may have put another "
                f"live value there); make it an output (\"+v\") or write a scratch output instead", block))
        out.append((st, verdict, found))
    return out


def lint_source(text: str, path: str, *, honor_allowlist: bool = True,
                line_map: list[tuple[str, int]] | None = None,
                expand: Expander | None = None) -> FileReport:
    """Lint one source text: findings and block counts. `line_map` maps lines of
    preprocessed text back; `expand` preprocesses the file when a template needs it."""
    report = FileReport(path)
    if "asm" not in text:
        return report
    scanned = cscan.scan(text)
    stmts = cscan.asm_statements(text, scanned)
    lines = text.split("\n")
    pending = []
    for st, verdict, found in _judge(text, path, honor_allowlist=honor_allowlist,
                                     line_map=line_map, scanned=scanned, stmts=stmts):
        # an output constraint chosen by `#if` is judged with the build's active defines
        # when a preprocessor is given (without one: every definition, conservatively)
        if _needs_expansion(st) or (expand is not None and any(op.conditional for op in st.outputs)):
            pending.append(st)
            continue
        report.findings += found
        _count(report, verdict)
    if pending:
        _expand_and_judge(report, text, path, pending, lines, expand, honor_allowlist)
    return report


def _count(report: FileReport, verdict: Verdict) -> None:
    if verdict.status == "skipped":
        report.skipped[verdict.reason] += 1
    else:
        report.checked += 1


def _expand_and_judge(report: FileReport, text: str, path: str, pending, lines,
                      expand: Expander | None, honor_allowlist: bool) -> None:
    """Judge the blocks whose templates need the preprocessor on its output, mapped back.

    A pending block written in the code is replaced by the expanded blocks on its lines; a
    pending block inside a `#define` by the expansions of macros elsewhere in this file
    (blocks the lint already read in full are not judged twice)."""
    if expand is None:
        return _leave_unchecked(report, path, pending, lines, "no preprocessor configured")
    try:
        pre = expand(Path(path))
    except ExpandError as e:
        return _leave_unchecked(report, path, pending, lines, f"preprocessing failed: {e}")
    except ToolchainMissing as e:  # could not look: an error (exit 3), never a quiet skip
        report.findings.append(checks.could_not_look(
            path, f"the lint of {len(pending)} asm block(s) built from macros (--no-expand skips them)", e))
        return _leave_unchecked(report, path, pending, lines, "clang-19 is not installed")
    report.expanded = True
    lmap = cscan.line_map(pre) or []
    read_in_full = [(st.line, st.end_line) for st in cscan.asm_statements(text)]
    in_define = [st for st in pending if _inside_define(lines, st.line)]
    resolved: set[int] = set()  # lines of the pending blocks now judged
    raw = cscan.scan(text)  # the preprocessed text has no comments: allowlists are read here
    for st, verdict, found in _judge(pre, path, honor_allowlist=False, line_map=lmap):
        src_file, src_line = lmap[st.line - 1] if st.line - 1 < len(lmap) else ("", 0)
        if not src_file or not _same_file(src_file, path):
            continue
        owner = next((p for p in pending if p.line <= src_line <= p.end_line), None)
        if owner is None and (not in_define or any(a <= src_line <= b for a, b in read_in_full)):
            continue
        if _needs_expansion(st):  # still not a literal after preprocessing
            report.findings.append(_unchecked_note(st, path, pre.split("\n"), "not a string "
                                                   "literal after preprocessing", src_line))
            report.skipped["macro"] += 1
            resolved |= {owner.line} if owner is not None else {p.line for p in in_define}
            continue
        if verdict.status == "hazard" and honor_allowlist:
            where = owner or dataclasses.replace(st, line=src_line, end_line=src_line)
            ok, notes = _allowed(raw, where, path)
            report.findings += notes
            if ok:
                verdict, found = Verdict("skipped", "allowlisted"), []
        report.findings += found
        _count(report, verdict)
        resolved |= {owner.line} if owner is not None else {p.line for p in in_define}
    left = [st for st in pending if st.line not in resolved]
    _leave_unchecked(report, path, [st for st in left if st not in in_define], lines,
                     "the preprocessed file has no such block: #if'd out with these flags?")
    _leave_unchecked(report, path, [st for st in left if st in in_define], lines,
                     "no expansion of the macro reached the code of this file")


def _leave_unchecked(report: FileReport, path: str, pending, lines, why: str) -> None:
    for st in pending:
        report.findings.append(_unchecked_note(st, path, lines, why))
        report.skipped["macro"] += 1


def _inside_define(lines: list[str], line: int) -> bool:
    """Whether source line `line` (1-based) is part of a `#define` (with continuations)."""
    k = line - 1
    while k > 0 and lines[k - 1].rstrip().endswith("\\"):
        k -= 1
    return bool(re.match(r"\s*#\s*define\b", lines[k]))


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.normpath(a) == os.path.normpath(b)


def lint_text(text: str, path: str, *, honor_allowlist: bool = True,
              line_map: list[tuple[str, int]] | None = None,
              expand: Expander | None = None) -> list[Finding]:
    """Findings for one source text (see `lint_source`)."""
    return lint_source(text, path, honor_allowlist=honor_allowlist, line_map=line_map,
                       expand=expand).findings


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


def lint_report(paths: Iterable[Path], *, honor_allowlist: bool = True,
                expand: Expander | None = None) -> LintReport:
    """Source-lint every C-family file under `paths`: findings and per-file block counts."""
    report = LintReport()
    for f in iter_sources(paths):
        try:
            if f.stat().st_size > MAX_FILE_BYTES:
                if _mentions_asm(f):  # a skipped file must not read as a clean one
                    report.not_linted.append(str(f))
                    report.files.append(FileReport(str(f), [checks.LINT_SKIPPED.finding(
                        str(f), 0, f"not linted: larger than {MAX_FILE_BYTES >> 20} MiB and it "
                                   f"contains `asm`")]))
                continue
            text = f.read_text(errors="replace")
        except OSError as e:
            report.not_linted.append(str(f))
            report.files.append(FileReport(str(f), [checks.LINT_SKIPPED.finding(
                str(f), 0, f"not linted: cannot read it ({e.strerror or e})")]))
            continue
        report.files.append(lint_source(text, str(f), honor_allowlist=honor_allowlist,
                                        expand=expand))
    return report


def lint_paths(paths: Iterable[Path], *, honor_allowlist: bool = True,
               expand: Expander | None = None) -> list[Finding]:
    """Source-lint every C-family file under `paths` (the findings of `lint_report`)."""
    return lint_report(paths, honor_allowlist=honor_allowlist, expand=expand).findings


def _mentions_asm(path: Path, chunk: int = 1 << 20) -> bool:
    """Whether a (large) file contains `asm`, read in bounded chunks."""
    tail = b""
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            if b"asm" in tail + block:
                return True
            tail = block[-2:]
    return False
