"""End to end on the CPU: a fake instrumented program, the real CommandTarget and watchdog.

Checks the collector's live diagnosis on a hang, the post-mortem one after a crash, the
sentinel for a program that never opens the file, and that no file is left in /dev/shm.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hazards.engine.outcome import Outcome
from hazards.engine.targets import CommandTarget
from hazards.engine.targets.tripwire import TripwireTarget
from hazards.engine.tripwire import Names, TripwireFile
from hazards.engine.tripwire.session import PREFIX, SHM_DIR

NAMES = Names(barriers={3: "ATTN_RELEASE"}, phases={7: "MOE_W13_W2"})


def _ours() -> set[str]:
    """Tripwire files this test process created that still exist."""
    d = Path(SHM_DIR if os.path.isdir(SHM_DIR) else "/tmp")
    return {p.name for p in d.glob(f"{PREFIX}{os.getpid()}-*")}


def run_fake(fake_kernel: Path, mode: str, tmp_path: Path, timeout: float = 1.5):
    before = _ours()
    with TripwireFile() as tw:
        assert stat.S_IMODE(os.stat(tw.path).st_mode) == 0o600
        target = TripwireTarget(CommandTarget([str(fake_kernel), mode], env=tw.env()), tw, names=NAMES)
        result = target.run(timeout=timeout, artifact_dir=tmp_path / mode)
        path = tw.path
    assert not path.exists(), "tripwire file left in /dev/shm"
    assert _ours() == before
    return result


@pytest.mark.parametrize("mode", ["clean", "hang", "fault"])
def test_no_tripwire_file_survives_a_run(fake_kernel: Path, tmp_path: Path, mode: str) -> None:
    run_fake(fake_kernel, mode, tmp_path)


def test_clean_run_keeps_no_tripwire_artifact(fake_kernel: Path, tmp_path: Path) -> None:
    r = run_fake(fake_kernel, "clean", tmp_path)
    assert r.outcome is Outcome.CLEAN
    assert "tripwire" not in r.evidence
    assert not list((tmp_path / "clean").glob("tripwire*"))


def test_hang_is_diagnosed_live_before_the_kill(fake_kernel: Path, tmp_path: Path) -> None:
    r = run_fake(fake_kernel, "hang", tmp_path)
    assert r.outcome is Outcome.HANG
    tw = r.evidence["tripwire"]
    assert tw["when"] == "hang"
    assert tw["sentence"].startswith("6 workers wait at barrier ATTN_RELEASE epoch 6 (observed 5); "
                                     "1 straggler at MOE_W13_W2 layer 4; 1 worker never started")
    assert tw["stragglers"] == [6] and tw["never_started"] == [7]
    assert any("did not move" in n for n in tw["notes"])  # the straggler is frozen, the waiters spin
    art = tmp_path / "hang"
    for name in ("tripwire-hang.json", "tripwire-hang.txt", "tripwire-hang-1.bin", "tripwire-hang-2.bin",
                 "tripwire-final.bin"):
        assert (art / name).is_file(), name


def test_fault_gets_a_post_mortem_diagnosis(fake_kernel: Path, tmp_path: Path) -> None:
    r = run_fake(fake_kernel, "fault", tmp_path)
    assert r.outcome is Outcome.FAULT
    tw = r.evidence["tripwire"]
    assert tw["when"] == "post-mortem"
    assert "6 workers wait at barrier ATTN_RELEASE" in tw["sentence"]
    assert (tmp_path / "fault" / "tripwire-postmortem.txt").read_text().startswith(tw["sentence"])


def test_a_program_that_never_opens_the_file_reads_as_never_opened(fake_kernel: Path, tmp_path: Path) -> None:
    r = run_fake(fake_kernel, "noopen", tmp_path, timeout=0.5)
    assert r.outcome is Outcome.HANG
    assert r.evidence["tripwire"]["verdict"] == "no_tripwire"
    assert "never opened" in r.evidence["tripwire"]["sentence"]


def test_file_names_are_unique_and_private() -> None:
    with TripwireFile() as a, TripwireFile() as b:
        assert a.path != b.path
        assert a.path.parent == b.path.parent
        for f in (a, b):
            assert stat.S_IMODE(os.stat(f.path).st_mode) == 0o600
    assert not a.path.exists() and not b.path.exists()


def test_a_family_explainer_reads_the_final_file_and_extends_the_sentence(fake_kernel: Path,
                                                                          tmp_path: Path) -> None:
    seen = {}

    def explain(snap, params):
        seen["workers"], seen["params"] = snap.header.workers, params
        return f"{sum(s.waiting for s in snap.slots)} waiting, as the family reads it"

    with TripwireFile() as tw:
        target = TripwireTarget(CommandTarget([str(fake_kernel), "hang"], env=tw.env()), tw, names=NAMES,
                                explain=explain)
        r = target.run({"variant": "x"}, timeout=1.5, artifact_dir=tmp_path)
    tw_ev = r.evidence["tripwire"]
    assert r.outcome is Outcome.HANG and seen["params"] == {"variant": "x"} and seen["workers"] == 8
    assert tw_ev["sentence"].startswith("6 workers wait at barrier ATTN_RELEASE")
    assert tw_ev["sentence"].endswith("| 6 waiting, as the family reads it")
    assert tw_ev["explanation"] == "6 waiting, as the family reads it"


def test_a_failing_explainer_keeps_the_engine_diagnosis(fake_kernel: Path, tmp_path: Path) -> None:
    def explain(snap, params):
        raise KeyError("boom")

    with TripwireFile() as tw:
        target = TripwireTarget(CommandTarget([str(fake_kernel), "fault"], env=tw.env()), tw, names=NAMES,
                                explain=explain)
        r = target.run(timeout=1.5, artifact_dir=tmp_path)
    assert r.outcome is Outcome.FAULT
    assert "6 workers wait at barrier ATTN_RELEASE" in r.evidence["tripwire"]["sentence"]
    assert "explanation failed: KeyError" in r.evidence["tripwire"]["sentence"]


def test_a_hang_past_the_forensics_cap_keeps_one_read_of_the_file_and_its_hang_md_leads_with_it(
        fake_kernel: Path, tmp_path: Path) -> None:
    """No collector runs (the cap is spent), yet the file is read once before the kill: the
    target keeps that diagnosis (no second, post-mortem read) and hang.md leads with it."""
    from hazards.engine.forensics.policy import ForensicsPolicy

    policy = ForensicsPolicy(hang_budget_s=1)
    with TripwireFile() as tw, policy.installed(1.0):  # a 0.1 s cap
        target = TripwireTarget(CommandTarget([str(fake_kernel), "hang"], env=tw.env()), tw, names=NAMES)
        policy.learn((target.name, ""), ["fake_kernel.c:1"])  # located: no first full collection either
        r = target.run(timeout=1.5, artifact_dir=tmp_path)
    assert r.outcome is Outcome.HANG and policy.summary()["none"] == 1
    assert r.evidence["tripwire"]["when"] == "hang, one read"
    assert not list(tmp_path.glob("tripwire-postmortem*")) and (tmp_path / "tripwire-hang-1.bin").is_file()
    md = (tmp_path / "hang.md").read_text().split("\n")
    assert md[2].startswith("tripwire: 6 workers wait at barrier ATTN_RELEASE epoch 6 (observed 5)"), md[2]
    assert "(not read: forensics: the forensics cap is spent" in md[2]
