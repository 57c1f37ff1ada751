"""Family `deadlock` on a GPU: fixed variants clean, seeded hangs diagnosed by name.

Each broken variant runs as a command target with a tripwire file; the watchdog's
collector must classify it `hang` and name the barrier and the stragglers.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from hazards.kernel_sources import family_dir
from hazards.engine.outcome import Outcome
from hazards.engine.targets import CommandTarget
from hazards.engine.targets.tripwire import TripwireTarget
from hazards.engine.tripwire import TripwireFile, load_names

pytestmark = pytest.mark.gpu
NAMES = load_names(family_dir("deadlock") / "deadlock_names.h")


@pytest.fixture(scope="module")
def binary() -> Path:
    from hazards.families import get_family
    from hazards.stress_family import family_binary

    return family_binary(get_family("deadlock"))


def run_variant(binary: Path, params: dict, timeout: float, tmp_path: Path):
    with TripwireFile() as tw:
        target = TripwireTarget(CommandTarget([str(binary), "--once"], env=tw.env()), tw, names=NAMES)
        return target.run(params, timeout=timeout, artifact_dir=tmp_path)


@pytest.mark.parametrize("variant", ["fixed_grid", "fixed_chunk", "fixed_epoch", "fixed_epoch_widen"])
def test_fixed_variants_are_clean_over_1000_launches(binary: Path, tmp_path: Path, variant: str) -> None:
    r = run_variant(binary, {"variant": variant, "launches": 1000}, 60, tmp_path)
    assert r.outcome is Outcome.CLEAN, (r.reason, r.evidence.get("stderr_tail"))
    assert r.metrics.get("launches") == 1000 and r.metrics.get("mismatched") == 0


@pytest.mark.parametrize("variant, launches, must_name", [
    ("broken_grid", 1, ["wait at barrier GRID", "never started (block never resident)"]),
    ("broken_chunk", 1, ["wait at barrier ATTN_RELEASE epoch 1 (observed 0)",
                         "CHUNK_MERGE counted 10 arrivals, all of them waiting there, of the 16"]),
    ("broken_epoch", 40, ["wait at barrier ATTN_RELEASE"]),
])
def test_seeded_deadlocks_hang_and_are_named(binary: Path, tmp_path: Path, variant: str, launches: int,
                                             must_name: list[str]) -> None:
    r = run_variant(binary, {"variant": variant, "launches": launches}, 3, tmp_path)
    assert r.outcome is Outcome.HANG, r.reason
    tw = r.evidence["tripwire"]
    assert tw["when"] == "hang" and tw["verdict"] == "producer_never_arrived", tw
    for text in must_name:
        assert text in tw["sentence"], tw["sentence"]


@pytest.mark.parametrize("variant", ["broken_grid", "broken_chunk"])
def test_a_seeded_deadlock_is_a_stall_within_the_window_on_the_family_server(binary: Path, variant: str) -> None:
    from hazards.engine.targets import ServerTarget

    with ServerTarget([str(binary), "--serve"], grace_s=0.5) as target:
        clean = target.run({"variant": "fixed_grid"}, timeout=60, launches=200, stall=1.0)
        assert clean.outcome is Outcome.CLEAN and clean.evidence["progress"]["events"] >= 1, clean.reason
        r = target.run({"variant": variant}, timeout=60, launches=1, stall=1.0)
    # the harness's heartbeat said the request started, then stopped with the hung kernel
    assert r.outcome is Outcome.HANG and r.error_kind == "stall", r.reason
    assert r.reason.startswith("no progress for 1.0 s (last: "), r.reason
    assert r.duration_s < 1.0 + 1.0


def test_a_seeded_deadlock_under_once_is_a_stall_through_its_progress_lines(binary: Path, tmp_path: Path) -> None:
    with TripwireFile() as tw:
        target = TripwireTarget(CommandTarget([str(binary), "--once"], env=tw.env()), tw, names=NAMES)
        r = target.run({"variant": "broken_grid", "launches": 1}, timeout=60, stall=1.0, artifact_dir=tmp_path)
    assert r.outcome is Outcome.HANG and r.error_kind == "stall", r.reason
    assert r.duration_s < 1.0 + 1.0 + 2.0  # the process's CUDA start-up comes before its first beat
