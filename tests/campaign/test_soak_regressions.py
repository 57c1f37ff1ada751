"""What a soak flags: failures never seen before in the store, rates that rose beyond what
40 variants' worth of tests would show by chance (Holm), canaries that lost detection; and
its exit status, its lines and its JUnit file agree on what failed."""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET


from hazards.cli import main
from hazards.engine.loop import WorkItem
from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.soak import compare_campaigns

MISMATCH = "3 of 10 launches mismatched"


def night(store, rows: dict[tuple[str, str], tuple[int, int]], t0: float) -> int:
    """A stored soak: per (variant, expect) k failing runs (one signature each) out of n."""
    items = [WorkItem("fam", v, expect=e).to_json() for v, e in rows]
    cid = store.create_campaign("soak", {"budget_s": 60, "items": items})
    t = t0
    for (variant, _), (k, n) in rows.items():
        for i in range(n):
            failed = i < k
            store.record_run(cid, RunResult(Outcome.MISMATCH if failed else Outcome.CLEAN,
                                            MISMATCH if failed else "ok", target="fam", variant=variant,
                                            started_at=t, duration_s=0.01))
            t += 0.01
    store.set_campaign_status(cid, "complete")
    return cid


def verdicts(store, cid) -> dict[str, str]:
    from hazards.engine.soak import soak_judgements

    return {k: j.verdict.value for k, (_, j) in soak_judgements(store, cid).items()}


def test_a_rare_hazard_that_missed_one_night_is_not_new_the_next(store):
    """Before: its signature was absent from the previous night, so it was "NEW" and the
    soak exited 1 every time a 2-5% hazard came back after a quiet night."""
    night(store, {("fixed", "clean"): (3, 100)}, 1e9)
    night(store, {("fixed", "clean"): (0, 100)}, 1e9 + 86400)
    cur = night(store, {("fixed", "clean"): (2, 100)}, 1e9 + 2 * 86400)
    cmp = compare_campaigns(store, cur)
    assert cmp.new_signatures == [] and cmp.changes == []
    assert verdicts(store, cur) == {"fam/fixed": "known hazard"}
    first_night = store.campaigns("soak")[0].id
    assert [s.variant for s in compare_campaigns(store, first_night).new_signatures] == ["fixed"]
    assert verdicts(store, first_night) == {"fam/fixed": "regressed"}


def test_rate_changes_across_forty_variants_are_holm_corrected(store):
    """Three known hazards whose rates rose with one-sided p of 0.017-0.034 are what 40
    variants show by chance (before: each was a regression at alpha 0.05); a real jump
    (0/100 to 30/100) is still one."""
    before = {(f"v{i:02d}", "clean"): (1, 100) for i in range(40)}
    after = dict(before)
    after.update({("v00", "clean"): (7, 100), ("v01", "clean"): (6, 100), ("v02", "clean"): (8, 100)})
    before[("v02", "clean")] = (2, 100)
    before[("v03", "clean")] = (0, 100)
    after[("v03", "clean")] = (30, 100)
    night(store, {k: (1, 100) for k in before}, 1e9)  # every signature seen on an earlier night
    night(store, before, 1e9 + 86400)
    cur = night(store, after, 1e9 + 2 * 86400)
    cmp = compare_campaigns(store, cur)
    rose = {c.variant: c for c in cmp.changes if c.direction == "rose"}
    assert list(rose) == ["v03"] and rose["v03"].regression and rose["v03"].p_adjusted < 1e-6
    assert "Holm-adjusted over 40 target/variants" in rose["v03"].verdict
    got = verdicts(store, cur)
    assert [k for k, v in got.items() if v == "regressed"] == ["fam/v03"]
    assert {got[f"fam/v0{i}"] for i in range(3)} == {"known hazard"}


def test_a_canary_detected_more_often_is_not_a_regression_but_one_detected_less_is(store):
    """Before: a canary's failure rate that rose was a regression, and one that dropped
    (the check losing sight of its hazard) was not flagged."""
    night(store, {("broken", "detect"): (20, 100), ("weaker", "detect"): (60, 100)}, 1e9)
    cur = night(store, {("broken", "detect"): (60, 100), ("weaker", "detect"): (10, 100)}, 1e9 + 86400)
    changes = {c.variant: c for c in compare_campaigns(store, cur).changes}
    assert changes["broken"].direction == "rose" and not changes["broken"].regression
    assert changes["weaker"].direction == "dropped" and changes["weaker"].regression
    assert changes["weaker"].verdict.startswith("detection rate dropped from 60/100 to 10/100")
    assert verdicts(store, cur) == {"fam/broken": "detected", "fam/weaker": "regressed"}


def _junit_problems(path) -> dict[str, str]:
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        for kid in case:
            if kid.tag in ("failure", "error"):
                out[case.get("name")] = kid.get("type")
    return out


def soak_cli(tmp_path, monkeypatch, capsys, toml: str, budget: str, runs: int = 1) -> list[tuple[int, dict, dict]]:
    """`hazards soak --targets` (one fake GPU) `runs` times on one store: per soak its exit
    status, its --json output and the failing cases of its --junit file."""
    monkeypatch.setenv("HZ_FAKE_GPUS", "0")
    monkeypatch.setenv("HZ_LEASE_DIR", str(tmp_path / "leases"))
    targets = tmp_path / "targets.toml"
    targets.write_text(toml)
    out = []
    for i in range(runs):
        junit = tmp_path / f"soak{i}.xml"
        rc = main(["soak", "--no-families", "--targets", str(targets), "--budget", budget, "--store",
                   str(tmp_path / "r.db"), "--junit", str(junit), "--report", str(tmp_path / f"r{i}.html"), "--json"])
        printed = json.loads(capsys.readouterr().out)
        assert printed["exit_code"] == rc
        out.append((rc, printed, _junit_problems(junit)))
    return out


def test_the_soak_exit_status_and_its_junit_file_fail_the_same_items(tmp_path, monkeypatch, capsys):
    """A clean target that always fails: the first soak ever sees a new failure (exit 1, one
    JUnit failure); the second sees it again at the same rate: a known hazard, exit 0 and a
    JUnit file without failures (before: exit 0 with a failing JUnit case)."""
    soaks = soak_cli(tmp_path, monkeypatch, capsys, f"""
[[target]]
name = "always-fails"
argv = ["{sys.executable}", "-c", "print('{MISMATCH}'); raise SystemExit(1)"]
timeout = 20
""", "2s", runs=2)
    codes = [rc for rc, _, _ in soaks]
    printed = [{k: v["verdict"] for k, v in out["problems"].items()} for _, out, _ in soaks]
    junit_problems = [j for _, _, j in soaks]
    assert codes == [1, 0]
    assert printed == [{"always-fails": "regressed"}, {}]
    assert junit_problems == [{"always-fails (clean)": "regressed"}, {}]


def test_a_soak_in_which_nothing_was_judged_exits_3_and_says_why(tmp_path, monkeypatch, capsys):
    """A server that never completes its handshake (its timeout set per target in the TOML):
    every run is an error, the item is dropped, and the soak exits 3 (before: exit 0 for a
    clean item, and no way to shorten the 60 s handshake wait per target)."""
    (rc, out, junit), = soak_cli(tmp_path, monkeypatch, capsys, f"""
[[target]]
name = "mute-server"
kind = "server"
argv = ["{sys.executable}", "-c", "import time; time.sleep(120)"]
handshake_timeout = 0.5
timeout = 5
""", "20s")
    assert rc == 3
    assert out["problems"]["mute-server"]["verdict"] == "error"
    assert "handshake timeout: no hz_protocol line within 0.5s" in out["problems"]["mute-server"]["message"]
    assert out["spent_s"] < 15  # three half-second handshakes, not three minutes
    assert junit == {"mute-server (clean)": "error"}
