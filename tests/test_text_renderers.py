"""Every text renderer shows what the user typed and what the data says, as it is.

rich reads `[word]` as markup and drops it: `hazards run -- echo 'test_gemm[fp16-sm90]'`
printed `echo 'test_gemm'`, and the forensics hint `pip install 'gpu-hazards[forensics]'`
lost its extra. Each renderer gets bracketed words (and a non-UTF-8 byte) in the places
its data comes from, and must print them unchanged (the byte escaped as `\\xff`).
"""
from __future__ import annotations

import math
import os
import time
import types

import pytest

from hazards.cli import main
from hazards.engine.campaign import CampaignSummary
from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.store import Store

TYPED = "test_gemm[fp16-sm90]"
HINT = "py-spy is not installed (pip install 'gpu-hazards[forensics]')"
REASON = f"timed out after 5s: {HINT}"
ARGV = ["echo", TYPED, os.fsdecode(b"a\xffb")]
SHOWN_ARGV = "echo 'test_gemm[fp16-sm90]' 'a\\xffb'"


@pytest.fixture
def stored(tmp_path):
    """A store with one campaign of two runs: a hang whose reason carries the hint, a clean one."""
    path = tmp_path / "res[db].db"
    with Store(path) as store:
        cid = store.create_campaign("run", {"argv": ARGV})
        for outcome, reason in ((Outcome.HANG, REASON), (Outcome.CLEAN, "exit code 0")):
            store.record_run(cid, RunResult(outcome=outcome, reason=reason, target=SHOWN_ARGV,
                                            variant="v[fast]", started_at=time.time(), error_kind="timeout"))
    return path, cid


def _summary(cid: int) -> CampaignSummary:
    return CampaignSummary(campaign_id=cid, status="done", requested=2, counts={
        "clean": 1, "hang": 1, "fault": 0, "mismatch": 0, "error": 0}, ran_now=2, first_failure_seq=1,
        stop_reason="stopped at [red]the first failure[/red]", elapsed_s=1.0)


def test_run_prints_the_command_signatures_and_stop_reason_as_they_are(stored, capsys):
    from hazards.cli.run import print_summary

    path, cid = stored
    with Store(path, read_only=True) as store:
        print_summary(_summary(cid), store, {"argv": ARGV})
    out = capsys.readouterr().out
    assert SHOWN_ARGV in out and HINT in out and "[red]the first failure[/red]" in out
    assert "res[db].db" in out


def test_repro_prints_the_command_and_each_failure_as_they_are(stored, capsys):
    from hazards.cli.repro import _report

    path, cid = stored
    failure = RunResult(outcome=Outcome.HANG, reason=REASON, target=SHOWN_ARGV, started_at=time.time(),
                        evidence={"telemetry": {"xids": [{"xid": 79, "gpu": "[0]"}]}}, artifact_dir=f"/tmp/{TYPED}")
    with Store(path, read_only=True) as store:
        _report(_summary(cid), [(1, failure)], {"argv": ARGV}, store, json_out=False)
    out = capsys.readouterr().out
    assert SHOWN_ARGV in out and HINT in out and f"/tmp/{TYPED}" in out and "'gpu': '[0]'" in out


def test_stats_prints_targets_variants_and_signatures_as_they_are(stored, capsys):
    path, _ = stored
    assert main(["stats", "--store", str(path)]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if "│" in ln]  # the table, not only the signatures below it
    assert any(TYPED in ln and "v[fast]" in ln for ln in rows), out
    assert HINT in out and "res[db].db" in out


def test_stress_prints_variant_names_as_they_are(capsys):
    from hazards.cli.stress import print_reports
    from hazards.engine.verdict import Judgement, Verdict

    evidence = types.SimpleNamespace(launches=10, failed_launches=0, weak=0, instances=0, sanitizer_errors=0)
    report = types.SimpleNamespace(
        family="fam", variant=TYPED, role="clean[x]", oracle="harness[y]", static_hazardous=False, evidence=evidence,
        summary=types.SimpleNamespace(counts={"clean": 1}), wall_s=1.0, expected=None,
        judgement=Judgement(Verdict.FAILED, "failed [bold]twice[/bold]"), verdict=Verdict.FAILED)
    print_reports([report])
    out = capsys.readouterr().out
    assert TYPED in out and "clean[x]" in out and "harness[y]" in out and "[bold]twice[/bold]" in out


def test_list_prints_family_texts_as_they_are(monkeypatch, capsys):
    import hazards.families

    variant = types.SimpleNamespace(name=TYPED, role="canary", is_canary=True, detected_by=("stress[sm90]",),
                                    description="drops [wait] before the MMA")
    family = types.SimpleNamespace(name="fam[1]", binary=None, platforms=("cuda",), summary="a [b] summary",
                                   variants=(variant,), runtime_params={})
    monkeypatch.setattr(hazards.families, "all_families", lambda: [family])
    assert main(["list"]) in (0, None)
    out = capsys.readouterr().out
    for text in ("fam[1]", "a [b] summary", TYPED, "stress[sm90]", "drops [wait] before the MMA"):
        assert text in out, (text, out)


def test_the_progress_lines_show_the_item_as_it_is():
    """The plain progress lines (not a terminal) name the item with its non-UTF-8 byte
    escaped as the store keeps it ('\\xff'), not as a surrogate ('\\udcff')."""
    import io

    from hazards.cli.progress import CampaignProgress
    from hazards.engine.campaign import LoopStart
    from hazards.engine.loop import WorkItem

    stream = io.StringIO()
    item = WorkItem(target=SHOWN_ARGV.replace("\\xff", "\udcff"), variant="v[fast]", kind="command", argv=("true",))
    with CampaignProgress(interval_s=60, stream=stream, terminal=False) as progress:
        progress.begin(LoopStart(campaign_id=1, kind="run", items=[item], total=2, budget_s=math.inf,
                                 counts={}, leases=[]))
    text = stream.getvalue()
    assert TYPED in text and "'a\\xffb'" in text and "\udcff" not in text, text
