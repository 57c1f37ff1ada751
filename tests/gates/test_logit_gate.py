"""The logit gate on synthetic logits: paired per-position statistics, padding sliced out,
argmax agreement apart from top-1 accuracy, the sink self-check, the precision match, and
each gate (ceiling, ratio, KL) failing when tightened."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hazards.engine.errors import UserError
from hazards.gates import logits as lg

REPO = Path(__file__).resolve().parents[2]
S, T, V, VPAD = 8, 32, 20, 24


def make(seed: int = 0, noise: float = 0.0, shift_target: float = 0.0, fmt: str = "f32",
         pad_value: float = -5.0) -> tuple[lg.LogitSet, lg.LogitSet]:
    """A reference and a candidate = reference + noise (and the target's logit lowered)."""
    rng = np.random.default_rng(seed)
    ref = rng.normal(0, 2, (S, T, VPAD)).astype(np.float32)
    ref[..., V:] = pad_value
    targets = rng.integers(0, V, (S, T))
    cand = ref + rng.normal(0, noise, ref.shape).astype(np.float32)
    np.put_along_axis(cand, targets[..., None], np.take_along_axis(cand, targets[..., None], -1) - shift_target, -1)
    cand[..., V:] = pad_value
    emitted = cand[..., :V].argmax(-1)
    return (lg.LogitSet(ref, targets, V, "f32", None, "ref"),
            lg.LogitSet(cand.astype(np.float32), targets, V, fmt, emitted, "cand"))


def test_identical_logits_pass_with_zero_difference():
    ref, cand = make()
    res = lg.judge(ref, cand, ceiling=1e9)
    f = res["fixed_prefix"]
    assert res["verdict"] == "pass" and res["failed"] == []
    assert f["kl_mean"] == 0 and f["mean_dnats"] == 0 and f["ppl_ratio"] == 1 and f["argmax_agreement"] == 1


def test_per_position_nats_follow_the_softmax_over_the_real_vocabulary_only():
    ref, cand = make(shift_target=0.3)
    pp = lg.per_position(ref, cand)
    x = ref.logits.reshape(-1, VPAD)[:, :V].astype(np.float64)
    y = ref.targets.reshape(-1)
    expect = np.log(np.exp(x).sum(1)) - x[np.arange(len(y)), y]
    assert np.allclose(pp["nll_ref"], expect)
    # the padding columns never enter: a huge pad changes nothing
    ref2, cand2 = make(shift_target=0.3, pad_value=50.0)
    assert np.allclose(lg.per_position(ref2, cand2)["nll_cand"], pp["nll_cand"])


def test_a_lowered_target_logit_raises_the_median_dnats_inside_its_interval():
    ref, cand = make(shift_target=0.2)
    m = lg.judge(ref, cand, ratio=None, max_kl=None, ceiling=1e9)["fixed_prefix"]["median_dnats"]
    assert 0 < m["lo"] <= m["estimate"] <= m["hi"] < 0.2
    assert m["achieved"] >= 0.95


def test_argmax_agreement_is_reported_apart_from_top1_accuracy():
    # candidate = the reference with the two best columns swapped at every position: agreement 0,
    # yet both paths have the same kind of accuracy against the corpus -- two different "top-1"s
    ref, _ = make()
    cand_logits = ref.logits.copy()
    order = np.argsort(-ref.logits[..., :V], axis=-1)
    a, b = order[..., 0:1], order[..., 1:2]
    va, vb = np.take_along_axis(cand_logits, a, -1), np.take_along_axis(cand_logits, b, -1)
    np.put_along_axis(cand_logits, a, vb, -1)
    np.put_along_axis(cand_logits, b, va, -1)
    cand = lg.LogitSet(cand_logits, ref.targets, V, "f32", cand_logits[..., :V].argmax(-1), "swap")
    f = lg.judge(ref, cand, ratio=None, max_kl=None, ceiling=1e9)["fixed_prefix"]
    assert f["argmax_agreement"] == 0.0
    assert f["top1_ref"] == pytest.approx((order[..., 0] == ref.targets).mean())
    assert f["top1_cand"] == pytest.approx((order[..., 1] == ref.targets).mean())


@pytest.mark.parametrize("gate", ["ceiling", "ratio", "max_kl"])
def test_each_gate_passes_at_its_value_and_fails_when_tightened(gate):
    ref, cand = make(noise=0.05)
    base = lg.judge(ref, cand, ceiling=1e9, ratio=10.0, max_kl=10.0)
    value = {g["gate"]: g["value"] for g in base["gates"]}[gate]
    assert value > (1.0 if gate == "ratio" else 0.0)  # the perturbation is visible to every gate
    limits = {"ceiling": None, "ratio": None, "max_kl": None}
    loose = 1 + (value - 1) * 1.001 if gate == "ratio" else value * 1.001
    tight = 1 + (value - 1) * 0.999 if gate == "ratio" else value * 0.999
    assert lg.judge(ref, cand, **{**limits, gate: loose})["verdict"] == "pass"
    res = lg.judge(ref, cand, **{**limits, gate: tight})
    assert res["verdict"] == "fail" and res["failed"] == [gate]


def test_the_ratio_gate_is_two_sided():
    ref, cand = make(shift_target=-0.3)  # the candidate is "better" than a matched reference
    res = lg.judge(ref, cand, ratio=1.01, max_kl=None)
    assert res["fixed_prefix"]["ppl_ratio"] < 1 and "ratio" in res["failed"]


def test_the_fixed_prefix_uses_the_same_positions_for_every_length():
    ref, cand = make(shift_target=0.5)
    cand.logits[:, 16:, :] = ref.logits[:, 16:, :]  # only the first 16 positions differ
    cand.emitted = cand.logits[..., :V].argmax(-1)
    res = lg.judge(ref, cand, prefix=16, ratio=None, max_kl=None, ceiling=1e9)
    assert res["fixed_prefix"]["positions"] == S * 16 and res["full"]["positions"] == S * T
    assert res["fixed_prefix"]["mean_dnats"] == pytest.approx(2 * res["full"]["mean_dnats"])
    with pytest.raises(UserError, match="prefix"):
        lg.judge(ref, cand, prefix=T + 1)


def test_the_sink_self_check_catches_a_sink_that_is_not_what_the_path_used():
    ref, cand = make()
    cand.emitted = cand.emitted.copy()
    cand.emitted[0, 3] = (cand.emitted[0, 3] + 1) % V
    res = lg.judge(ref, cand)
    assert res["verdict"] == "fail" and res["failed"] == ["sink"] and res["sink"]["first"] == [0, 3]
    cand.emitted = None
    assert lg.judge(ref, cand)["failed"] == ["sink"]  # could not look: not a pass
    assert lg.judge(ref, cand, require_sink=False)["verdict"] == "pass"


def test_a_reference_that_is_not_precision_matched_is_refused():
    ref, cand = make(fmt="mxfp4")
    with pytest.raises(lg.NotMatched, match="not precision-matched"):
        lg.judge(ref, cand)
    res = lg.judge(ref, cand, allow_unmatched=True)
    assert res["verdict"] == "fail" and "unmatched" in res["failed"]


def test_no_gate_at_all_is_never_a_pass():
    ref, cand = make()
    assert lg.judge(ref, cand, ceiling=None, ratio=None, max_kl=None)["failed"] == ["no_gate"]


def test_files_round_trip_and_bad_files_are_user_errors(tmp_path):
    ref, cand = make(noise=0.01)
    for name, x in (("ref", ref), ("cand", cand)):
        lg.save(tmp_path / f"{name}.npz", {"logits": x.logits, "targets": x.targets, "vocab_size": V,
                                            "weight_format": x.weight_format, "emitted": x.emitted, "path": name})
    back = lg.load(tmp_path / "cand.npz")
    assert np.array_equal(back.logits, cand.logits) and back.name == "cand" and back.weight_format == "f32"
    np.savez(tmp_path / "half.npz", logits=ref.logits.astype(np.float16), targets=ref.targets, vocab_size=V,
             weight_format="f32")
    with pytest.raises(UserError, match="float32"):
        lg.load(tmp_path / "half.npz")
    np.savez(tmp_path / "short.npz", logits=ref.logits[:, :5], targets=ref.targets, vocab_size=V, weight_format="f32")
    with pytest.raises(UserError, match=r"\(S, T, V_padded\)"):
        lg.load(tmp_path / "short.npz")
    with pytest.raises(UserError, match="cannot read"):
        lg.load(tmp_path / "missing.npz")


def test_the_cli_exit_codes(tmp_path):
    ref, cand = make(noise=0.05)
    good = lg.LogitSet(ref.logits.copy(), ref.targets, V, "f32", ref.logits[..., :V].argmax(-1), "good")
    for name, x in (("ref", ref), ("bad", cand), ("good", good)):
        lg.save(tmp_path / f"{name}.npz", {"logits": x.logits, "targets": x.targets, "vocab_size": V,
                                            "weight_format": x.weight_format, "emitted": x.emitted, "path": name})

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "hazards", "gate", "logits", "--reference",
                               str(tmp_path / "ref.npz"), *args], cwd=REPO, capture_output=True, text=True, timeout=120)

    r = run("--candidate", str(tmp_path / "good.npz"), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["verdict"] == "pass", r.stderr
    r = run("--candidate", str(tmp_path / "good.npz"), "--candidate", str(tmp_path / "bad.npz"))
    assert r.returncode == 1 and "bad vs ref: FAIL" in r.stdout and "good vs ref: PASS" in r.stdout
    r = run("--candidate", str(tmp_path / "nope.npz"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
