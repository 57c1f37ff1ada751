"""Which lines of a source reach the compiler, from the preprocessor's own output.

The source is preprocessed (`nvcc -E`, else clang `-E`, else `cpp`, found by
`stress/toolchain.find_tool`) with a marker token written after every conditional directive
(`#if`, `#ifdef`, `#ifndef`, `#elif`, `#else`) and a `#line` that keeps the numbering; a
conditional group is live when its marker is in the output. A line is dead when the group
it sits in is taken by no pass: CUDA sources are preprocessed twice (device pass with
`__CUDA_ARCH__`, host pass without), HIP sources with `--cuda-device-only` and
`--cuda-host-only`. `-dD` keeps the macro definitions in the output: a macro that expands
(directly or through other macros) to a fence or a barrier makes each of its use sites a
site (`operators`). More in docs/mutate.md.
"""
from __future__ import annotations

import dataclasses
import re
import tempfile
from pathlib import Path

from hazards.engine import toolchain
from hazards.engine.errors import ToolchainMissing
from hazards.static import cscan
from hazards.static.asm_lint import ExpandError
from hazards.static.userbuild import preprocess_with_stubs

_DIRECTIVE_RE = re.compile(r"^[ \t]*#[ \t]*(if|ifdef|ifndef|elif|else|endif)\b")
_DEFINE_OUT_RE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)(\([^)]*\))?[ \t]*(.*)$", re.M)
_MARKER = "__hz_live_group_{}__"
_MARKER_RE = re.compile(r"__hz_live_group_(\d+)__")
_NAME_RE = re.compile(r"\b[A-Za-z_]\w*\b")
_RESERVED_RE = re.compile(r"__|_[A-Z]")  # the implementation's names: the compiler decides them
# A translation unit's own file; anything else is a header, preprocessed here on its own.
MAIN_SUFFIXES = (".cu", ".hip", ".cpp", ".cc", ".cxx", ".c")
TIMEOUT_S = 120.0


@dataclasses.dataclass(frozen=True)
class Live:
    """What the preprocessor said about one source."""

    dead: frozenset[int]  # 1-based lines in a conditional group no pass took
    macros: dict[str, str]  # every macro defined in some pass: name -> body
    how: str  # one line: the tool and passes, and any header preprocessed as empty
    stubbed: tuple[str, ...] = ()  # the headers not found, preprocessed as empty (named in `how`)


def language_of(path: Path) -> str:
    """'hip' for a .hip file, 'cuda' otherwise (headers are read as CUDA unless told)."""
    return "hip" if path.suffix == ".hip" else "cuda"


@dataclasses.dataclass(frozen=True)
class Group:
    """One conditional group: the 0-based line after which its marker goes, the group it
    sits in, and the names its #if/#elif chain tests up to it (`defined` left out)."""

    after: int
    parent: int | None
    names: frozenset[str]


def groups(code: str) -> tuple[list[int | None], list[Group]]:
    """(the innermost conditional group of each line, or None outside any; the groups).
    `code` is the text with comments blanked."""
    lines = code.split("\n")
    owner: list[int | None] = [None] * len(lines)
    found: list[Group] = []
    stack: list[tuple[int | None, set[str]]] = []  # per open #if: the enclosing group, the chain's names
    current: int | None = None
    i = 0
    while i < len(lines):
        j = i
        while lines[j].endswith("\\") and j + 1 < len(lines):
            j += 1
        m = _DIRECTIVE_RE.match(lines[i])
        for k in range(i, j + 1):
            owner[k] = current
        if m:
            kind = m.group(1)
            tested = set(_NAME_RE.findall(" ".join(lines[i:j + 1])[m.end():])) - {"defined"}
            if kind in ("if", "ifdef", "ifndef"):
                stack.append((current, set()))
            if kind == "endif":
                current = stack.pop()[0] if stack else None
            elif stack:  # if/ifdef/ifndef/elif/else: a new group begins after this directive
                parent, chain = stack[-1]
                chain |= tested
                current = len(found)
                found.append(Group(after=j, parent=parent, names=frozenset(chain)))
        i = j + 1
    return owner, found


def _marked(text: str, found: list[Group], in_comment: set[int]) -> str:
    """The source with each group's marker after its directive, numbering kept by `#line`.
    `in_comment`: 0-based lines whose newline lies inside a block comment; a marker there
    would be part of the comment (a directive's trailing `/* ...` spanning lines), so it goes
    after the line that closes the comment, which belongs to the same group."""
    lines = text.split("\n")
    at: dict[int, list[int]] = {}
    for k, g in enumerate(found):
        n = g.after
        while n in in_comment:
            n += 1
        at.setdefault(n, []).append(k)
    out = []
    for n, line in enumerate(lines):
        out.append(line)
        if n in at:
            out.extend(_MARKER.format(k) for k in at[n])
            out.append(f"#line {n + 2}")
    return "\n".join(out)


def _lines_ending_in_comment(scanned: cscan.Scanned) -> set[int]:
    """0-based lines whose newline is inside a block comment (cscan keeps each comment's
    first line, 1-based, and its text)."""
    return {line - 1 + d for line, body in scanned.comments for d in range(body.count("\n"))}


def _candidates(language: str) -> tuple[list[tuple[str, list[list[str]]]], list[str]]:
    """([(tool label, the argv of each pass without the input)] of the preprocessors found,
    in the order they are tried; the names of those not found)."""
    found, missing = [], []

    def tool(name: str) -> str | None:
        try:
            return toolchain.find_tool(name)
        except ToolchainMissing:
            missing.append(name)
            return None

    if language == "cuda" and (nvcc := tool("nvcc")):
        base = [nvcc, "-E", "-x", "cu", *toolchain.nvcc_arch_flags(), "-Xcompiler", "-dD"]
        found.append(("nvcc -E (device and host passes)", [base, [*base, "-U__CUDA_ARCH__"]]))
    if clang := tool("clang"):
        if language == "cuda":
            base = [clang, "-E", "-dD", "-x", "cuda", f"--cuda-gpu-arch={toolchain.SM90A}", "-nocudainc",
                    "-nocudalib", "-Wno-unknown-cuda-version"]
        else:
            base = [clang, "-E", "-dD", "-x", "hip", toolchain.amd_arch_flag(), "-nogpuinc", "-nogpulib"]
        found.append((f"{Path(clang).name} -E (device and host passes)",
                      [[*base, "--cuda-device-only"], [*base, "--cuda-host-only"]]))
    if cpp := tool("cpp"):
        if language == "cuda":
            base = [cpp, "-x", "c++", "-dD", "-D__CUDACC__", "-D__NVCC__"]
            found.append(("cpp (device and host passes)", [[*base, "-D__CUDA_ARCH__=900"], base]))
        else:
            base = [cpp, "-x", "c++", "-dD", "-D__HIP__", "-D__HIPCC__", "-D__HIP_PLATFORM_AMD__"]
            found.append(("cpp (device and host passes)", [[*base, "-D__HIP_DEVICE_COMPILE__"], base]))
    return found, missing


def find_live(path: Path, text: str, *, defines: dict[str, str | None] | None = None,
              language: str | None = None) -> tuple[Live | None, str]:
    """(what the preprocessor said about `text`, the source at `path`, or None; one line: how
    the sites were found or why the text scanner is used instead). Each preprocessor found is
    tried in turn until one succeeds."""
    candidates, missing = _candidates(language or language_of(path))
    if not candidates:
        return None, f"no preprocessor found ({', '.join(missing)}): sites found by the text scanner"
    scanned = cscan.scan(text)
    owner, found = groups(scanned.code)
    in_comment = _lines_ending_in_comment(scanned)
    # Every -D/-U reaches every pass (a compiler's own macro given again is a warning at most).
    flags = [f"-D{k}={v}" if v else f"-D{k}" for k, v in (defines or {}).items() if v is not None]
    flags += [f"-U{k}" for k, v in (defines or {}).items() if v is None]
    failed = []
    for label, commands in candidates:
        try:
            taken, macros, stubbed = _preprocess(path, _marked(text, found, in_comment), commands, flags)
        except ExpandError as e:
            failed.append(f"{label.split()[0]} failed: {e}")
            continue
        kept = set()
        # a header: its includer may define what it tests; any file with a header read as
        # empty: that header may (the build finds it with flags this run did not have)
        if path.suffix not in MAIN_SUFFIXES or stubbed:
            known = set(macros) | set(defines or {})
            kept = {g for g in range(len(found)) if g not in taken and _tests_unknown(found, g, known)}
        dead = frozenset(n + 1 for n, g in enumerate(owner) if g is not None and g not in taken and g not in kept)
        how = f"sites found by {label}"
        if kept:
            who = "a header read as empty" if path.suffix in MAIN_SUFFIXES else "its includer"
            how += (f"; {len(kept)} branch(es) over macros no pass defined kept ({who} may define them)")
        if stubbed:
            how += f"; headers not found, read as empty: {', '.join(sorted(set(stubbed)))}"
        return Live(dead=dead, macros=macros, how=how, stubbed=tuple(sorted(set(stubbed)))), how
    return None, f"{'; '.join(failed)}: sites found by the text scanner"


def _tests_unknown(found: list[Group], g: int | None, known: set[str]) -> bool:
    """Whether group g, or a group it sits in, tests a name no pass defined that is not the
    implementation's own (`__X`, `_X`): in a header, its includer may define that name."""
    while g is not None:
        if any(n not in known and not _RESERVED_RE.match(n) for n in found[g].names):
            return True
        g = found[g].parent
    return False


def _preprocess(path: Path, marked: str, commands: list[list[str]],
                flags: list[str]) -> tuple[set[int], dict[str, str], list[str]]:
    """(the groups some pass took, the macros some pass defined, the headers read as empty)."""
    taken: set[int] = set()
    macros: dict[str, str] = {}
    stubbed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="hazards-pp-") as tmp:
        src = Path(tmp) / ("source" + (path.suffix or ".cu"))
        src.write_text(marked, encoding="utf-8", errors="surrogateescape")
        stubs = Path(tmp) / "stubs"
        stubs.mkdir()
        for argv in commands:
            out = preprocess_with_stubs([*argv, *flags, f"-I{path.resolve().parent}"], src, stubs, stubbed,
                                        timeout_s=TIMEOUT_S)
            taken.update(int(g) for g in _MARKER_RE.findall(out))
            for m in _DEFINE_OUT_RE.finditer(out):
                macros.setdefault(m.group(1), m.group(3))
    return taken, macros, stubbed
