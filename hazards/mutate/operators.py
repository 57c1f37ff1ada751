"""Mutation operators on synchronization: where each one applies in a source, and what it writes.

Each operator finds its sites on the text the compiler sees: comments blanked and string
literals skipped (`hazards.static.cscan`), PTX/AMDGCN only inside asm templates, and lines a
conditional certainly drops left alone (`conditionals`). A site is one edit of the original
text (replace [start, end) by `replacement`), so its mutant reads as a one-hunk diff.
More in docs/mutate.md.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Iterator

from hazards.static import cscan


@dataclasses.dataclass(frozen=True)
class Site:
    """One edit: replace text[start:end] by `replacement`."""

    operator: str
    start: int
    end: int
    replacement: str
    line: int
    what: str  # one line for a kernel engineer: "remove __threadfence() (line 42)"


@dataclasses.dataclass
class Source:
    """A source as the operators read it."""

    text: str
    scanned: cscan.Scanned
    asm: list[cscan.AsmStatement]
    inactive: set[int]
    # Macros the preprocessor saw (name -> body; empty without one): a macro expanding to a
    # fence or barrier is mutated at each of its use sites too.
    macros: dict[str, str] = dataclasses.field(default_factory=dict)

    def active(self, offset: int) -> bool:
        return self.scanned.line_of(offset) not in self.inactive

    def code_matches(self, pattern: re.Pattern[str]) -> Iterator[re.Match[str]]:
        """Matches in code: not in a comment (blanked), not in a string, not compiled away."""
        for m in pattern.finditer(self.scanned.code):
            if not self.scanned.in_string(m.start()) and self.active(m.start()):
                yield m

    def asm_literals(self) -> Iterator[tuple[cscan.AsmStatement, int, int]]:
        """(statement, start, end) of every string literal of every active asm template."""
        for st in self.asm:
            if not self.active(st.start):
                continue
            for m in re.finditer(r'"(?:[^"\\\n]|\\.)*"', self.text[st.start:st.template_end]):
                yield st, st.start + m.start() + 1, st.start + m.end() - 1

    def macro_literals(self) -> Iterator[tuple[str, int, int]]:
        """(name, start, end) of the string literals of `#define NAME "..."` (asm text or
        constraints spelled through a macro), on active lines."""
        for m in _STRING_MACRO_RE.finditer(self.scanned.code):
            if not self.active(m.start()):
                continue
            for lit in re.finditer(r'"(?:[^"\\\n]|\\.)*"', self.text[m.start(2):m.end(2)]):
                yield m.group(1), m.start(2) + lit.start() + 1, m.start(2) + lit.end() - 1

    def asm_matches(self, pattern: re.Pattern[str]) -> Iterator[tuple[cscan.AsmStatement | None, re.Match[str], int]]:
        """Matches inside asm template literals, and inside string macros (templates spelled
        through a `#define`): (statement or None, match, offset of the literal's body)."""
        for st, lo, hi in self.asm_literals():
            for m in pattern.finditer(self.text, lo, hi):
                yield st, m, lo
        for _, lo, hi in self.macro_literals():
            for m in pattern.finditer(self.text, lo, hi):
                yield None, m, lo


_STRING_MACRO_RE = re.compile(r'^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)[ \t]+((?:"(?:[^"\\\n]|\\.)*"[ \t]*)+)$', re.M)


def _statement_end(code: str, close_paren: int) -> int:
    """Offset just after the `;` that ends a call statement whose `)` is at close_paren."""
    m = re.compile(r"\s*;").match(code, close_paren + 1)
    return m.end() if m else close_paren + 1


def _call_sites(src: Source, op: str, pattern: re.Pattern[str], verb: str) -> Iterator[Site]:
    """Remove whole call statements `NAME(...);` whose name the pattern matches."""
    code = src.scanned.code
    for m in src.code_matches(pattern):
        open_at = code.find("(", m.end() - 1)
        i = _matching_paren(code, open_at)
        i = len(code) if i < 0 else i
        end = _statement_end(code, i)
        if not code[i + 1:end].strip().endswith(";"):
            continue  # used as a value (`x = __syncthreads_count(...)`): not a statement to delete
        line = src.scanned.line_of(m.start())
        yield Site(op, m.start(), end, "", line, f"{verb} {code[m.start():open_at].strip()}() (line {line})")


def _instruction_sites(src: Source, op: str, pattern: re.Pattern[str], verb: str) -> Iterator[Site]:
    """Remove one instruction from an asm template: its text and the separator after it."""
    for st, m, _ in src.asm_matches(pattern):
        end = m.end()
        sep = re.compile(r"\s*(?:;|\\n|\\t)*\s*").match(src.text, end)
        line = src.scanned.line_of(m.start())
        yield Site(op, m.start(), sep.end() if sep else end, "", line,
                   f"{verb} asm `{m.group(0).strip()}` (line {line})")


_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")
_LITERAL = re.compile(r'"(?:[^"\\\n]|\\.)*"')


def _expanding_macros(macros: dict[str, str], calls: re.Pattern[str], instructions: re.Pattern[str]) -> dict[str, str]:
    """Macros whose expansion (through other macros too) holds a call `calls` names or an
    instruction `instructions` matches inside a string: name -> what it expands to."""
    found: dict[str, str] = {}
    for name, body in macros.items():
        hit = calls.search(body + "(") if body.strip() else None
        if hit is None:
            hit = next((m for lit in _LITERAL.findall(body) for m in [instructions.search(lit)] if m), None)
        if hit is not None:
            found[name] = hit.group(0).rstrip("(").strip()
    for _ in range(4):  # macros that expand to those macros
        grew = False
        for name, body in macros.items():
            if name not in found:
                via = next((n for n in _IDENT.findall(body) if n in found and n != name), None)
                if via is not None:
                    found[name], grew = found[via], True
        if not grew:
            break
    return found


def _macro_use_sites(src: Source, op: str, calls: re.Pattern[str], instructions: re.Pattern[str]) -> Iterator[Site]:
    """Each live statement that invokes a macro expanding to a fence/barrier (`NAME(...);` or
    `NAME;`) is deleted at its use site: the diff a kernel engineer reads is at the call."""
    if not src.macros:
        return
    code = src.scanned.code
    used = set(_IDENT.findall(code)) & set(src.macros)
    if not used:
        return
    expanding = _expanding_macros(src.macros, calls, instructions)
    names = sorted(n for n in used if n in expanding and not calls.match(n + "("))
    if not names:
        return
    pattern = re.compile(r"\b(?:" + "|".join(map(re.escape, names)) + r")\b")
    for m in src.code_matches(pattern):
        if _is_directive_line(code, m.start()):
            continue  # inside a #define: the definition is not a use site
        i = m.end()
        while i < len(code) and code[i] in " \t":
            i += 1
        if i < len(code) and code[i] == "(":
            close = _matching_paren(code, i)
            if close < 0:
                continue
            end = _statement_end(code, close)
        else:
            end = _statement_end(code, i - 1)
        if not code[m.start():end].rstrip().endswith(";"):
            continue  # used as a value or a declaration: not a statement to delete
        line = src.scanned.line_of(m.start())
        call = " ".join(code[m.start():end].rstrip(" \t\n;").split())
        call = call if len(call) <= 60 else m.group(0) + "(...)"
        yield Site(op, m.start(), end, "", line,
                   f"remove {call} (line {line}): the macro expands to {expanding[m.group(0)]}()")


def _is_directive_line(code: str, at: int) -> bool:
    """Whether offset `at` sits on a preprocessor directive (or its continuation lines)."""
    lo = code.rfind("\n", 0, at) + 1
    while lo > 1 and code[lo - 2] == "\\":
        lo = code.rfind("\n", 0, lo - 1) + 1
    return code[lo:at].lstrip().startswith("#")


def _matching_paren(code: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(code)):
        if code[i] == "(":
            depth += 1
        elif code[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _removal(op: str, calls: re.Pattern[str], instructions: re.Pattern[str]) -> Callable[[Source], Iterator[Site]]:
    """The operator `op` that deletes each call statement `calls` names and each asm
    instruction `instructions` matches (remove-fence and remove-barrier differ only there)."""

    def remove(src: Source) -> Iterator[Site]:
        yield from _call_sites(src, op, calls, "remove")
        yield from _instruction_sites(src, op, instructions, "remove")
        yield from _macro_use_sites(src, op, calls, instructions)

    remove.__name__ = remove.__qualname__ = op.replace("-", "_")
    return remove


_FENCE_CALLS = re.compile(r"\b(?:__threadfence(?:_block|_system)?|__atomic_thread_fence|"
                          r"(?:std::|cuda::(?:std::)?)?atomic_thread_fence|__builtin_amdgcn_fence)\s*\(")
# An instruction runs to its separator: `;`, an escaped newline (`\\n`), the literal's end; it
# starts after no word character or dot (`wgmma.fence.sync.aligned` holds no `fence.*`), or
# after a `\\n`/`\\t` escape in the literal.
_INSTRUCTION_START = r"(?:(?<![\w.])|(?<=\\[nt]))"
_FENCE_ASM = re.compile(_INSTRUCTION_START + r"(?:fence\.[a-z_.]+|membar\.[a-z]+|buffer_wbl2|buffer_inv|buffer_wbinvl1\w*|s_waitcnt)\b"
                        r"[^;\\\"\n]*")


remove_fence = _removal("remove-fence", _FENCE_CALLS, _FENCE_ASM)


_ORDER_CODE = re.compile(r"\b(__ATOMIC_|memory_order_|memory_order::)(ACQUIRE|RELEASE|ACQ_REL|SEQ_CST|"
                         r"acquire|release|acq_rel|seq_cst)\b")
_ORDER_PTX = re.compile(r"\b(ld|st|red|atom|multimem\.ld_reduce)((?:\.[a-z0-9_]+)*?)\.(acquire|release|acq_rel|sc)\b")


def weaken_order(src: Source) -> Iterator[Site]:
    for m in src.code_matches(_ORDER_CODE):
        relaxed = "RELAXED" if m.group(2).isupper() else "relaxed"
        line = src.scanned.line_of(m.start())
        yield Site("weaken-order", m.start(2), m.end(2), relaxed, line,
                   f"{m.group(0)} -> {m.group(1)}{relaxed} (line {line})")
    for _, m, _ in src.asm_matches(_ORDER_PTX):
        line = src.scanned.line_of(m.start())
        yield Site("weaken-order", m.start(3), m.end(3), "relaxed", line,
                   f"asm {m.group(0)} -> {m.group(1)}{m.group(2)}.relaxed (line {line})")


_NARROWER = {
    "__HIP_MEMORY_SCOPE_SYSTEM": "__HIP_MEMORY_SCOPE_AGENT", "__HIP_MEMORY_SCOPE_AGENT": "__HIP_MEMORY_SCOPE_WORKGROUP",
    "__MEMORY_SCOPE_SYSTEM": "__MEMORY_SCOPE_DEVICE", "__MEMORY_SCOPE_DEVICE": "__MEMORY_SCOPE_WRKGRP",
    "thread_scope_system": "thread_scope_device", "thread_scope_device": "thread_scope_block",
}
_SCOPE_CODE = re.compile(r"\b(" + "|".join(_NARROWER) + r")\b")
_SCOPE_PTX = re.compile(r"\b(?:ld|st|red|atom|fence|membar)(?:\.[a-z0-9_]+)*?\.(sys|gpu)\b")


def narrow_scope(src: Source) -> Iterator[Site]:
    for m in src.code_matches(_SCOPE_CODE):
        line = src.scanned.line_of(m.start())
        yield Site("narrow-scope", m.start(), m.end(), _NARROWER[m.group(1)], line,
                   f"{m.group(1)} -> {_NARROWER[m.group(1)]} (line {line})")
    for _, m, _ in src.asm_matches(_SCOPE_PTX):
        narrower = "gpu" if m.group(1) == "sys" else "cta"
        line = src.scanned.line_of(m.start())
        yield Site("narrow-scope", m.start(1), m.end(1), narrower, line,
                   f"asm {m.group(0)} -> .{narrower} (line {line})")


_BARRIER_CALLS = re.compile(r"\b(?:__syncthreads|__syncwarp|__builtin_amdgcn_s_barrier)\s*\(")
_BARRIER_ASM = re.compile(_INSTRUCTION_START + r"(?:bar\.sync|barrier\.sync(?:\.aligned)?|bar\.warp\.sync|s_barrier)\b[^;\\\"\n]*")


remove_barrier = _removal("remove-barrier", _BARRIER_CALLS, _BARRIER_ASM)


_WAIT_ASM = re.compile(r"\b(cp\.async\.wait_group|cp\.async\.bulk\.wait_group(?:\.read)?|"
                       r"wgmma\.wait_group(?:\.sync)?(?:\.aligned)?)[ \t]+(\d+)|\b(s_waitcnt[ \t]+(?:vmcnt|lgkmcnt|expcnt)\()(\d+)\)")
_WAIT_CODE = re.compile(r"\b(__pipeline_wait_prior|cp_async_wait)\s*(?:\(|<)\s*(\d+)\s*(?:\)|>)")


def deepen_wait(src: Source) -> Iterator[Site]:
    for _, m, _ in src.asm_matches(_WAIT_ASM):
        g = 2 if m.group(2) is not None else 4
        n = int(m.group(g))
        line = src.scanned.line_of(m.start())
        yield Site("deepen-wait", m.start(g), m.end(g), str(n + 1), line,
                   f"asm {m.group(0).strip()} waits for one group less (N {n} -> {n + 1}, line {line})")
    for m in src.code_matches(_WAIT_CODE):
        n = int(m.group(2))
        line = src.scanned.line_of(m.start())
        yield Site("deepen-wait", m.start(2), m.end(2), str(n + 1), line,
                   f"{m.group(1)}({n}) -> {m.group(1)}({n + 1}) (line {line})")


def drop_earlyclobber(src: Source) -> Iterator[Site]:
    for name, lo, hi in src.macro_literals():  # a constraint spelled through a macro
        body = src.text[lo:hi]
        if body[:1] in "=+" and "&" in body:
            amp = lo + body.index("&")
            line = src.scanned.line_of(amp)
            yield Site("drop-earlyclobber", amp, amp + 1, "", line,
                       f'#define {name} "{body}" -> "{body.replace("&", "")}" (line {line})')
    for st in src.asm:
        if not src.active(st.start) or not st.outputs:
            continue
        # The output section: the literals after the template, up to the first input's
        # position (outputs come first); each output constraint with '&' loses it.
        for m in re.finditer(r'"([=+][^"]*&[^"]*)"', src.text[st.template_end:st.end]):
            at = st.template_end + m.start(1)
            if src.scanned.in_string(at) and "&" in m.group(1):
                amp = at + m.group(1).index("&")
                line = src.scanned.line_of(amp)
                yield Site("drop-earlyclobber", amp, amp + 1, "", line,
                           f'asm output "{m.group(1)}" -> "{m.group(1).replace("&", "")}" (line {line})')


_PUBLISH = re.compile(r"\b(?:__hip_atomic_store|__atomic_store_n|__atomic_store|atomicExch|atomicAdd|atomicOr|"
                      r"atomic_store_explicit|hz_st_release\w*|st_release\w*|\w+\.store)\s*\(")
_STORE_STMT = re.compile(r"^\s*(?:\*\s*[\w.>\-\[\]()]+|[\w.>\-]+\s*\[[^;]*?\]|[\w]+(?:->|\.)[\w.]+)\s*=[^=]")


def _statements(src: Source) -> list[tuple[int, int, int]]:
    """(start, end, brace depth) of each `...;` statement at brace level, in order."""
    code, out, depth, start, paren = src.scanned.code, [], 0, 0, 0
    for i, ch in enumerate(code):
        if src.scanned.in_string(i):
            continue
        if ch == "(":
            paren += 1
        elif ch == ")":
            paren = max(0, paren - 1)
        elif ch in "{}" and paren == 0:
            depth += 1 if ch == "{" else -1
            start = i + 1
        elif ch == ";" and paren == 0:
            out.append((start, i + 1, depth))
            start = i + 1
    return out


def flag_before_data(src: Source) -> Iterator[Site]:
    code = src.scanned.code
    stmts = _statements(src)
    for k, (s, e, depth) in enumerate(stmts):
        body = code[s:e]
        after_fence = k > 0 and _FENCE_CALLS.search(code[stmts[k - 1][0]:stmts[k - 1][1]]) is not None
        is_asm_release = any(st.start >= s and st.end <= e and re.search(r"\b(st|red|atom)[.a-z0-9_]*\.release\b",
                                                                          st.template) for st in src.asm)
        if not (_PUBLISH.search(body) or is_asm_release or (after_fence and _STORE_STMT.match(body))):
            continue
        if not src.active(s + len(body) - len(body.lstrip())):
            continue
        # The data store it publishes: the nearest earlier plain store in the same block.
        for j in range(k - 1, max(-1, k - 6), -1):
            ps, pe, pdepth = stmts[j]
            if pdepth != depth or "{" in code[pe:s] or "}" in code[pe:s]:
                break
            prev = code[ps:pe]
            if _STORE_STMT.match(prev) and not _PUBLISH.search(prev):
                data_line = src.scanned.line_of(ps + len(prev) - len(prev.lstrip()))
                flag_line = src.scanned.line_of(e - 1)
                # The flag statement proper (not the comments before it) moves to just before the
                # data store, at its indentation; what stood between them (a fence) stays behind.
                data_at = ps + len(code[ps:pe]) - len(code[ps:pe].lstrip())
                flag_at = s + len(code[s:e]) - len(code[s:e].lstrip())
                before = src.text[src.text.rfind("\n", 0, data_at) + 1:data_at]
                sep = "\n" + before if not before.strip() else " "  # mid-line data store: stay on its line
                moved = src.text[flag_at:e] + sep + src.text[data_at:flag_at].rstrip()
                yield Site("flag-before-data", data_at, e, moved, flag_line,
                           f"store the flag (line {flag_line}) before the data it publishes (line {data_line})")
                break


_NOP_ASM = re.compile(r"\bs_nop[ \t]+(\d+)")


def reduce_nop(src: Source) -> Iterator[Site]:
    for _, m, _ in src.asm_matches(_NOP_ASM):
        n = int(m.group(1))
        if n == 0:
            continue
        line = src.scanned.line_of(m.start())
        yield Site("reduce-nop", m.start(1), m.end(1), str(n - 1), line,
                   f"asm s_nop {n} -> s_nop {n - 1}: one wait state less (line {line})")


OPERATORS: dict[str, Callable[[Source], Iterator[Site]]] = {
    "remove-fence": remove_fence,
    "weaken-order": weaken_order,
    "narrow-scope": narrow_scope,
    "remove-barrier": remove_barrier,
    "deepen-wait": deepen_wait,
    "drop-earlyclobber": drop_earlyclobber,
    "flag-before-data": flag_before_data,
    "reduce-nop": reduce_nop,
}
