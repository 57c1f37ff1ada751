"""Which lines of a source the preprocessor would drop: `#if 0`, `#ifdef X` with X undefined, ...

Not a preprocessor: a condition is decided only when every name in it is known, from the
`defines` given (`-D NAME[=VALUE]`) or a `#define`/`#undef` earlier in the same file; a
condition over a name defined elsewhere (a header, the build's flags) is unknown, and both
of its branches count as active. That keeps every real site and leaves out only code that
is certainly compiled away (the look-alikes a mutant must never touch).
"""
from __future__ import annotations

import ast
import re

_DIRECTIVE_RE = re.compile(r"^[ \t]*#[ \t]*(if|ifdef|ifndef|elif|else|endif|define|undef)\b(.*)$")
_DEFINED_RE = re.compile(r"\bdefined\s*(?:\(\s*([A-Za-z_]\w*)\s*\)|([A-Za-z_]\w*))")
_IDENT_RE = re.compile(r"\b[A-Za-z_]\w*\b")
_INT_RE = re.compile(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]*\b")
_ALLOWED = (ast.Expression, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Constant, ast.And, ast.Or,
            ast.Not, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Add, ast.Sub, ast.Mult,
            ast.FloorDiv, ast.Mod, ast.USub, ast.UAdd, ast.BitAnd, ast.BitOr, ast.BitXor, ast.LShift,
            ast.RShift, ast.Invert, ast.IfExp)


def evaluate(expr: str, known: dict[str, str | None]) -> bool | None:
    """The truth of an #if expression, or None when it names something unknown. `known`
    maps a name to its value (None: known to be undefined)."""
    expr = expr.split("//")[0]
    expr = re.sub(r"/\*.*?\*/", " ", expr)

    def defined(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in known:
            raise LookupError(name)
        return "1" if known[name] is not None else "0"

    try:
        expr = _DEFINED_RE.sub(defined, expr)
        for _ in range(8):  # object-like macros whose values are other known names
            names = set(_IDENT_RE.findall(_INT_RE.sub("", expr)))
            if not names:
                break
            for name in names:
                if name not in known:
                    raise LookupError(name)
                value = known[name]
                expr = re.sub(rf"\b{name}\b", f"({value})" if value not in (None, "") else "0", expr)
        else:
            return None
    except LookupError:
        return None
    expr = _INT_RE.sub(lambda m: str(int(m.group(1), 0)), expr)
    py = expr.replace("&&", " and ").replace("||", " or ")
    py = re.sub(r"!(?!=)", " not ", py).replace("/", "//")
    try:
        tree = ast.parse(py.strip() or "0", mode="eval")
    except SyntaxError:
        return None
    if not all(isinstance(node, _ALLOWED) for node in ast.walk(tree)):
        return None
    try:
        return bool(eval(compile(tree, "<#if>", "eval"), {"__builtins__": {}}, {}))  # noqa: S307 - checked AST
    except Exception:
        return None


def inactive_lines(text: str, defines: dict[str, str | None] | None = None) -> set[int]:
    """1-based numbers of the lines a conditional certainly removes. `defines` maps a macro
    to its value, or to None for one known to be undefined (`-U`)."""
    known: dict[str, str | None] = dict(defines or {})
    inactive: set[int] = set()
    # Per open #if: (this branch is certainly taken-off, a branch was certainly taken, some
    # branch unknown, this branch may or may not be taken)
    stack: list[list[bool]] = []

    def dropped() -> bool:
        return any(frame[0] for frame in stack)

    def uncertain() -> bool:
        return any(frame[3] for frame in stack)

    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        joined, j = line, i
        while joined.endswith("\\") and j + 1 < len(lines):  # continued directive lines
            j += 1
            joined = joined[:-1] + " " + lines[j]
        m = _DIRECTIVE_RE.match(joined)
        if m is None:
            if dropped():
                inactive.add(i + 1)
            i += 1
            continue
        kind, rest = m.group(1), m.group(2).strip()
        if kind in ("define", "undef") and dropped():  # a definition the preprocessor never sees
            inactive.update(range(i + 1, j + 2))
            i = j + 1
            continue
        if kind in ("if", "ifdef", "ifndef"):
            if dropped():
                stack.append([True, True, False, False])
            else:
                if kind == "if":
                    value = evaluate(rest, known)
                else:
                    name = rest.split()[0] if rest.split() else ""
                    value = None if name not in known else ((known[name] is not None) == (kind == "ifdef"))
                stack.append([value is False, value is True, value is None, value is None])
        elif kind == "elif" and stack:
            frame = stack[-1]
            outer = any(f[0] for f in stack[:-1])
            if outer or frame[1]:
                frame[0], frame[3] = True, False
            else:
                value = evaluate(rest, known)
                frame[0] = value is False
                frame[1] = value is True
                frame[3] = value is None or (frame[2] and value is True)  # taken only if the unknown ones were not
                frame[2] = frame[2] or value is None
        elif kind == "else" and stack:
            frame = stack[-1]
            outer = any(f[0] for f in stack[:-1])
            frame[0] = outer or frame[1]
            frame[3] = not frame[0] and frame[2]
        elif kind == "endif" and stack:
            stack.pop()
        elif kind in ("define", "undef") and not dropped():
            parts = rest.split(None, 1)
            if parts and re.fullmatch(r"[A-Za-z_]\w*", parts[0]):
                if uncertain():  # a branch that may not be taken: the name's value is unknown after it
                    known.pop(parts[0], None)
                elif kind == "define":
                    known[parts[0]] = parts[1].strip() if len(parts) > 1 else ""
                else:
                    known[parts[0]] = None
        i = j + 1
    return inactive
