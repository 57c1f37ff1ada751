"""Every runtime family's Python side mirrors its binary: the static model judges the point
the binary runs only if variants, roles, presets and defaults agree (`--list`).

Covers every family with a `binary`, so a new family is checked without a new test.
Compile-only (skipped with a reason when nvcc is absent)."""
from __future__ import annotations

import importlib
import json
import subprocess

import pytest

from hazards.families import all_families
from hazards.engine.build import find_compiler
from hazards.engine.errors import ToolchainMissing

RUNTIME = [f for f in all_families() if f.binary]


@pytest.fixture(scope="module")
def nvcc() -> None:
    try:
        find_compiler("sm_90a")
    except ToolchainMissing as e:
        pytest.skip(f"nvcc not available, cannot compile for sm_90a: {e}")


@pytest.mark.parametrize("family", RUNTIME, ids=[f.name for f in RUNTIME])
def test_python_variants_presets_and_defaults_match_the_binary_listing(nvcc, family):
    from hazards.stress_family import family_binary

    exe = family_binary(family)
    listing = json.loads(subprocess.run([str(exe), "--list"], capture_output=True, text=True,
                                        timeout=60, check=True).stdout)
    assert listing["family"] == family.name
    assert [(v["name"], v["role"]) for v in listing["variants"]] == [(v.name, v.role) for v in family.variants]
    for v in listing["variants"]:
        assert v["params"] == family.variant(v["name"]).params, v["name"]
    mod = importlib.import_module(f"hazards.families.{family.name}")
    if hasattr(mod, "DEFAULTS"):
        defaults = {**mod.DEFAULTS, **getattr(mod, "RUNTIME_DEFAULTS", {})}
        assert {p["name"]: p["default"] for p in listing["params"]} == defaults


def test_every_runtime_family_is_covered():
    assert {"pipeline", "ordering", "deadlock", "barrier_layout"} <= {f.name for f in RUNTIME}
