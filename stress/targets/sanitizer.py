"""Run a command target under NVIDIA compute-sanitizer and make its report the run's evidence.

`SanitizerTarget` wraps a `CommandTarget` of a `--once`-style command (one process per run:
the sanitizer's report is only complete when the process exits, and its output must not
mix with a server's protocol stream). The report goes to a log file in the run's artifact
folder and is parsed into counts. More in docs/architecture.md.
"""
from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..outcome import Outcome, RunResult
from ..targets.base import WrapperTarget, run_kw
from ..targets.command import CommandTarget
from ..toolchain import find_tool

TOOLS = ("racecheck", "synccheck", "memcheck", "initcheck")
ERROR_KINDS = {"racecheck": "sanitizer_race", "synccheck": "sanitizer_sync",
               "memcheck": "sanitizer_memcheck", "initcheck": "sanitizer_initcheck"}
# Slowdown factors seen on the H200 (racecheck ~25x): callers scale their timeouts.
SLOWDOWN = {"racecheck": 40.0, "synccheck": 10.0, "memcheck": 10.0, "initcheck": 10.0}

_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+) errors?")
_RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY:\s*(\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
_ERROR_LINE = re.compile(r"^=+\s+(?:Error|ERROR)\b(?! SUMMARY).*$", re.MULTILINE)  # not the summary line
_HAZARD_KIND = re.compile(r"\b(RAW|WAR|WAW)\b")
_RACE_BETWEEN = re.compile(r"Race reported between (\w+) access.*?\n.*?and (\w+) access", re.DOTALL)
_HAZARD_COUNT = re.compile(r"\[(\d+) hazards?\]")
_UNUSABLE = re.compile(r"Device not supported|Unable to (?:find|load|initialize)|"
                       r"Target application terminated before first instrumented API call")


def find_sanitizer() -> str:
    """Path of compute-sanitizer (`toolchain.find_tool`); ToolchainMissing (one line) when there is none."""
    return find_tool("compute-sanitizer", "for --sanitizer")


def _race_kind(first: str, second: str) -> str:
    a, b = first.lower(), second.lower()
    if a == "write" and b == "write":
        return "WAW"
    return "RAW" if a == "write" else "WAR"


def parse_report(text: str, tool: str) -> dict[str, Any]:
    """Counts from a compute-sanitizer log: errors, warnings, hazards by kind, first error."""
    errors = max([int(m) for m in _ERROR_SUMMARY.findall(text)] or [0])
    warnings = 0
    race = _RACE_SUMMARY.search(text)
    if race:
        errors = max(errors, int(race.group(2)))
        warnings = int(race.group(3))
    error_lines = _ERROR_LINE.findall(text)
    errors = max(errors, len(error_lines))
    kinds: dict[str, int] = {}
    for first, second in _RACE_BETWEEN.findall(text):
        k = _race_kind(first, second)
        kinds[k] = kinds.get(k, 0) + 1
    for line in error_lines:
        for k in _HAZARD_KIND.findall(line):
            kinds[k] = kinds.get(k, 0) + 1
    report: dict[str, Any] = {
        "tool": tool, "errors": errors, "warnings": warnings,
        "hazards": sum(int(n) for n in _HAZARD_COUNT.findall(text)), "kinds": kinds,
        "unusable": bool(_UNUSABLE.search(text)),
    }
    if error_lines:
        report["first_error"] = error_lines[0].strip("= ").strip()[:300]
    if race:
        report["summary"] = race.group(0)
    return report


def judge(result: RunResult, report: dict[str, Any]) -> RunResult:
    """Fold a sanitizer report into a run's outcome (docs/architecture.md, In the code)."""
    result.evidence["sanitizer"] = report
    tool = report["tool"]
    if report["unusable"]:  # the sanitizer never instrumented the kernel: nothing is proven
        result.outcome = Outcome.ERROR
        result.reason = f"{tool} could not instrument the program"
        result.error_kind = "sanitizer_unavailable"
        result.evidence["error_kind"] = result.error_kind
    elif report["errors"] > 0:
        result.outcome = Outcome.FAULT
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(report["kinds"].items()))
        result.reason = (f"{tool}: {report['errors']} error(s)" + (f" ({kinds})" if kinds else "")
                         + (f"; {report['first_error']}" if "first_error" in report else ""))
        result.error_kind = ERROR_KINDS[tool]
        result.evidence["error_kind"] = result.error_kind
    return result


class SanitizerTarget(WrapperTarget):
    """Run a one-batch command target (such as `BIN --once`) under compute-sanitizer."""

    def __init__(self, inner: CommandTarget, tool: str, *, name: str | None = None,
                 print_limit: int = 20) -> None:
        if tool not in TOOLS:
            raise UserError(f"unknown sanitizer tool {tool!r} (known: {', '.join(TOOLS)})")
        if not isinstance(inner, CommandTarget):
            raise UserError("compute-sanitizer wraps a command target (one process per run), "
                            f"not a {type(inner).__name__}")
        super().__init__(inner, name or f"{tool}:{Path(inner.argv[0]).name}")
        self.tool = tool
        self.sanitizer = find_sanitizer()
        self.print_limit = print_limit

    def run(self, params: dict[str, Any] | None = None, *, timeout: float,
            launches: int | None = None, artifact_dir: Path | None = None,
            stall: float | None = None, cutoff: float | None = None) -> RunResult:
        """One process under the sanitizer; its report becomes the evidence."""
        tmp = None
        if artifact_dir is None:
            tmp = tempfile.mkdtemp(prefix="hz-sanitizer-")
            log_dir = Path(tmp)
        else:
            log_dir = Path(artifact_dir)
            log_dir.mkdir(parents=True, exist_ok=True)
        log = log_dir / f"{self.tool}.log"
        prefix = [self.sanitizer, "--tool", self.tool, "--log-file", str(log),
                  "--print-limit", str(self.print_limit)]
        try:
            result = self.inner.with_prefix(prefix, name=self.name).run(
                params, timeout=timeout, launches=launches, artifact_dir=artifact_dir,
                **run_kw(stall, cutoff))
            text = log.read_text(errors="replace") if log.exists() else ""
            report = parse_report(text, self.tool)
            if tmp is None:
                report["log"] = str(log)
            else:
                report["log_tail"] = text[-2000:]
            return judge(result, report)
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
