"""What a static check reports: one `Finding` per hazard, with where and why.

Every checker in `hazards.static` returns `list[Finding]`. More in docs/static-checks.md.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Iterable, Literal

Severity = Literal["error", "warning", "perf", "info"]
SEVERITIES: tuple[str, ...] = ("error", "warning", "perf", "info")
FAILING: frozenset[str] = frozenset({"error", "warning"})


@dataclasses.dataclass(frozen=True)
class Finding:
    """One hazard (or note) a static check found.

    `check` is a stable id such as ``asm-overlap`` or ``mfma-acc-read``; `path`/`line` point
    at the text the checker read (a source file, an emitted ``.s``/SASS listing, a layout
    file); `snippet` is the offending block or instruction(s), verbatim.
    """

    check: str
    severity: Severity
    path: str
    line: int
    message: str
    snippet: str = ""
    subject: str = ""  # e.g. "earlyclobber/broken" for catalog findings

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    @property
    def fails(self) -> bool:
        """True when this finding should make a check command exit non-zero."""
        return self.severity in FAILING

    def location(self) -> str:
        """`path:line`, the form editors and CI annotations understand."""
        return f"{self.path}:{self.line}" if self.line else self.path

    def format(self, *, with_snippet: bool = True) -> str:
        """Human-readable multi-line rendering: location, severity, check, message, block."""
        head = f"{self.location()}: {self.severity}: [{self.check}] {self.message}"
        if self.subject:
            head = f"{head} ({self.subject})"
        if not with_snippet or not self.snippet:
            return head
        body = "\n".join("    | " + ln for ln in self.snippet.rstrip("\n").splitlines())
        return f"{head}\n{body}"

    def to_dict(self) -> dict:
        """JSON-ready dict (for `--json` output and the CI report)."""
        return dataclasses.asdict(self)


def with_subject(findings: Iterable[Finding], subject: str) -> list[Finding]:
    """The same findings tagged with a subject (family/variant) for catalog reports."""
    return [dataclasses.replace(f, subject=subject) for f in findings]


def to_json(findings: Iterable[Finding]) -> str:
    """A JSON array of findings, one object each."""
    return json.dumps([f.to_dict() for f in findings], indent=2)
