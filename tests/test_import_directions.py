"""Arrows point down: the engine (`stress/`, installed as `hazards.engine`)
imports nothing of the catalog above it; the reference megakernels' packages import neither
the catalog nor its glue; no module of `hazards/static/` imports one that imports it back.
Every import counts, function-local ones included: a lazy import is still an arrow."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _imports(path: Path, package: str) -> set[str]:
    """The absolute names `path` imports (relative imports resolved against `package`)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}  # `from pkg import module`
    return out


def _package_of(path: Path, root: Path, name: str) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [name, *rel.parts]
    return ".".join(parts[:-1] if parts[-1] != "__init__" else parts[:-1])


def test_the_engine_imports_nothing_from_the_catalog():
    root = REPO / "stress"
    bad = {}
    for path in sorted(root.rglob("*.py")):
        names = _imports(path, _package_of(path, root, "hazards.engine"))
        # `import hazards` only finds the checkout's root (containment's guardian)
        up = sorted(n for n in names if n.startswith("hazards") and n != "hazards"
                    and not n.startswith("hazards.engine"))
        if up:
            bad[str(path.relative_to(REPO))] = up
    assert bad == {}


CATALOG_AND_GLUE = ("hazards.families", "hazards.strategies", "hazards.stress_family", "hazards.checkrun",
                    "hazards.cli", "hazards.gates", "hazards.explore", "hazards.static_catalog")


@pytest.mark.parametrize("package", ["ragged_decode", "megakernel_layers"])
def test_a_reference_megakernel_package_imports_neither_the_catalog_nor_its_glue(package):
    root = REPO / "hazards" / package
    bad = {}
    for path in sorted(root.glob("*.py")):
        up = sorted(n for n in _imports(path, f"hazards.{package}") if n.startswith(CATALOG_AND_GLUE))
        if up:
            bad[path.name] = up
    assert bad == {}


def test_the_static_checks_have_no_import_cycle():
    root = REPO / "hazards" / "static"
    mods = {f"hazards.static.{p.stem}": p for p in root.glob("*.py") if p.stem != "__init__"}
    graph = {m: {n for n in _imports(p, "hazards.static") if n in mods and n != m} for m, p in mods.items()}
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        for n in graph[m]:
            if n in path:
                cycles.append(path[path.index(n):] + [n])
            elif len(path) < len(mods):
                visit(n, path + [n])

    for m in sorted(graph):
        visit(m, [m])
    assert cycles == [], cycles[:3]
