"""Repetition on the one loop (the `Repeat` work source through `LeasedCampaign.repeat`):
counting, immediate recording, resume, early stops."""
from __future__ import annotations

import time

import pytest

from hazards.engine.campaign import COMPLETE, INTERRUPTED, STOPPED, LeasedCampaign
from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.stats import Sprt
from hazards.engine.store import Store


def run_campaign(target, store, **kw):
    """Repeat a ready-made target in a frame without a GPU (the targets here need none)."""
    with LeasedCampaign.on_cpu(store, "test") as frame:
        return frame.repeat(target, **kw)


class ScriptedTarget:
    """A test double: returns outcomes from a script (cycled), records what it was given."""

    def __init__(self, outcomes: list[str], interrupt_at: int | None = None) -> None:
        self.outcomes = outcomes
        self.calls: list[dict] = []
        self.interrupt_at = interrupt_at

    def run(self, params=None, *, timeout, launches=None, artifact_dir=None) -> RunResult:
        i = len(self.calls)
        self.calls.append({"params": params, "timeout": timeout, "artifact_dir": artifact_dir})
        if self.interrupt_at is not None and i == self.interrupt_at:
            raise KeyboardInterrupt
        o = self.outcomes[i % len(self.outcomes)]
        return RunResult(outcome=Outcome(o), reason=f"scripted {o}", target="scripted",
                         params=dict(params or {}), started_at=time.time())


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "r.db") as s:
        yield s


def test_runs_n_times_and_stores_every_run_in_order(store):
    seen = []
    t = ScriptedTarget(["clean", "mismatch", "clean"])
    s = run_campaign(t, store, n=7, timeout=3.0, params={"x": 1},
                     on_result=lambda seq, r, c: seen.append((seq, r.outcome.value, sum(c.values()))))
    assert s.status == COMPLETE and s.n == 7 and s.ran_now == 7
    assert s.counts == {"clean": 5, "hang": 0, "fault": 0, "mismatch": 2, "error": 0}
    assert s.failures == 2 and s.first_failure_seq == 2
    assert [x[0] for x in seen] == list(range(1, 8)) and [x[2] for x in seen] == list(range(1, 8))
    assert [r.seq for r in store.runs(s.campaign_id)] == list(range(1, 8))
    assert all(c["timeout"] == 3.0 and c["params"] == {"x": 1} for c in t.calls)
    assert store.campaign(s.campaign_id).status == COMPLETE


def test_each_run_is_committed_before_the_next_starts(store, tmp_path):
    observed = []

    class Peeking(ScriptedTarget):
        def run(self, *a, **k):
            with Store(tmp_path / "r.db") as other:  # a separate connection
                observed.append(sum(other.counts().values()))
            return super().run(*a, **k)

    run_campaign(Peeking(["clean"]), store, n=4, timeout=1.0)
    assert observed == [0, 1, 2, 3]


def test_until_fail_stops_at_the_first_failure(store):
    s = run_campaign(ScriptedTarget(["clean", "clean", "error", "hang", "clean"]), store,
                     n=100, timeout=1.0, until_fail=True)
    assert s.status == STOPPED and s.n == 4 and s.first_failure_seq == 4
    assert "first failure at run 4" in s.stop_reason
    assert s.errors == 1 and s.judged == 3  # error is neither hazard nor clean


def test_resume_continues_to_the_total_keeping_seq_numbers(store):
    cid = store.create_campaign("run", {"n": 10})
    with pytest.raises(KeyboardInterrupt):
        run_campaign(ScriptedTarget(["clean", "fault"], interrupt_at=3), store, n=10, timeout=1.0,
                     campaign_id=cid)
    assert store.campaign(cid).status == INTERRUPTED
    assert store.run_count(cid) == 3
    t = ScriptedTarget(["clean"])
    s = run_campaign(t, store, n=10, timeout=1.0, campaign_id=cid)
    assert len(t.calls) == 7 and s.ran_now == 7
    assert [r.seq for r in store.runs(cid)] == list(range(1, 11))
    assert s.counts["fault"] == 1 and s.n == 10 and s.status == COMPLETE


def test_resume_of_a_finished_campaign_runs_nothing(store):
    s = run_campaign(ScriptedTarget(["clean"]), store, n=3, timeout=1.0)
    t = ScriptedTarget(["clean"])
    s2 = run_campaign(t, store, n=3, timeout=1.0, campaign_id=s.campaign_id)
    assert t.calls == [] and s2.n == 3 and s2.ran_now == 0


def test_resume_of_until_fail_campaign_that_already_failed_runs_nothing(store):
    s = run_campaign(ScriptedTarget(["mismatch"]), store, n=50, timeout=1.0, until_fail=True)
    t = ScriptedTarget(["clean"])
    s2 = run_campaign(t, store, n=50, timeout=1.0, until_fail=True, campaign_id=s.campaign_id)
    assert t.calls == [] and s2.status == STOPPED and s2.first_failure_seq == 1


def test_params_may_depend_on_the_run_seq(store):
    t = ScriptedTarget(["clean"])
    run_campaign(t, store, n=3, timeout=1.0, params=lambda seq: {"seed": seq * 10})
    assert [c["params"] for c in t.calls] == [{"seed": 10}, {"seed": 20}, {"seed": 30}]


class ArtifactWriter(ScriptedTarget):
    """Writes a log into the run's artifact folder, as the real targets do."""

    def run(self, params=None, *, timeout, launches=None, artifact_dir=None):
        r = super().run(params, timeout=timeout, launches=launches, artifact_dir=artifact_dir)
        if artifact_dir is not None:
            artifact_dir.mkdir(parents=True, exist_ok=True)
            (artifact_dir / "stdout.log").write_text("out")
            r.artifact_dir = str(artifact_dir)
        return r


def test_artifact_folders_of_clean_runs_are_removed_and_failures_kept(store):
    t = ArtifactWriter(["clean", "fault"])
    s = run_campaign(t, store, n=4, timeout=1.0)
    dirs = [c["artifact_dir"] for c in t.calls]
    assert all(d.parent == store.layout.artifacts(s.campaign_id) for d in dirs) and len(set(dirs)) == 4
    assert [d.exists() for d in dirs] == [False, True, False, True]
    stored = [r.result.artifact_dir for r in store.runs(s.campaign_id)]
    assert stored == [None, str(dirs[1]), None, str(dirs[3])]


def test_artifact_policy_all_keeps_every_folder_and_none_gives_none(store):
    t = ArtifactWriter(["clean"])
    run_campaign(t, store, n=2, timeout=1.0, artifacts="all")
    assert all(c["artifact_dir"].exists() for c in t.calls)
    t = ArtifactWriter(["fault"])
    s = run_campaign(t, store, n=2, timeout=1.0, artifacts="none")
    assert [c["artifact_dir"] for c in t.calls] == [None, None]
    assert not store.layout.artifacts(s.campaign_id).exists()


def test_sprt_stops_a_canary_as_soon_as_it_is_decided(store):
    s = run_campaign(ScriptedTarget(["clean"]), store, n=1000, timeout=1.0, sprt=Sprt(0.01, 0.2))
    assert s.status == STOPPED and s.sprt_decision == "accept_h0"
    assert s.n == Sprt(0.01, 0.2).clean_runs_to_accept_h0()


def test_summary_rate_and_interval_use_judged_runs(store):
    s = run_campaign(ScriptedTarget(["hang", "clean", "error", "clean"]), store, n=8, timeout=1.0)
    assert s.judged == 6 and s.failures == 2 and s.rate() == pytest.approx(2 / 6)
    j = s.to_json()
    assert j["counts"]["error"] == 2 and j["campaign"] == s.campaign_id
    assert j["ci"][0] < 2 / 6 < j["ci"][1]


@pytest.mark.parametrize("kw", [{"n": 0, "timeout": 1.0}, {"n": 3, "timeout": 0}, {"n": 3, "timeout": -1}])
def test_bad_counts_and_timeouts_are_rejected_before_anything_is_stored(store, kw):
    with pytest.raises(ValueError):
        run_campaign(ScriptedTarget(["clean"]), store, **kw)
    assert store.campaigns() == []


def test_a_target_that_cannot_start_stops_the_campaign_at_its_first_error_run(store):
    from hazards.engine.errors import UserError

    class Unstartable(ScriptedTarget):
        def run(self, *a, **k):
            super().run(*a, **k)
            raise UserError("cannot start ./gone: No such file or directory")

    t = Unstartable(["clean"])
    s = run_campaign(t, store, n=1000, timeout=1.0, until_fail=True)
    assert len(t.calls) == 1 and s.counts["error"] == 1 and s.status == STOPPED
    assert s.stop_reason == "the target cannot start: UserError: cannot start ./gone: No such file or directory"


def test_repeat_until_the_kth_failure_stops_there_and_counts_stored_runs_first():
    """`Repeat(until_failures=K)` (the bad end of `hazards bisect`): runs until K failures,
    a resumed campaign's stored failures counted; `until_fail` is K = 1."""
    from hazards.engine.loop import WorkItem
    from hazards.engine.sources import Repeat

    item = WorkItem("t", kind="command")

    def result(o: str) -> RunResult:
        return RunResult(outcome=Outcome(o), reason=o, target="t")

    src = Repeat(item, 100, until_failures=3, prior=[result("mismatch"), result("clean"), result("hang")])
    assert src.stop_reason is None and src.next_item("0") is item
    src.report(item, result("error"))   # not a failure
    assert src.stop_reason is None
    src.report(item, result("fault"))
    assert src.stop_reason == "3 failures" and src.finished() and src.next_item("0") is None
    assert Repeat(item, 5, until_fail=True, prior=[result("hang")]).stop_reason == "first failure"
    with pytest.raises(ValueError):
        Repeat(item, 5, until_failures=-1)
