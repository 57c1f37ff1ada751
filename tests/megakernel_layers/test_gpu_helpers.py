"""The layered family's GPU tests' helpers on the CPU: bits.py's comparison of two builds, with a fake build and a
fake checked launch in place of family_binary and dump_run, and test_gpu.py's launch budget of a seeded hang."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from . import bits

CLEAN = {"layers": 2, "seq": 1024}
STALE = {"layers": 2, "seq": 1024, "hazard": "stale_descriptor"}
STEP_15 = {"MKL_CAMPAIGN_STEP": 15}
STEP_Q = {"MKL_CAMPAIGN_STEP": 19}


class FakeRunner:
    """A build is a path named by its defines; a launch returns the output and the `mismatched` count given for
    that build (by default 8 outputs of 1.0, clean), and is recorded as (binary, params)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        import hazards.megakernel_layers.calibration as calibration
        import hazards.stress_family as stress_family

        self.outputs: dict[str, list[float]] = {}
        self.mismatched: dict[str, int] = {}
        self.launches: list[tuple[str, dict]] = []
        monkeypatch.setattr(stress_family, "family_binary", self.family_binary)
        monkeypatch.setattr(calibration, "dump_run", self.dump_run)

    @staticmethod
    def family_binary(family, *, defines=None) -> Path:
        assert family.name == "megakernel_layers"
        return Path("build", json.dumps(defines, sort_keys=True))

    def give(self, defines, output: list[float] | None = None, mismatched: int = 0) -> None:
        key = str(Path("build", json.dumps(defines, sort_keys=True)))
        if output is not None:
            self.outputs[key] = output
        self.mismatched[key] = mismatched

    def dump_run(self, binary, params: dict):
        import torch

        self.launches.append((str(binary), params))
        out = torch.tensor(self.outputs.get(str(binary), [1.0] * 8), dtype=torch.float32)
        return out, out.clone(), {"status": "ok", "mismatched": self.mismatched.get(str(binary), 0)}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeRunner:
    return FakeRunner(monkeypatch)


def test_the_same_bits_pass_after_one_checked_launch_of_each_build(fake: FakeRunner):
    bits.assert_same_bits(STEP_Q, STEP_15, CLEAN)
    assert fake.launches == [('build/{"MKL_CAMPAIGN_STEP": 19}', CLEAN), ('build/{"MKL_CAMPAIGN_STEP": 15}', CLEAN)]


def test_one_differing_output_fails_and_the_message_names_both_builds(fake: FakeRunner):
    fake.give(STEP_15, [1.0] * 7 + [1.0000001])
    with pytest.raises(AssertionError) as failed:
        bits.assert_same_bits(None, STEP_15, CLEAN)
    message = str(failed.value)
    assert "candidate None and base {'MKL_CAMPAIGN_STEP': 15}" in message and "1 of 8 outputs" in message, message


def test_outputs_of_other_lengths_fail(fake: FakeRunner):
    fake.give(STEP_15, [1.0] * 9)
    with pytest.raises(AssertionError, match="8 outputs against 9"):
        bits.assert_same_bits(STEP_Q, STEP_15, CLEAN)


def test_a_mismatched_launch_of_either_build_fails_a_clean_comparison(fake: FakeRunner):
    for build in (STEP_Q, STEP_15):
        fake.give(STEP_Q, mismatched=0)
        fake.give(STEP_15, mismatched=0)
        fake.give(build, mismatched=3)
        with pytest.raises(AssertionError, match=re.escape(str(build))):
            bits.assert_same_bits(STEP_Q, STEP_15, CLEAN)
        with pytest.raises(AssertionError):
            bits.checked_outputs(STEP_Q, STEP_15, CLEAN)


def test_stale_descriptor_wants_both_builds_corrupted(fake: FakeRunner):
    fake.give(STEP_Q, mismatched=5)
    with pytest.raises(AssertionError, match="mismatched': 0"):  # the base, clean, is not corrupted
        bits.assert_same_bits(STEP_Q, STEP_15, STALE)
    fake.give(STEP_15, mismatched=5)
    bits.assert_same_bits(STEP_Q, STEP_15, STALE)
    with pytest.raises(AssertionError):  # told the hazard does not corrupt: the mismatches fail it
        bits.assert_same_bits(STEP_Q, STEP_15, STALE, corrupting=False)


def test_another_hazard_is_clean_unless_told_it_corrupts(fake: FakeRunner):
    amax_tail = {"layers": 2, "seq": 1024, "hazard": "amax_tail"}
    bits.assert_same_bits(None, STEP_15, {"layers": 2, "seq": 1024, "hazard": "routing_no_fence"})
    with pytest.raises(AssertionError):
        bits.assert_same_bits(STEP_Q, STEP_15, amax_tail, corrupting=True)
    fake.give(STEP_Q, mismatched=2)
    fake.give(STEP_15, mismatched=2)
    bits.assert_same_bits(STEP_Q, STEP_15, amax_tail, corrupting=True)


def test_a_built_binary_is_launched_as_given_and_outputs_come_back_candidate_first(fake: FakeRunner):
    fake.give(STEP_15, [2.0] * 8)
    out, out_base = bits.checked_outputs(Path("prebuilt", "step_d"), STEP_15, CLEAN)
    assert out.tolist() == [1.0] * 8 and out_base.tolist() == [2.0] * 8
    assert [binary for binary, _ in fake.launches] == ["prebuilt/step_d", 'build/{"MKL_CAMPAIGN_STEP": 15}']


def test_a_negative_control_passes_only_with_other_bits_than_a_clean_base(fake: FakeRunner):
    """bits.assert_not_same_bits (steps (u)'s and (v)'s controls): the base's bits fail it; other bits pass, NaN
    among them, with the control's own check failed or not; a base whose check fails fails it."""
    control = {"MKL_ATTN_STAGE": 1, "MKL_STAGE_CONTROL_NO_COPY": 1}
    with pytest.raises(AssertionError, match="gives base None's bits"):
        bits.assert_not_same_bits(control, None, CLEAN)
    assert [binary for binary, _ in fake.launches] == [f"build/{json.dumps(control, sort_keys=True)}", "build/null"]
    fake.give(control, [float("nan")] * 8, mismatched=1)
    bits.assert_not_same_bits(control, None, CLEAN)
    fake.give(control, [1.0] * 7 + [1.0000001])
    bits.assert_not_same_bits(control, None, CLEAN)
    fake.give(None, mismatched=2)
    with pytest.raises(AssertionError, match="mismatched': 2"):
        bits.assert_not_same_bits(control, None, CLEAN)


def test_a_certain_hang_gets_20_launches_and_an_intermittent_one_launches_to_see():
    from hazards.families import megakernel_layers as F

    from .test_gpu import HANGS, hang_launches, launches_to_see

    certain = [v for v in HANGS if F.predict({"variant": v}).probability >= 1]
    assert certain and "snapshot_epoch" in HANGS and "snapshot_epoch" not in certain
    for variant in certain:
        assert hang_launches(variant) == (20, True), variant
    assert hang_launches("snapshot_epoch") == (launches_to_see("snapshot_epoch"), False)
    assert launches_to_see("snapshot_epoch") > 20


def test_close_outputs_pass_and_each_of_the_three_bounds_fails_alone(monkeypatch: pytest.MonkeyPatch):
    """bits.assert_close: other last bits pass; a spread perturbation of relative size 4.8e-3 fails on cos alone,
    one output off by 3e-3 of the largest on the largest difference alone, and a scale of 1e-3 on the relative error
    alone under a tolerance of 1e-3 (at the family's 2e-2 the other two bounds imply it)."""
    import types

    import torch

    import hazards.families

    base = torch.zeros(4096, dtype=torch.float64)
    base[0] = 1.0
    bits.assert_close(base * (1 + 1e-7), base)
    spread = base.clone()
    spread[1:] = 4.8e-3 / 4095 ** 0.5  # cos 0.9999885, largest difference 7.5e-5, rel_err 4.8e-3
    with pytest.raises(AssertionError, match=r"^\(0\.99998"):
        bits.assert_close(spread, base)
    spike = base.clone()
    spike[7] = 3e-3  # cos 0.9999955, largest difference 3e-3, rel_err 3e-3
    with pytest.raises(AssertionError, match=r"0\.003"):
        bits.assert_close(spike, base)
    real = hazards.families.get_family("megakernel_layers")
    monkeypatch.setattr(hazards.families, "get_family",
                        lambda name: types.SimpleNamespace(defaults={**real.defaults, "tol_e6": 1000}))
    with pytest.raises(AssertionError, match=r"0\.001"):  # cos 1, largest difference 1e-3, rel_err 1e-3 > 2.5e-4
        bits.assert_close(base * (1 + 1e-3), base)
