"""Mutants of a source: one site each, with an id, a one-line description and a unified diff."""
from __future__ import annotations

import base64
import dataclasses
import difflib
import hashlib
from pathlib import Path
from typing import Iterable

from hazards.engine.errors import UserError
from hazards.mutate import conditionals
from hazards.mutate.operators import OPERATORS, Site, Source
from hazards.mutate.preprocess import Live, find_live
from hazards.static import cscan


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One mutant of one file: `id` is stable for the same source (operator, line, ordinal)."""

    id: str
    path: str  # as the user named the file
    operator: str
    line: int
    description: str
    site: Site
    original_sha: str

    @property
    def key(self) -> tuple[str, str]:
        """Unique over every file mutated in one command: (path, id)."""
        return self.path, self.id

    def apply(self, text: str) -> str:
        return text[:self.site.start] + self.site.replacement + text[self.site.end:]

    def diff(self, text: str) -> str:
        """The unified diff (3 lines of context) that turns the original into this mutant."""
        return "".join(difflib.unified_diff(text.splitlines(keepends=True), self.apply(text).splitlines(keepends=True),
                                            fromfile=f"a/{self.path}", tofile=f"b/{self.path}"))

    def as_json(self, text: str) -> dict:
        """The mutant as JSON with no lone surrogate in it (`json_text`)."""
        return {"id": self.id, **json_text("path", self.path), "operator": self.operator, "line": self.line,
                **json_text("description", self.description), **json_text("diff", self.diff(text))}


NOT_UTF8 = ("the source is not valid UTF-8: text fields show each invalid byte as U+FFFD; "
            "each NAME_base64 field holds NAME's exact bytes")


def json_text(name: str, value: str) -> dict[str, str]:
    """`{name: value}` for JSON. A source that is not valid UTF-8 is read with
    surrogateescape (each invalid byte a lone surrogate, so the bytes round-trip); JSON must
    not carry those: `name` then shows each invalid byte as U+FFFD, and `name_base64` holds
    the exact bytes (base64 of the UTF-8 text with the invalid bytes as they were)."""
    raw = value.encode("utf-8", "surrogateescape")
    clean = raw.decode("utf-8", "replace")
    if clean == value:
        return {name: value}
    return {name: clean, f"{name}_base64": base64.b64encode(raw).decode("ascii"), "encoding": NOT_UTF8}


def json_value(record: dict, name: str) -> str:
    """The text `json_text` wrote under `name`, with its exact bytes back (surrogateescape)."""
    if f"{name}_base64" in record:
        return base64.b64decode(record[f"{name}_base64"]).decode("utf-8", "surrogateescape")
    return record.get(name) or ""


def parse_lines(spec: str | None) -> tuple[int, int] | None:
    """`A-B` (or `A`) as an inclusive line range; a UserError otherwise."""
    if not spec:
        return None
    lo, _, hi = spec.partition("-")
    try:
        a, b = int(lo), int(hi or lo)
    except ValueError:
        raise UserError(f"--lines must be A-B (line numbers), got {spec!r}") from None
    if a < 1 or b < a:
        raise UserError(f"--lines must be A-B with 1 <= A <= B, got {spec!r}")
    return a, b


def check_operators(names: Iterable[str] | None) -> list[str]:
    """The operators named (all when none); a UserError naming the known ones otherwise."""
    chosen = [n.strip() for name in (names or ()) for n in name.split(",") if n.strip()] or list(OPERATORS)
    unknown = [n for n in chosen if n not in OPERATORS]
    if unknown:
        raise UserError(f"no mutation operator {unknown[0]!r} (known: {', '.join(OPERATORS)})")
    return chosen


def mutants_of_text(text: str, path: str, *, operators: Iterable[str] | None = None,
                    lines: tuple[int, int] | None = None, defines: dict[str, str | None] | None = None,
                    live: Live | None = None) -> list[Mutant]:
    """Every mutant of `text` (a C/C++/CUDA/HIP source), in source order. `live`: what the
    preprocessor said (dead lines, macros); without it, the text scanner's conditionals."""
    scanned = cscan.scan(text)
    inactive = set(live.dead) if live is not None else conditionals.inactive_lines(text, defines)
    src = Source(text=text, scanned=scanned, asm=cscan.asm_statements(text, scanned), inactive=inactive,
                 macros=live.macros if live is not None else {})
    sha = hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()
    sites: list[Site] = []
    seen: set[tuple[int, int, str]] = set()
    for name in check_operators(operators):
        for site in OPERATORS[name](src):
            key = (site.start, site.end, site.replacement)
            if key in seen or (lines and not lines[0] <= site.line <= lines[1]):
                continue
            seen.add(key)
            sites.append(site)
    sites = [_whole_line(text, site) for site in sites]
    sites.sort(key=lambda s: (s.start, s.operator))
    out, ordinal = [], {}
    for site in sites:
        k = (site.operator, site.line)
        ordinal[k] = ordinal.get(k, 0) + 1
        suffix = f".{ordinal[k]}" if ordinal[k] > 1 else ""
        out.append(Mutant(id=f"{site.operator}@{site.line}{suffix}", path=path, operator=site.operator,
                          line=site.line, description=site.what, site=site, original_sha=sha))
    return out


def _whole_line(text: str, site: Site) -> Site:
    """A deletion that would leave a blank line takes the line with it (a cleaner diff)."""
    if site.replacement:
        return site
    lo = text.rfind("\n", 0, site.start) + 1
    hi = text.find("\n", site.end)
    hi = len(text) if hi < 0 else hi
    if text[lo:site.start].strip() or text[site.end:hi].strip():
        return site
    return dataclasses.replace(site, start=lo, end=min(len(text), hi + 1))


@dataclasses.dataclass(frozen=True)
class SitesNote:
    """How one file's sites were found; `incomplete` when the preprocessor was asked but did
    not decide every line: none succeeded (the text scanner decided) or headers it did not
    find were read as empty (what `hazards mutate` says on stderr)."""

    path: Path
    how: str
    incomplete: bool

    def __str__(self) -> str:
        return f"{self.path}: {self.how}"


def mutants_of(path: Path, *, preprocess: bool = True, language: str | None = None,
               notes: list[SitesNote] | None = None, **kw) -> tuple[str, list[Mutant]]:
    """(the file's text, its mutants); a one-line UserError for a file that cannot be read.
    With `preprocess`, dead lines and macros come from the preprocessor's output
    (`preprocess.find_live`); how the sites were found is appended to `notes`."""
    try:
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}") from None
    live, how = None, "sites found by the text scanner (--no-preprocess)"
    if preprocess:
        live, how = find_live(path, text, defines=kw.get("defines"), language=language)
    if notes is not None:
        notes.append(SitesNote(path, how, incomplete=preprocess and (live is None or live.stubbed)))
    return text, mutants_of_text(text, str(path), live=live, **kw)
