"""The check-id registry: one spelling per id, the docs table generated from it, and the
static package checking artifacts only (no import of the catalog)."""
from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from hazards.families import barrier_layout, earlyclobber, mfma_pipeline
from hazards.static import checks
from hazards.static_catalog import CATALOG_CHECKS
from static_helpers import REPO

STATIC = REPO / "hazards" / "static"


def _imports(path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_the_static_package_imports_nothing_from_the_catalog():
    # hazards.kernel_sources only says where the kernel sources are (a build key's root)
    allowed = ("hazards.static", "hazards.engine", "hazards.kernel_sources")
    for path in sorted(STATIC.glob("*.py")):
        bad = {m for m in _imports(path) if m.startswith("hazards") and not m.startswith(allowed)}
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_findings_are_made_through_the_registry_not_spelled_inline():
    for path in sorted(STATIC.glob("*.py")):
        if path.name in ("findings.py", "checks.py"):
            continue
        tree = ast.parse(path.read_text())
        calls = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and getattr(n.func, "id", getattr(n.func, "attr", "")) == "Finding"]
        assert not calls, f"{path.name}:{calls} builds a Finding without its Check"


def test_the_docs_table_is_generated_from_the_registry():
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "static_checks_table.py"),
                           "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, "docs/static-checks.md is stale: run scripts/static_checks_table.py"


def test_ids_are_unique_and_the_catalog_ids_do_not_shadow_artifact_checks():
    assert not {c.id for c in CATALOG_CHECKS} & set(checks.REGISTRY)
    with pytest.raises(ValueError, match="registered twice"):
        checks.register(checks.Check("early-clobber", "info", "source", "another meaning"))


def test_a_finding_carries_its_checks_severity_and_only_a_declared_alternative():
    f = checks.EARLY_CLOBBER.finding("k.hip", 3, "why")
    assert (f.check, f.severity, f.fails) == ("early-clobber", "error", True)
    assert checks.LAYOUT_WT_L2_LINE.finding("l", 0, "m", severity="warning").severity == "warning"
    with pytest.raises(ValueError, match="never 'info'"):
        checks.EARLY_CLOBBER.finding("k.hip", 3, "why", severity="info")


def test_a_killed_tool_is_a_tool_killed_error_saying_what_was_not_judged_and_why():
    from hazards.static.compile import ToolKilled

    killed = ToolKilled("nvdisasm was ended by SIGKILL before it finished")
    f = checks.tool_killed("k.cubin", "SASS checks could not run", killed, subject="fam/broken")
    assert (f.check, f.severity, f.fails, f.path, f.line, f.subject) == (
        "tool-killed", "error", True, "k.cubin", 0, "fam/broken")
    assert f.message == "SASS checks could not run: nvdisasm was ended by SIGKILL before it finished"
    assert checks.tool_killed("k.cu", "not checked for sm_90a", killed).subject == ""


@pytest.mark.parametrize("mod", [earlyclobber, mfma_pipeline, barrier_layout])
def test_every_id_a_family_predicts_is_registered(mod):
    for v in mod.FAMILY.variants:
        for check_id in mod.predicted_checks({"variant": v.name}):
            assert checks.get(check_id).id == check_id
