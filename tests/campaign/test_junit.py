"""JUnit XML validates against the schema CI systems read (tests/data/junit.xsd)."""
from __future__ import annotations

import pytest
from campaign_fakes import synthetic_soaks
from junit_schema import validate

from hazards.checkrun import CheckResult, VariantVerdict
from hazards.engine.junit import JUnitCase, JUnitSuite, write_junit
from hazards.engine.report import build_report, junit_suites

pytest.importorskip("xmlschema", reason="xmlschema is a dev extra (pip install xmlschema)")


def test_every_case_kind_validates_and_counts_add_up(tmp_path):
    suite = JUnitSuite("hazards.check.gpu", properties={"budget": "180"}, stdout="log\x00with a NUL", cases=[
        JUnitCase("pipeline/fixed (clean)", "hazards.check.pipeline", 1.5),
        JUnitCase("pipeline/broken (canary)", "hazards.check.pipeline", 0.5, "failure", "went blind", "went-blind",
                  "canary pipeline/broken went blind: 0 failures in 13 runs"),
        JUnitCase("ordering/fixed (clean)", "hazards.check.ordering", 0.0, "error", "server would not start", "error"),
        JUnitCase("mfma/broken (canary)", "hazards.check.mfma", 0.0, "skipped", "no usable GPU"),
    ])
    path = write_junit(tmp_path / "j.xml", [suite, JUnitSuite("empty")])
    assert validate(path) == []
    text = path.read_text()
    assert 'tests="4" failures="1" errors="1" skipped="1"' in text
    assert "<failure" in text and "went-blind" in text and "<skipped" in text


def test_the_schema_rejects_what_ci_systems_would_misread(tmp_path):
    bad = tmp_path / "bad.xml"
    bad.write_text('<?xml version="1.0"?><testsuites><testsuite name="x" id="0" package="x" tests="1" '
                   'failures="0" errors="0" time="0" timestamp="2026-01-01T00:00:00">'
                   '<properties/><testcase name="a" classname="b" time="0"><failure message="m"/></testcase>'
                   '<system-out/><system-err/></testsuite></testsuites>')
    errors = validate(bad)
    assert errors  # no hostname, and a failure without a type
    assert any("hostname" in e for e in errors)


def test_check_result_junit_validates(tmp_path):
    res = CheckResult(static_note="0 finding(s), 0 failing", verdicts=[
        VariantVerdict("fam", "fixed", "clean", "clean", 13, 0, message="0/13 failures"),
        VariantVerdict("fam", "broken", "canary", "went blind", 13, 0, message="canary fam/broken went blind"),
        VariantVerdict("fam", "broken2", "canary", "detected", 1, 1, message="1/1"),
        VariantVerdict("fam", "x", "clean", "error", message="no judged run"),
    ])
    path = write_junit(tmp_path / "check.xml", res.junit_suites())
    assert validate(path) == []
    text = path.read_text()
    assert 'type="went-blind"' in text and res.exit_code == 1


def test_campaign_report_junit_validates_and_names_failures(store, tmp_path):
    _, cur = synthetic_soaks(store)
    path = write_junit(tmp_path / "soak.xml", junit_suites(build_report(store, cur, figures=False)))
    assert validate(path) == []
    text = path.read_text()
    assert 'tests="3" failures="2" errors="0"' in text  # pipeline/fixed and ordering/fixed failed
    assert 'name="pipeline/broken (canary)"' in text
