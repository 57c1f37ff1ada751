"""A small C/C++/CUDA/HIP scanner: comments out, strings kept, asm statements found and split.

Enough of C's lexical rules to find every `asm`/`__asm__` statement (with `volatile`,
`goto`, `inline` qualifiers), including ones inside macros with line continuations, and to
split it into its template (adjacent string literals - raw `R"(...)"` ones included - and
macro names) and its operand lists. It is not a preprocessor: object-like string macros (``#define OC "=v"``) are
collected so that a template or constraint spelled through one can be resolved; a macro
with several definitions (``#ifdef`` branches) yields every alternative.
"""
from __future__ import annotations

import bisect
import dataclasses
import re
from typing import Iterator

_ASM_RE = re.compile(r"\b(?:__asm__|__asm|asm)\b((?:\s|\\\n|\bvolatile\b|\b__volatile__\b|"
                     r"\b__volatile\b|\bgoto\b|\binline\b)*)\(")
_STRING_MACRO_RE = re.compile(
    r'^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)[ \t]+((?:"(?:[^"\\\n]|\\.)*"[ \t]*)+)$', re.M)
_LITERAL_RE = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", "r": "", "0": ""}
_LINE_MARKER_RE = re.compile(r'^#\s*(?:line\s+)?(\d+)\s+"([^"]*)"')
_RAW_OPEN_RE = re.compile(r'(?<![\w])(?:u8|u|U|L)?R"([^()\\\s"]{0,16})\(')
_PREFIXED_RE = re.compile(r'(?<![\w])(?:u8|u|U|L)$')
_LITERAL_VALUE_RE = re.compile(r'(?:u8|u|U|L)?(?:R"([^(]*)\((.*)\)\1"|"(.*)")\Z', re.S)


@dataclasses.dataclass
class Scanned:
    """A source with comments blanked (same offsets, newlines kept) and where strings are."""

    code: str
    comments: list[tuple[int, str]]  # (line, comment text)
    string_spans: list[tuple[int, int]]
    line_starts: list[int]

    def line_of(self, offset: int) -> int:
        """1-based line number of a character offset."""
        return bisect.bisect_right(self.line_starts, offset)

    def in_string(self, offset: int) -> bool:
        i = bisect.bisect_right(self.string_spans, (offset, 1 << 62)) - 1
        return i >= 0 and self.string_spans[i][0] <= offset < self.string_spans[i][1]


_SPECIAL_RE = re.compile(r"""//|/\*|["']|(?<![\w])(?:u8|u|U|L)?R"(?=[^()\\\s"]{0,16}\()""")


def scan(text: str) -> Scanned:
    """Blank out comments (keeping newlines) and record string-literal spans (a span starts
    at the literal's encoding prefix, if any, and covers a raw literal's delimiters)."""
    out: list[str] = []
    comments: list[tuple[int, str]] = []
    spans: list[tuple[int, int]] = []
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    i, n = 0, len(text)
    while i < n:
        m = _SPECIAL_RE.search(text, i)
        if m is None:
            break
        tok, at = m.group(0), m.start()
        if tok == "//":
            j = text.find("\n", at)
            j = n if j < 0 else j
            comments.append((bisect.bisect_right(starts, at), text[at + 2:j]))
            out.append(text[i:at])
            out.append(" " * (j - at))
        elif tok == "/*":
            j = text.find("*/", at + 2)
            j = n if j < 0 else j + 2
            comments.append((bisect.bisect_right(starts, at), text[at + 2:j - 2]))
            out.append(text[i:at])
            out.append(re.sub(r"[^\n]", " ", text[at:j]))
        elif tok.endswith('R"'):
            raw = _RAW_OPEN_RE.match(text, at)
            close = text.find(")" + raw.group(1) + '"', raw.end()) if raw else -1
            j = n if close < 0 else close + len(raw.group(1)) + 2
            spans.append((at, j))
            out.append(text[i:j])
        else:  # a quote: a string or character literal, ended by its quote or the line
            j = at + 1
            while j < n and text[j] != tok and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            if tok == '"':
                prefix = _PREFIXED_RE.search(text, max(0, at - 2), at)
                spans.append((prefix.start() if prefix else at, j))
            out.append(text[i:j])
        i = j
    out.append(text[i:])
    return Scanned("".join(out), comments, spans, starts)


def string_macros(code: str) -> dict[str, list[str]]:
    """Object-like macros whose body is only string literals: name -> every definition."""
    macros: dict[str, list[str]] = {}
    for m in _STRING_MACRO_RE.finditer(code):
        value = "".join(unescape(s) for s in _LITERAL_RE.findall(m.group(2)))
        macros.setdefault(m.group(1), []).append(value)
    return macros


def unescape(body: str) -> str:
    """The value of a C string literal's body (the escapes asm templates use)."""
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


def literal_value(literal: str) -> str:
    """The value of one string literal as written: `"..."` (escapes), `R"d(...)d"` (none),
    either with an encoding prefix (`u8`, `u`, `U`, `L`)."""
    m = _LITERAL_VALUE_RE.match(literal)
    if not m:
        return unescape(literal.strip('"'))
    return m.group(2) if m.group(3) is None else unescape(m.group(3))


@dataclasses.dataclass
class Operand:
    """One asm operand: `[name] "constraint" (expr)`; `constraints` lists macro alternatives."""

    index: int
    name: str
    constraints: list[str]
    expr: str
    is_output: bool
    unresolved: list[str] = dataclasses.field(default_factory=list)  # names in the constraint
    # string macros in the constraint with several differing definitions (`#if` branches):
    # which one is active depends on the build's defines
    conditional: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class AsmStatement:
    """One asm statement as written: where, its template text and its operands."""

    start: int
    end: int
    line: int
    end_line: int
    template: str
    template_unresolved: list[str]
    template_end: int  # offset just after the template's last literal/macro token
    outputs: list[Operand]
    inputs: list[Operand]
    clobbers: list[str]
    text: str


def _code_chars(code: str, scanned: Scanned, lo: int, hi: int) -> Iterator[tuple[int, str, int]]:
    """(offset, char, bracket depth before it) for code[lo:hi] outside string literals."""
    depth, i = 0, lo
    while i < hi:
        if scanned.in_string(i):
            i = _span_end(scanned, i)
            continue
        c = code[i]
        yield i, c, depth
        depth += (c in "([{") - (c in ")]}")
        i += 1


def _matching_paren(code: str, scanned: Scanned, open_at: int) -> int:
    for i, c, depth in _code_chars(code, scanned, open_at, len(code)):
        if c in ")]}" and depth == 1:
            return i
    return -1


def _span_end(scanned: Scanned, offset: int) -> int:
    i = bisect.bisect_right(scanned.string_spans, (offset, 1 << 62)) - 1
    return scanned.string_spans[i][1]


def _split_top(code: str, scanned: Scanned, lo: int, hi: int, sep: str) -> list[tuple[int, int]]:
    """Split code[lo:hi] at top-level `sep` characters (outside strings and brackets)."""
    parts, start = [], lo
    for i, c, depth in _code_chars(code, scanned, lo, hi):
        if c == sep and depth == 0:
            parts.append((start, i))
            start = i + 1
    parts.append((start, hi))
    return parts


def _strings_and_names(code: str, scanned: Scanned, lo: int, hi: int,
                       macros: dict[str, list[str]]) -> tuple[list[str], list[str], int]:
    """Concatenate literals and known string macros in code[lo:hi]; return unknown names."""
    values, unknown, i, last = [""], [], lo, lo
    while i < hi:
        if scanned.in_string(i):
            j = _span_end(scanned, i)
            lit = literal_value(code[i:j])
            values = [v + lit for v in values]
            i = last = j
            continue
        m = re.match(r"[A-Za-z_]\w*", code[i:hi])
        if m:
            name = m.group(0)
            if name in macros:
                values = [v + alt for v in values for alt in macros[name]][:16]
            else:
                unknown.append(name)
            i += len(name)
            call = re.match(r"\s*\(", code[i:hi])
            if name not in macros and call:  # a function-like macro: its arguments too
                close = _matching_paren(code, scanned, i + call.end() - 1)
                i = close + 1 if 0 <= close < hi else i
            last = i
            continue
        i += 1
    return values, unknown, last


def _code_only(code: str, scanned: Scanned, lo: int, hi: int) -> str:
    """code[lo:hi] with its string literals blanked."""
    return "".join(c if not scanned.in_string(i) else " " for i, c in enumerate(code[lo:hi], lo))


def _operands(code: str, scanned: Scanned, lo: int, hi: int, macros: dict[str, list[str]],
              first_index: int, is_output: bool) -> list[Operand]:
    ops = []
    if not code[lo:hi].strip():
        return ops
    for k, (a, b) in enumerate(_split_top(code, scanned, lo, hi, ",")):
        piece = code[a:b]
        name_m = re.match(r"\s*\[\s*(\w+)\s*\]", piece)
        name = name_m.group(1) if name_m else ""
        c_lo = a + (name_m.end() if name_m else 0)
        # the expression is the first parenthesised group after the constraint (it may hold
        # parentheses of its own: `"+v"(reinterpret_cast<T&>(x))`)
        paren = next((i for i, c, depth in _code_chars(code, scanned, c_lo, b) if c == "(" and depth == 0), -1)
        close = _matching_paren(code, scanned, paren) if paren >= 0 else -1
        expr = code[paren + 1:close].strip() if 0 <= paren < close <= b else ""
        c_hi = paren if paren >= 0 else b
        cons, unknown, _ = _strings_and_names(code, scanned, c_lo, c_hi, macros)
        conditional = [n for n in re.findall(r"[A-Za-z_]\w*", _code_only(code, scanned, c_lo, c_hi))
                       if len(set(macros.get(n, ()))) > 1]
        ops.append(Operand(first_index + k, name, cons, " ".join(expr.split()), is_output, unknown,
                           conditional))
    return ops


def asm_statements(text: str, scanned: Scanned | None = None) -> list[AsmStatement]:
    """Every asm statement in a C-family source, in order of appearance."""
    scanned = scanned or scan(text)
    code = scanned.code
    macros = string_macros(code)
    found = []
    for m in _ASM_RE.finditer(code):
        if scanned.in_string(m.start()):
            continue
        open_at = m.end() - 1
        close = _matching_paren(code, scanned, open_at)
        if close < 0:
            continue
        sections = _split_top(code, scanned, open_at + 1, close, ":")
        tmpl_vals, unknown, tmpl_end = _strings_and_names(code, scanned, *sections[0], macros)
        outs = _operands(code, scanned, *sections[1], macros, 0, True) if len(sections) > 1 else []
        ins = (_operands(code, scanned, *sections[2], macros, len(outs), False)
               if len(sections) > 2 else [])
        clob: list[str] = []
        if len(sections) > 3:
            clob = [unescape(s) for s in _LITERAL_RE.findall(code[sections[3][0]:sections[3][1]])]
        found.append(AsmStatement(
            start=m.start(), end=close + 1, line=scanned.line_of(m.start()),
            end_line=scanned.line_of(close), template=tmpl_vals[0],
            template_unresolved=unknown, template_end=tmpl_end, outputs=outs, inputs=ins,
            clobbers=clob, text=text[m.start():close + 1]))
    return found


def line_map(preprocessed: str) -> list[tuple[str, int]] | None:
    """For text with `# N "file"` markers: each line's (original file, original line)."""
    if not re.search(r'^#\s*\d+\s+"', preprocessed, re.M):
        return None
    mapping, cur_file, cur_line = [], "", 1
    for raw in preprocessed.split("\n"):
        m = _LINE_MARKER_RE.match(raw)
        if m:
            mapping.append((cur_file, cur_line))
            cur_file, cur_line = m.group(2), int(m.group(1))
            continue
        mapping.append((cur_file, cur_line))
        cur_line += 1
    return mapping


@dataclasses.dataclass(frozen=True)
class DeviceFunction:
    """A `__global__` / `__device__` function defined in a source: name and body lines."""

    name: str
    line: int       # the line of its name
    end_line: int   # the line of its closing brace
    watched: bool   # its body holds what the static checks judge: asm, atomics, volatile, fences, spins


_DEVICE_RE = re.compile(r"\b(?:__global__|__device__|__attribute__\s*\(\(\s*(?:global|device)\s*\)\))")
_SKIP_CALLS = {"__launch_bounds__", "__attribute__", "__declspec", "alignas", "__align__", "decltype",
               "__attribute", "operator"}
_NAME_BEFORE_PAREN = re.compile(r"([A-Za-z_]\w*)\s*(?:<[^;{}()]*>\s*)?\($")
_WATCHED_RE = re.compile(r"\b(?:asm|__asm__|__asm|volatile|__volatile__|while|for|do)\b|atomic|fence|"
                         r"\bld_acquire|\bst_release")


def device_functions(text: str) -> list[DeviceFunction]:
    """The device functions a C++/CUDA/HIP source defines (declarations, device variables and
    lambdas are not), in order: found from their `__global__`/`__device__` qualifier, named
    by the first call-like identifier after it that is not an attribute, their body the
    braces after its parameter list."""
    scanned = scan(text)
    code = scanned.code
    out: list[DeviceFunction] = []
    pos = 0
    for m in _DEVICE_RE.finditer(code):
        if m.start() < pos or scanned.in_string(m.start()):
            continue
        i, name, name_at = m.end(), None, -1
        while i < len(code):
            c = code[i]
            if c in ";={}":
                break
            if c == "(":
                call = _NAME_BEFORE_PAREN.search(code, max(m.end(), i - 200), i + 1)
                close = _matching_paren(code, scanned, i)
                if close < 0:
                    break
                if call and call.group(1) not in _SKIP_CALLS and name is None:
                    name, name_at = call.group(1), call.start(1)
                i = close + 1
                continue
            i += 1
        if name is None or i >= len(code) or code[i] != "{":
            continue
        end = _matching_paren(code, scanned, i)
        if end < 0:
            continue
        out.append(DeviceFunction(name, scanned.line_of(name_at), scanned.line_of(end),
                                  bool(_WATCHED_RE.search(code, i, end))))
        pos = end + 1
    return out
