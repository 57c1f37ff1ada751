"""JUnit XML for CI systems (Jenkins, GitLab, GitHub Actions test reporters, Azure...).

Written to the strictest common reading of the Ant/Jenkins JUnit format: a `<testsuites>`
root whose `<testsuite>` elements carry name, id, package, timestamp (ISO 8601, no zone),
hostname, tests, failures, errors, skipped and time, and contain `<properties>`, then
`<testcase>` elements (each with at most one of `<failure>`, `<error>`, `<skipped>`),
then `<system-out>` and `<system-err>`. `tests/data/junit.xsd` states exactly that, and
the tests validate every file they write against it.
"""
from __future__ import annotations

import dataclasses
import os
import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Literal

from .outcome import HOST

Status = Literal["passed", "failure", "error", "skipped"]
# XML 1.0 forbids most control characters even escaped; a kernel log may contain them.
_BAD_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _clean(text: str | None) -> str:
    return _BAD_XML.sub("?", text or "")


@dataclasses.dataclass
class JUnitCase:
    """One test case: `status` passed, failure (the check caught a problem), error (our
    infrastructure could not judge), or skipped (with the reason in `message`)."""

    name: str
    classname: str
    time_s: float = 0.0
    status: Status = "passed"
    message: str = ""
    type: str = ""
    text: str = ""


@dataclasses.dataclass
class JUnitSuite:
    """A named group of cases with its start time and captured output."""

    name: str
    cases: list[JUnitCase] = dataclasses.field(default_factory=list)
    started_at: float = dataclasses.field(default_factory=time.time)
    properties: dict[str, str] = dataclasses.field(default_factory=dict)
    stdout: str = ""
    stderr: str = ""

    def count(self, status: Status) -> int:
        return sum(1 for c in self.cases if c.status == status)


def to_element(suites: list[JUnitSuite]) -> ET.Element:
    """The `<testsuites>` element for these suites."""
    root = ET.Element("testsuites")
    for i, s in enumerate(suites):
        el = ET.SubElement(root, "testsuite", {
            "name": _clean(s.name) or "hazards",
            "id": str(i),
            "package": _clean(s.name) or "hazards",
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(s.started_at)),
            "hostname": HOST or "localhost",
            "tests": str(len(s.cases)),
            "failures": str(s.count("failure")),
            "errors": str(s.count("error")),
            "skipped": str(s.count("skipped")),
            "time": f"{sum(max(0.0, c.time_s) for c in s.cases):.3f}",
        })
        props = ET.SubElement(el, "properties")
        for k, v in sorted(s.properties.items()):
            ET.SubElement(props, "property", {"name": _clean(str(k)), "value": _clean(str(v))})
        for c in s.cases:
            tc = ET.SubElement(el, "testcase", {"name": _clean(c.name), "classname": _clean(c.classname),
                                                "time": f"{max(0.0, c.time_s):.3f}"})
            if c.status == "skipped":
                ET.SubElement(tc, "skipped", {"message": _clean(c.message)})
            elif c.status in ("failure", "error"):
                sub = ET.SubElement(tc, c.status, {"message": _clean(c.message), "type": _clean(c.type or c.status)})
                sub.text = _clean(c.text or c.message)
        ET.SubElement(el, "system-out").text = _clean(s.stdout)
        ET.SubElement(el, "system-err").text = _clean(s.stderr)
    return root


def write_junit(path: str | os.PathLike[str], suites: list[JUnitSuite]) -> Path:
    """Write the suites as JUnit XML (UTF-8, atomically: a reader never sees half a file)."""
    out = Path(path)
    tree = ET.ElementTree(to_element(suites))
    ET.indent(tree)
    if out.parent and not out.parent.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tree.write(tmp, encoding="utf-8", xml_declaration=True)
    os.replace(tmp, out)
    return out
