"""`hazards check`: canaries must be detected, clean variants must stay clean, a harmless
canary "went blind" and fails the check, and without a GPU the GPU part is skipped by name."""
from __future__ import annotations

import re

import pytest
from campaign_fakes import fake_items_for, make_family
from junit_schema import validate

from hazards import checkrun
from hazards.checkrun import run_check
from hazards.cli import main
from hazards.family import Variant
from hazards.static.findings import Finding
from hazards.static_catalog import NOT_JUDGED
from hazards.engine.junit import write_junit

NO_STATIC = ([], "static checks stubbed out in this test")


@pytest.fixture
def no_static(monkeypatch):
    monkeypatch.setattr(checkrun, "run_static", lambda paths, families=None, skip_tools=(), observer=None: NO_STATIC)


def _check(fams, store, **kw):
    return run_check(budget_s=3, catalog=fams, store=store, items_for=fake_items_for, wait_s=0, **kw)


def test_check_passes_when_every_canary_is_detected_and_clean_variants_stay_clean(fake_gpus, store, no_static, tmp_path):
    res = _check([make_family(canary_fail_prob=1.0)], store)
    verdicts = {v.variant: v for v in res.verdicts}
    assert verdicts["broken"].status == "detected" and verdicts["broken"].failures >= 1
    assert verdicts["fixed"].status == "clean" and verdicts["fixed"].runs >= 13
    assert verdicts["reference"].status == "clean"
    assert res.exit_code == 0, res.summary_lines()
    assert res.campaign_id is not None and store.campaign(res.campaign_id).status == "complete"
    assert "GPU checks on 2 GPU(s)" in res.gpu_note
    path = write_junit(tmp_path / "j.xml", res.junit_suites())
    if _has_xmlschema():
        assert validate(path) == []


def test_a_canary_made_harmless_went_blind_and_fails_the_check(fake_gpus, store, no_static, tmp_path):
    res = _check([make_family(canary_fail_prob=0.0)], store)
    blind = res.blind
    assert [v.variant for v in blind] == ["broken"]
    # 13 clean runs settle the SPRT; the second GPU may have had one more in flight
    assert re.fullmatch(r"0 failures in 1[34] runs \(SPRT accepted the blind rate\)", blind[0].message)
    assert res.exit_code != 0
    assert f"FAIL fakefam/broken [canary] went blind: {blind[0].message}" in res.summary_lines()
    text = write_junit(tmp_path / "j.xml", res.junit_suites()).read_text()
    assert 'type="went-blind"' in text


def test_a_clean_variant_that_fails_fails_the_check(fake_gpus, store, no_static):
    res = _check([make_family(clean_fail_prob=1.0)], store)
    fixed = next(v for v in res.verdicts if v.variant == "fixed")
    assert fixed.status == "failed" and fixed.runs <= 2  # stops at the first failure
    assert res.exit_code != 0


def test_a_canary_only_the_static_checks_can_see_is_not_run_on_the_gpu(fake_gpus, store, no_static):
    static_only = Variant("broken_static", "broken", "asm register overlap", params={"fail_prob": 0.0},
                          detected_by=("static",))
    res = _check([make_family(extra=(static_only,))], store)
    assert "broken_static" not in {v.variant for v in res.verdicts}
    assert res.exit_code == 0


def test_without_a_gpu_the_check_cannot_judge_its_gpu_part_and_exits_3(monkeypatch, store, no_static, tmp_path):
    """No usable GPU is not a pass (before: "30 GPU checks SKIPPED", exit 0)."""
    monkeypatch.setenv("HZ_FAKE_GPUS", "")
    res = _check([make_family()], store)
    assert res.gpu_note.startswith("GPU checks NOT RUN: no usable GPU") and "--skip gpu" in res.gpu_note
    assert "fakefam/broken" in res.gpu_note and "fakefam/fixed" in res.gpu_note
    assert {v.status for v in res.verdicts} == {"error"} and res.exit_code == 3
    assert res.summary_lines()[-1].startswith("check COULD NOT JUDGE 3 item(s)")
    assert res.campaign_id is None and store.campaigns() == []
    text = write_junit(tmp_path / "j.xml", res.junit_suites()).read_text()
    assert text.count("<error ") == 3 and "<skipped" not in text


def test_skip_gpu_runs_the_static_part_only_and_lists_the_gpu_checks_as_skipped(monkeypatch, store, no_static,
                                                                               tmp_path):
    monkeypatch.setenv("HZ_FAKE_GPUS", "")
    for kw in ({"skip": ["gpu"]}, {"static_only": True}):
        res = _check([make_family()], store, **kw)
        assert {v.status for v in res.verdicts} == {"skipped"} and res.exit_code == 0
        assert res.summary_lines()[-1] == "check passed for the static part only: 3 GPU check(s) SKIPPED"
        text = write_junit(tmp_path / "j.xml", res.junit_suites()).read_text()
        assert text.count('<skipped message="--skip gpu"') == 3
    assert store.campaigns() == []


def test_cli_check_without_a_gpu_exits_3_unless_told_to_skip_it(monkeypatch, tmp_path, capsys, no_static):
    import hazards.families as families

    monkeypatch.setenv("HZ_FAKE_GPUS", "")
    monkeypatch.setattr(families, "all_families", lambda: [make_family()])
    store = ["--store", str(tmp_path / "r.db")]
    assert main(["check", *store]) == 3
    assert "GPU checks NOT RUN: no usable GPU" in capsys.readouterr().out
    assert main(["check", "--skip", "gpu", *store]) == 0
    assert main(["check", "--static", *store]) == 0
    assert main(["check", "--skip", "gpu,static", *store]) == 2
    assert main(["check", "--skip", "cpu", *store]) == 2
    assert "--skip cpu: nothing of that name (give gpu, static, nvcc" in capsys.readouterr().err


def test_failing_static_findings_fail_the_check(monkeypatch, store):
    bad = Finding("asm-overlap", "error", "k.s", 12, "load 1's destination covers load 2's address")
    monkeypatch.setattr(checkrun, "run_static", lambda paths, families=None, skip_tools=(), observer=None: ([bad], "1 finding(s), 1 failing"))
    res = run_check(budget_s=10, catalog=[], static_only=True)
    assert res.exit_code == 1 and "static FAIL k.s:12: [asm-overlap]" in "\n".join(res.summary_lines())


def test_build_failure_of_a_family_is_an_error_not_a_pass(fake_gpus, store, no_static):
    from hazards.engine.errors import UserError

    def broken_build(family, variants):
        raise UserError("nvcc failed: pipeline.cu:12: error")

    res = run_check(budget_s=10, catalog=[make_family()], store=store, items_for=broken_build, wait_s=0)
    assert {v.status for v in res.verdicts} == {"error"} and res.exit_code != 0


def test_cli_check_exits_non_zero_and_says_went_blind(fake_gpus, monkeypatch, tmp_path, capsys, no_static):
    import hazards.families as families

    monkeypatch.setattr(families, "all_families", lambda: [make_family(canary_fail_prob=0.0)])
    monkeypatch.setattr(checkrun, "default_items_for", fake_items_for)
    junit = tmp_path / "check.xml"
    rc = main(["check", "--budget", "3s", "--junit", str(junit), "--store", str(tmp_path / "r.db"),
               "--families", "fakefam"])
    out = capsys.readouterr().out
    assert rc == 1 and "went blind" in out and "check FAILED" in out
    assert junit.is_file()


def test_cli_check_json_is_one_object_with_every_verdict(fake_gpus, monkeypatch, tmp_path, capsys, no_static):
    import json

    import hazards.families as families

    monkeypatch.setattr(families, "all_families", lambda: [make_family(canary_fail_prob=0.0)])
    monkeypatch.setattr(checkrun, "default_items_for", fake_items_for)
    rc = main(["check", "--budget", "3s", "--store", str(tmp_path / "r.db"), "--families", "fakefam", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["exit_code"] == 1 and not out["ok"]
    verdicts = {v["variant"]: v for v in out["verdicts"]}
    assert verdicts["broken"]["verdict"] == "went blind" and verdicts["fixed"]["verdict"] == "clean"
    assert verdicts["fixed"]["rate_text"].startswith("≤ ") and out["campaign"] is not None


def test_cli_check_static_only_touches_no_gpu_and_no_store(fake_gpus, tmp_path, capsys, no_static, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = main(["check", "--static"])
    out = capsys.readouterr().out
    assert rc == 0 and "check passed" in out
    assert not (tmp_path / ".hazards").exists()


def test_cli_check_rejects_a_bad_budget_in_one_line(capsys):
    rc = main(["check", "--budget", "soon"])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == "hazards: error: cannot read duration 'soon' (use e.g. 90s, 3m, 1h30m)"


def _has_xmlschema() -> bool:
    try:
        import xmlschema  # noqa: F401
    except ImportError:
        return False
    return True


def test_static_canaries_become_junit_cases(monkeypatch, tmp_path):
    seen = Finding("canary-detected", "info", "k.s", 3, "flagged as expected", subject="earlyclobber/broken")
    blind = Finding("canary-blind", "error", "k2.s", 0, "nothing fired: the check went blind",
                    subject="earlyclobber/broken_shared_base")
    monkeypatch.setattr(checkrun, "run_static", lambda paths, families=None, skip_tools=(), observer=None: ([seen, blind], "2 finding(s)"))
    res = run_check(budget_s=10, catalog=[], static_only=True)
    assert res.exit_code == 1
    text = write_junit(tmp_path / "s.xml", res.junit_suites()).read_text()
    assert 'name="canary earlyclobber/broken"' in text and 'type="went-blind"' in text
    if _has_xmlschema():
        assert validate(tmp_path / "s.xml") == []


@pytest.mark.parametrize("check_id", NOT_JUDGED)
def test_a_static_check_that_could_not_look_is_a_junit_error_not_a_failure(check_id, monkeypatch, tmp_path):
    """Every not-judged finding (exit 3: a tool missing, a source that did not compile, a
    function that left no code, a compiler killed) is an error case in JUnit, as its exit
    code says; a failure case would tell CI that a hazard was found."""
    import xml.etree.ElementTree as ET

    could_not = Finding(check_id, "error", "user.cu", 0, f"{check_id}: nothing in it was checked")
    monkeypatch.setattr(checkrun, "run_static",
                        lambda paths, families=None, skip_tools=(), observer=None: ([could_not], "1 finding(s)"))
    res = run_check(budget_s=10, catalog=[], static_only=True)
    assert res.exit_code == 3, res.summary_lines()
    path = write_junit(tmp_path / "s.xml", res.junit_suites())
    cases = [c for c in ET.parse(path).getroot().iter("testcase") if c.get("name").startswith(check_id)]
    assert len(cases) == 1, path.read_text()
    assert [child.tag for child in cases[0]] == ["error"], path.read_text()
    assert cases[0].find("error").get("message") == could_not.message
    if _has_xmlschema():
        assert validate(path) == []


def test_one_broken_run_gets_one_word_in_check_soak_stress_and_report(fake_gpus, store, no_static):
    """A canary whose every run fails only through a harness anomaly (a bounded spin that gave
    up) proves nothing: every command says it went blind (check used to say "detected")."""
    import dataclasses
    import sys

    from campaign_fakes import FAKE_SERVER

    from hazards.engine.campaign import LeasedCampaign
    from hazards.engine.report import build_report, junit_suites
    from hazards.engine.soak import run_soak
    from hazards.engine.targets import ServerTarget
    from hazards.engine.verdict import Verdict
    from hazards.stress_family import stress_variant

    spins = Variant("broken", "broken", "fails only by spin timeouts",
                    params={"fail_prob": 1.0, "anomaly": "spin_timeouts"}, detected_by=("stress",))
    base = make_family()
    fam = dataclasses.replace(base, variants=base.variants[:2] + (spins,), harness_anomalies=("spin_timeouts",))
    words = {}
    res = _check([fam], store)
    words["check"] = next(v.status for v in res.verdicts if v.variant == "broken")
    with LeasedCampaign.acquire(store, "soak-test", max_gpus=1) as frame:
        soak = run_soak(frame, checkrun.family_items(fam, list(fam.variants), fake_items_for), budget_s=1.0)
    words["soak"] = soak.judgements["fakefam/broken"].verdict
    words["report"] = next(r.judgement.verdict for r in build_report(store, soak.campaign_id, figures=False).rows
                           if r.variant == "broken")
    with ServerTarget([sys.executable, str(FAKE_SERVER)], name="fakefam") as target, \
            LeasedCampaign.on_cpu(store) as frame:
        words["stress"] = stress_variant(fam, "broken", frame=frame, launches=5, requests=2, target=target).verdict
    assert words == dict.fromkeys(("check", "soak", "report", "stress"), Verdict.WENT_BLIND), words
    assert soak.flagged and soak.blind == ["fakefam/broken"]
    case = next(c for c in junit_suites(build_report(store, soak.campaign_id, figures=False))[0].cases
                if c.name == "fakefam/broken (canary)")
    assert (case.status, case.type) == ("failure", "went-blind")


def test_static_checks_all_skipped_by_name_beside_a_gpu_part_that_judged_passes():
    """`--skip clang,nvcc,nvdisasm` with a GPU: the GPU part judged, so the check is not
    'judged nothing' (that is exit 3 only when neither part judged anything)."""
    from hazards.checkrun import CheckResult, VariantVerdict
    from hazards.engine.verdict import Expect, Judgement, Verdict, skipped
    from hazards.static_catalog import StaticFindings

    static = StaticFindings()  # every check skipped: nothing judged
    detected = VariantVerdict.of("fam", "broken", Expect.DETECT, Judgement(Verdict.DETECTED, "seen"))
    assert CheckResult(findings=static, verdicts=[detected]).exit_code == 0
    gpu_skipped = VariantVerdict.of("fam", "broken", Expect.DETECT, skipped("--skip gpu"))
    res = CheckResult(findings=static, verdicts=[gpu_skipped], skipped_parts={"gpu"})
    assert res.exit_code == 3 and res.summary_lines()[-1].startswith("check JUDGED NOTHING")
