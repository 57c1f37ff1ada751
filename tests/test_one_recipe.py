"""One idea spelled once: values the code shares have one home, and names that
nothing uses are gone instead of lying about what the code does."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CODE = [p for d in ("hazards", "stress") for p in (REPO / d).rglob("*.py")]


@pytest.mark.parametrize("module, name", [
    ("hazards.stress_family", "proof"),                 # WorkItem.proof is the one recipe
    ("hazards.cli.progress", "INTERVAL_ENV"),           # the option's envvar says it
    ("hazards.static.compiled", "AMD_ARCHS"),           # toolchain.AMD_ARCHS
    ("hazards.static.compiled", "NVIDIA_ARCHS"),
    ("hazards.megakernel_layers.model", "NWARPS"),
    ("hazards.engine.errors", "EXIT_INTERRUPTED"),      # 128 + the signal, computed where it happens
    ("hazards.engine.sources", "SprtStop"),             # no command used it; check allocates by evidence
])
def test_a_name_nothing_uses_is_gone(module, name):
    assert not hasattr(importlib.import_module(module), name)


def test_no_method_nothing_calls_is_left():
    from hazards.engine.store import Store
    from hazards.megakernel_layers.model import Schedule

    assert not hasattr(Store, "finish_campaign")  # set_campaign_status
    assert not hasattr(Schedule, "qkv_holders")


def test_exit_codes_are_defined_once_in_the_engines_errors_module():
    defining = re.compile(r"^\s*EXIT_[A-Z_]+(\s*,\s*EXIT_[A-Z_]+)*\s*=", re.MULTILINE)
    elsewhere = [str(p.relative_to(REPO)) for p in CODE
                 if p != REPO / "stress" / "errors.py" and defining.search(p.read_text())]
    assert elsewhere == []


def test_the_nvidia_target_is_spelled_once():
    literal = re.compile(r"""["']sm_90a["']""")
    elsewhere = [f"{p.relative_to(REPO)}:{n}" for p in CODE if p != REPO / "stress" / "toolchain.py"
                 for n, line in enumerate(p.read_text().splitlines(), 1)
                 if literal.search(line) and not line.lstrip().startswith("#")]
    assert elsewhere == [], "use hazards.engine.toolchain.SM90A"
