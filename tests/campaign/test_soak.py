"""Soak: targets from TOML, every item on every leased GPU for the budget, resumable,
compared with the previous soak."""
from __future__ import annotations

import sys
import time

import pytest
from campaign_fakes import FAKE_SERVER, fake_items_for, make_family

from hazards.cli import main
from hazards.engine.errors import UserError
from hazards.engine.campaign import LeasedCampaign
from hazards.engine.leases import read_lease_log
from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.soak import load_targets, run_soak, spent_seconds, start_or_resume

TOML = f"""
[[target]]
name = "fake-server"
kind = "server"
argv = ["{sys.executable}", "{FAKE_SERVER}"]
params = {{ variant = "fixed", fail_prob = 0.0 }}
launches = 5
timeout = 10

[[target]]
name = "py-command"
argv = ["{sys.executable}", "-c", "import os; print('HZ_RESULT {{\\"ok\\": true}}')"]
cwd = "."
env = {{ HZ_DEMO = "1" }}
timeout = 20
"""


def test_targets_toml_gives_command_and_server_items(tmp_path):
    f = tmp_path / "targets.toml"
    f.write_text(TOML)
    server, command = load_targets(f)
    assert (server.kind, server.launches, server.params["variant"], server.timeout_s) == ("server", 5, "fixed", 10.0)
    assert (command.kind, command.env, command.cwd) == ("command", {"HZ_DEMO": "1"}, str(tmp_path))


@pytest.mark.parametrize("text, message", [
    ("[[target]]\nname = 'a'\n", "'argv' must be a non-empty list"),
    ("[[target]]\nname = 'a'\nargv = ['x']\ncolour = 'red'\n", "unknown key 'colour'"),
    ("[[target]]\nname = 'a'\nargv = ['x']\ntimeout = -1\n", "timeout must be a positive, finite number"),
    ("[[target]]\nname = 'a'\nargv = ['x']\nkind = 'daemon'\n", "kind must be 'command' or 'server'"),
    ("[[target]]\nname = 'a'\nargv = ['true']\n[[target]]\nname = 'a'\nargv = ['true', 'y']\n", "defined twice"),
    ("[[target]\nname = 'a'\n", "not valid TOML"),
    ("title = 'x'\n", "expected one or more [[target]] tables"),
    # non-finite numbers: HZ_PARAMS would carry NaN / Infinity, which is not JSON
    ("[[target]]\nname = 'a'\nargv = ['true']\nparams = {v = nan}\n", "params.v is nan"),
    ("[[target]]\nname = 'a'\nargv = ['true']\nparams = {v = -inf}\n", "params.v is -inf"),
    ("[[target]]\nname = 'a'\nargv = ['true']\nparams = {a = {b = [1.0, inf]}}\n", "params.a.b[1] is inf"),
])
def test_bad_targets_file_is_a_one_line_user_error(tmp_path, refuses_file, text, message):
    refuses_file(load_targets, text, message)
    with pytest.raises(UserError, match="does not exist"):
        load_targets(tmp_path / "missing.toml")


def test_soak_holds_every_gpu_runs_every_item_and_writes_one_campaign(fake_gpus, store, tmp_path):
    f = tmp_path / "targets.toml"
    f.write_text(TOML)
    fam = make_family()
    items = fake_items_for(fam, list(fam.variants)) + load_targets(f)
    items[2].expect = "detect"
    with LeasedCampaign.acquire(store, "soak-test") as frame:
        t0 = time.monotonic()
        res = run_soak(frame, items, budget_s=3.0)
        wall = time.monotonic() - t0
    assert wall < 3.0 + 10  # the budget, plus at most the runs in flight
    camp = store.campaign(res.campaign_id)
    assert camp.kind == "soak" and camp.status == "complete" and len(camp.spec["items"]) == 5
    runs = store.runs(res.campaign_id)
    assert {(sr.result.target, sr.result.variant) for sr in runs} == {(i.target, i.variant) for i in items}
    assert {sr.result.gpu_uuid for sr in runs if sr.result.target == "fakefam"} == {"GPU-fake-0", "GPU-fake-1"}
    assert res.comparison.previous_id is None and not res.blind and not res.dropped and not res.flagged
    assert res.exit_code == 0 and res.judgements["fakefam/broken"].verdict == "detected"
    # the lease log shows both GPUs held at the same time by this soak
    acq = [e for e in read_lease_log() if e["event"] == "acquire" and e["holder"] == "soak-test"]
    rel = [e for e in read_lease_log() if e["event"] == "release" and e["holder"] == "soak-test"]
    assert sorted(e["gpu"] for e in acq) == ["0", "1"] and max(e["t"] for e in acq) < min(e["t"] for e in rel)


def _expecting(items):
    """The fake family's items with the catalog's expectations (broken: detect; others: clean)."""
    for i in items:
        i.expect = "detect" if i.variant == "broken" else "clean"
    return items


def test_second_soak_flags_a_new_signature_and_a_rate_that_rose(fake_gpus, store):
    with LeasedCampaign.acquire(store, "soak-test") as frame:
        good = make_family(clean_fail_prob=0.0)
        first = run_soak(frame, _expecting(fake_items_for(good, list(good.variants))), budget_s=2.0)
        worse = make_family(clean_fail_prob=1.0)
        second = run_soak(frame, _expecting(fake_items_for(worse, list(worse.variants))), budget_s=2.0)
    assert first.comparison.previous_id is None and first.exit_code == 0
    cmp = second.comparison
    assert cmp.previous_id == first.campaign_id and second.flagged and second.exit_code == 1
    assert [(s.target, s.variant, s.outcome) for s in cmp.new_signatures] == [("fakefam", "fixed", "mismatch")]
    rose = [c for c in cmp.changes if c.direction == "rose"]
    assert [(c.target, c.variant) for c in rose] == [("fakefam", "fixed")] and rose[0].p_adjusted < 0.05
    assert rose[0].regression and second.problems == ["fakefam/fixed"]
    assert second.judgements["fakefam/fixed"].verdict == "regressed"


def test_canary_that_never_fails_in_a_soak_is_flagged_blind(fake_gpus, store):
    fam = make_family(canary_fail_prob=0.0)
    items = fake_items_for(fam, list(fam.variants))
    for i in items:
        i.expect = "detect" if i.variant == "broken" else "clean"
    with LeasedCampaign.acquire(store, "soak-test", max_gpus=1) as frame:
        res = run_soak(frame, items, budget_s=1.0)
    assert res.blind == ["fakefam/broken"] and res.flagged
    assert res.canary_lines()[0].startswith("FAIL fakefam/broken [canary] went blind: 0 failures in ")


class _SlowCleanTarget:
    """Every run is clean and takes `seconds`: a budget shorter than one run ends the soak."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def run(self, params=None, *, timeout, launches=None, artifact_dir=None):
        time.sleep(self.seconds)
        return RunResult(Outcome.CLEAN, "ok", started_at=time.time(), duration_s=self.seconds)

    def close(self) -> None:
        pass


def test_canary_the_budget_never_reached_is_flagged_blind(fake_gpus, store):
    fam = make_family()
    items = fake_items_for(fam, list(fam.variants))
    for i in items:
        i.expect = "detect" if i.variant == "broken" else "clean"
    # uniform rotation: the clean variants come first (the evidence allocation runs canaries first)
    with LeasedCampaign.acquire(store, "soak-test", max_gpus=1, telemetry=False) as frame:
        res = run_soak(frame, items, budget_s=0.2, target_factory=lambda item, env: _SlowCleanTarget(0.5),
                       allocation="uniform")
    assert not store.runs(res.campaign_id, variant="broken")  # the canary never ran
    assert res.blind == ["fakefam/broken"] and res.flagged
    assert res.judgements["fakefam/broken"].message == "not run: the budget ended first"


def test_resume_continues_the_same_campaign_with_the_budget_left(fake_gpus, store):
    fam = make_family()
    items = fake_items_for(fam, list(fam.variants))
    with LeasedCampaign.acquire(store, "soak-test", max_gpus=1) as frame:
        # a first session that "was killed" after 4 s of its 6 s budget: runs stored, no end
        cid, _, left = start_or_resume(frame, items, budget_s=6.0, resume=None)
        assert left == 6.0
        t0 = store.campaign(cid).spec["sessions"][0]["started"]
        for k in range(4):
            store.record_run(cid, RunResult(Outcome.CLEAN, "ok", target="fakefam", variant="fixed",
                                            started_at=t0 + k, duration_s=1.0))
        assert spent_seconds(store, cid) == pytest.approx(4.0)
        t1 = time.monotonic()
        res = run_soak(frame, None, budget_s=999, resume=cid)
        took = time.monotonic() - t1
    assert res.campaign_id == cid and len(store.campaign(cid).spec["sessions"]) == 2
    assert 1.5 <= took < 2.0 + 10
    # the resumed session evened out the variants the first one had not run
    n = {v.name: len(store.runs(cid, variant=v.name)) for v in fam.variants}
    assert n["reference"] >= 4 and n["broken"] >= 4
    with pytest.raises(UserError, match="is a 'check' campaign, not a soak"), LeasedCampaign.on_cpu(store) as frame:
        start_or_resume(frame, None, budget_s=1, resume=store.create_campaign("check", {}))


def test_cli_soak_writes_a_report_and_exits_zero(fake_gpus, tmp_path, capsys, monkeypatch):
    f = tmp_path / "targets.toml"
    f.write_text(TOML)
    report = tmp_path / "soak.html"
    rc = main(["soak", "--budget", "2s", "--targets", str(f), "--no-families", "--store", str(tmp_path / "r.db"),
               "--report", str(report)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert report.is_file() and "data:image/png;base64," in report.read_text()
    assert "## hazards soak campaign 1" in out and "| fake-server/" not in out and "| fake-server |" in out
    assert "GPU 0:" in out and "GPU 1:" in out


def test_cli_soak_json_is_one_object_with_the_report(fake_gpus, tmp_path, capsys):
    import json

    f = tmp_path / "targets.toml"
    f.write_text(TOML)
    rc = main(["soak", "--budget", "2s", "--targets", str(f), "--no-families", "--store", str(tmp_path / "r.db"),
               "--report", str(tmp_path / "soak.html"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["flagged"] is False and out["campaign"] == 1
    assert {g["gpu"] for g in out["gpus"]} == {"0", "1"}
    assert out["report"]["campaign"]["kind"] == "soak" and out["report"]["rows"][0]["target"] == "fake-server"


def test_cli_soak_without_a_gpu_is_a_one_line_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HZ_FAKE_GPUS", "")
    monkeypatch.setenv("HZ_LEASE_DIR", str(tmp_path / "leases"))
    f = tmp_path / "targets.toml"
    f.write_text(TOML)
    rc = main(["soak", "--budget", "2s", "--targets", str(f), "--no-families", "--store", str(tmp_path / "r.db")])
    err = capsys.readouterr().err
    assert rc == 3 and err.startswith("hazards: error: hazards soak needs a free GPU") and err.count("\n") == 1


def test_cli_soak_unknown_executor_is_a_one_line_error_before_anything_is_written(tmp_path, capsys):
    rc = main(["soak", "--executor", "slurm", "--store", str(tmp_path / "r.db")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("hazards: error: unknown executor 'slurm'") and err.count("\n") == 1
    assert not (tmp_path / "r.db").exists()
