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


def test_a_familys_capabilities_are_fields_of_the_family_not_module_lookups():
    import hazards.families as catalog
    from hazards.families import all_families

    lookups = [str(p.relative_to(REPO)) for p in CODE if p != REPO / "hazards" / "families" / "__init__.py"
               and re.search(r"import_module\(f?[\"']hazards\.families\.", p.read_text())]
    assert lookups == []
    for fam in all_families():  # what a module defines is what its Family carries
        mod = importlib.import_module(f"{catalog.__name__}.{fam.name}")
        for name in ("static_check", "predicted_checks", "explain_hang", "static_targets"):
            assert getattr(fam, name) is getattr(mod, name, None), (fam.name, name)
        assert fam.static_archs == getattr(mod, "STATIC_ARCHS", (None,)), fam.name


def test_every_runtime_strategy_lives_in_its_family_module():
    families = REPO / "hazards" / "families"
    assert not [p.name for p in families.glob("*.py") if "hazards.strategies" in p.read_text()]
    assert sorted(p.name for p in (REPO / "hazards" / "strategies").glob("*.py")) == ["__init__.py", "static.py"]


def test_the_paths_beside_the_store_are_spelled_by_its_layout_only():
    # artifacts/, reports/, the example database (hypothesis/), spill files and backups beside
    # the database: hazards.engine.store.StoreLayout names them; everyone else asks it
    spelled = re.compile(r"""/\s*["'](?:artifacts|reports|hypothesis)["']|["'](?:hypothesis|artifacts|reports)["']\s*$"""
                         r"""|spill\.jsonl|\.unreadable""", re.M)
    elsewhere = [str(p.relative_to(REPO)) for p in CODE
                 if p != REPO / "stress" / "store.py" and spelled.search(p.read_text())]
    assert elsewhere == []
    from hazards.engine.store import Store, StoreLayout

    layout = StoreLayout(Path("/x/results.db"))
    assert (layout.artifacts(3), layout.report(3), layout.examples, layout.spills[0]) == (
        Path("/x/artifacts/campaign-3"), Path("/x/reports/campaign-3.html"), Path("/x/hypothesis"),
        Path("/x/results.db.spill.jsonl"))
    assert not hasattr(Store, "artifact_root") and not hasattr(Store, "report_path")


def test_every_command_that_leases_a_gpu_takes_the_lease_options_one_way():
    # --store, --lease-dir, --wait, --exclusive through options.lease_options (LeaseFlags)
    cli = REPO / "hazards" / "cli"
    leasing = [p for p in cli.glob("*.py") if "LeasedCampaign.acquire(" in p.read_text() or "run_gate(" in p.read_text()]
    assert len(leasing) >= 6
    own_way = [p.name for p in leasing if "@lease_options" not in p.read_text()]
    assert own_way == []


def test_every_command_that_reads_hangs_takes_the_hang_options_one_way():
    # --forensics, --hang-budget, --forensics-share, --stall through options.hang_options (HangFlags)
    cli = REPO / "hazards" / "cli"
    spelled = [p for p in cli.glob("*.py") if p.name != "options.py" and
               ("ForensicsOption" in p.read_text() or "StallOption" in p.read_text() or "@hang_options" in p.read_text())]
    assert len(spelled) >= 5
    own_way = [p.name for p in spelled if "@hang_options" not in p.read_text() or "ForensicsOption" in p.read_text()
               or "StallOption" in p.read_text()]
    assert own_way == []


def test_the_toolchain_programs_are_found_by_find_tool_only():
    # nvcc, clang, llvm-as, llvm-dis, nvdisasm, cuobjdump, compute-sanitizer... through toolchain.find_tool (override
    # variable, install hint, --skip), never looked up by name elsewhere
    by_hand = re.compile(r"which\(.*(?:nvcc|hipcc|clang|llvm-|nvdisasm|cuobjdump|ptxas|compute-sanitizer)")
    elsewhere = [str(p.relative_to(REPO)) for p in CODE
                 if p != REPO / "stress" / "toolchain.py" and by_hand.search(p.read_text())]
    assert elsewhere == []



def test_seconds_are_checked_by_one_validator():
    # a timeout, budget or window someone gave: hazards.engine.errors.check_seconds, never a
    # local copy with its own words (the CLI, the targets file and the targets had three)
    own = re.compile(r"raise UserError\(f?[\"'].*(?:number of seconds|and finite)")
    elsewhere = [str(p.relative_to(REPO)) for p in CODE
                 if p != REPO / "stress" / "errors.py" and own.search(p.read_text())]
    assert elsewhere == []
    from hazards.engine.errors import UserError, check_seconds

    assert check_seconds(None, "--timeout") is None and check_seconds("2.5", "x") == 2.5
    assert check_seconds(0, "grace", allow_zero=True) == 0.0
    for bad in (0, -1, float("inf"), float("nan"), "soon"):
        with pytest.raises(UserError, match="x must be a positive, finite number of seconds, got"):
            check_seconds(bad, "x")
