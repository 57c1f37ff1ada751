"""Results store: schema, immediate commits, signatures, concurrency, refusals."""
from __future__ import annotations

import multiprocessing
import sqlite3
import time
from pathlib import Path

import pytest

from hazards.engine.errors import UserError
from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.signatures import normalize_message, signature_of
from hazards.engine.store import SCHEMA_VERSION, Store, resolve_path


def result(outcome: str = "clean", reason: str = "exit 0", **kw) -> RunResult:
    return RunResult(outcome=Outcome(outcome), reason=reason, target=kw.pop("target", "demo"),
                     started_at=time.time(), duration_s=0.01, **kw)


def test_new_store_is_wal_with_schema_version(tmp_path):
    path = tmp_path / "sub" / "results.db"
    with Store(path) as s:
        assert s.integrity_check() == "ok"
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"campaigns", "runs", "signatures"} <= tables
    cols = {r[1] for r in db.execute("PRAGMA table_info(runs)")}
    assert {"campaign_id", "seq", "target", "variant", "params", "outcome", "reason", "error_kind",
            "evidence", "metrics", "started_at", "duration_s", "host", "gpu_uuid", "worker_age",
            "artifact_dir", "signature_id"} <= cols


def test_run_is_visible_to_another_connection_as_soon_as_recorded(tmp_path):
    path = tmp_path / "r.db"
    s = Store(path)
    cid = s.create_campaign("run", {"argv": ["x"]}, name="c")
    s.record_run(cid, result("mismatch", "1/10 launches mismatched", params={"seq": 4096},
                             metrics={"max_rel_err": 0.5, "nan": float("nan")}, gpu_uuid="GPU-1",
                             worker_age=3, variant="broken"))
    other = sqlite3.connect(path)  # a second reader, no close/commit on our side
    row = other.execute("SELECT seq, outcome, params, gpu_uuid, worker_age, variant FROM runs").fetchone()
    assert row == (1, "mismatch", '{"seq": 4096}', "GPU-1", 3, "broken")
    stored = s.runs(cid)[0]
    assert stored.result.metrics["max_rel_err"] == 0.5 and stored.result.outcome is Outcome.MISMATCH
    s.close()


def test_seq_numbers_continue_per_campaign(tmp_path):
    with Store(tmp_path / "r.db") as s:
        a, b = s.create_campaign("run", {}), s.create_campaign("run", {})
        for _ in range(3):
            s.record_run(a, result())
        s.record_run(b, result())
        assert [r.seq for r in s.runs(a)] == [1, 2, 3]
        assert [r.seq for r in s.runs(b)] == [1]
        assert s.last_seq(a) == 3 and s.run_count(a) == 3
        with pytest.raises(sqlite3.IntegrityError):
            s.record_run(a, result(), seq=2)  # a seq is never stored twice


@pytest.mark.parametrize("times", [{"duration_s": None}, {"started_at": float("nan")},
                                   {"duration_s": float("inf")}, {"started_at": None}])
def test_missing_or_non_finite_times_do_not_lose_the_run(tmp_path, times):
    with Store(tmp_path / "r.db") as s:
        cid = s.create_campaign("run", {})
        s.record_run(cid, RunResult(Outcome.HANG, "timed out", target="demo", **times))
        (stored,) = s.runs(cid)
    assert stored.result.outcome is Outcome.HANG
    assert (stored.result.started_at, stored.result.duration_s) == (0.0, 0.0)


def test_counts_have_all_five_outcomes(tmp_path):
    with Store(tmp_path / "r.db") as s:
        cid = s.create_campaign("run", {})
        for o in ["clean", "clean", "hang", "error"]:
            s.record_run(cid, result(o))
        assert s.counts(cid) == {"clean": 2, "hang": 1, "fault": 0, "mismatch": 0, "error": 1}


def test_tally_groups_by_target_and_variant(tmp_path):
    with Store(tmp_path / "r.db") as s:
        cid = s.create_campaign("run", {})
        for v, o in [("fixed", "clean"), ("broken", "mismatch"), ("broken", "clean"), ("fixed", "clean")]:
            s.record_run(cid, result(o, variant=v, target="pipe"))
        t = {x.variant: x for x in s.tally()}
        assert t["broken"].counts["mismatch"] == 1 and t["broken"].n == 2 and t["broken"].failures == 1
        assert t["fixed"].n == 2 and t["fixed"].failures == 0


def test_repeated_failures_share_one_signature(tmp_path):
    with Store(tmp_path / "r.db") as s:
        cid = s.create_campaign("run", {})
        s.record_run(cid, result("fault", "pid 101: illegal address at 0x7f0012 in /tmp/a1/k.cu:45",
                                 error_kind="illegal_address"))
        s.record_run(cid, result("fault", "pid 977: illegal address at 0x7f99ff in /tmp/b2/k.cu:45",
                                 error_kind="illegal_address"))
        s.record_run(cid, result("hang", "no reply within 2.0 s"))
        s.record_run(cid, result("clean"))
        sigs = s.signatures(cid)
        assert [(x.outcome, x.count) for x in sigs] == [("fault", 2), ("hang", 1)]
        assert sigs[0].message == "pid <n>: illegal address at <addr> in <path>:<n>"
        runs = s.runs(cid)
        assert runs[0].signature_id == runs[1].signature_id != runs[2].signature_id
        assert runs[3].signature_id is None


def test_signature_separates_targets_variants_and_kinds():
    base = dict(outcome=Outcome.FAULT, reason="exit 139", target="t", variant="v", error_kind="segv")
    keys = {signature_of(RunResult(**{**base, **change})).key
            for change in ({}, {"target": "u"}, {"variant": "w"}, {"error_kind": "abort"},
                           {"outcome": Outcome.HANG}, {"reason": "exit 134 other"})}
    assert len(keys) == 6
    assert signature_of(RunResult(outcome=Outcome.CLEAN, reason="ok")) is None


def test_normalize_message_strips_incidentals_and_keeps_words():
    assert normalize_message("thread 7 pid=31337 GPU-4c1e0a2b-1111-2222-3333-444455556666 x")\
        == "thread <n> pid <n> <gpu> x"
    assert normalize_message("CUDA error: an illegal memory access was encountered") \
        == "CUDA error: an illegal memory access was encountered"
    assert normalize_message("  a \n\t b  ") == "a b"


def test_store_path_from_env_and_default(tmp_path, monkeypatch):
    monkeypatch.delenv("HZ_STORE", raising=False)
    assert resolve_path(None) == Path(".hazards/results.db")
    monkeypatch.setenv("HZ_STORE", str(tmp_path / "env.db"))
    assert resolve_path(None) == tmp_path / "env.db"
    assert resolve_path(tmp_path / "explicit.db") == tmp_path / "explicit.db"


@pytest.mark.parametrize("bad", ["/proc/hz-no-such/results.db", "/sys/hz-results.db", "{file}/results.db", "{dir}"])
def test_unwritable_store_path_is_a_user_error_and_creates_nothing(tmp_path, bad):
    (tmp_path / "afile").write_text("x")
    path = bad.format(file=tmp_path / "afile", dir=tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(UserError):
        Store(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_unknown_schema_version_is_refused(tmp_path):
    path = tmp_path / "r.db"
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.commit()
    db.close()
    with pytest.raises(UserError, match="schema version 99"):
        Store(path)


def test_foreign_sqlite_and_garbage_files_are_refused_untouched(tmp_path):
    other = tmp_path / "other.db"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all" * 100)
    for path in (other, garbage):
        data = path.read_bytes()
        with pytest.raises(UserError):
            Store(path)
        assert path.read_bytes() == data


def test_open_without_create_refuses_a_missing_store_and_creates_nothing(tmp_path):
    with pytest.raises(UserError, match="no results store"):
        Store(tmp_path / "missing" / "r.db", create=False)
    assert list(tmp_path.iterdir()) == []


def test_missing_campaign_is_a_user_error_that_lists_the_stored_ids(tmp_path):
    with Store(tmp_path / "r.db") as s:
        for _ in range(4):
            s.create_campaign("run", {})
        s._db.execute("DELETE FROM campaigns WHERE id = 3")
        with pytest.raises(UserError, match=r"no campaign 42 in .*r\.db \(its campaigns: 1-2, 4\)$"):
            s.campaign(42)


def test_campaign_status_and_spec_round_trip(tmp_path):
    with Store(tmp_path / "r.db") as s:
        cid = s.create_campaign("run", {"argv": ["a", "b"], "n": 3}, name="x")
        c = s.campaign(cid)
        assert (c.kind, c.name, c.spec, c.status) == ("run", "x", {"argv": ["a", "b"], "n": 3}, "running")
        s.set_campaign_status(cid, "complete")
        s.update_campaign_spec(cid, {"n": 5})
        c = s.campaign(cid)
        assert (c.status, c.spec) == ("complete", {"n": 5})
        assert [c.id for c in s.campaigns("run")] == [cid] and s.campaigns("soak") == []


def _writer(path: str, cid: int, count: int) -> None:
    s = Store(path)
    for _ in range(count):
        s.record_run(cid, result("fault", "pid 1 died"))
    s.close()


def test_several_processes_write_one_campaign_without_loss(tmp_path):
    path = tmp_path / "r.db"
    with Store(path) as s:
        cid = s.create_campaign("run", {})
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(path), cid, 40)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    with Store(path) as s:
        seqs = [r.seq for r in s.runs(cid)]
        assert seqs == list(range(1, 121))
        assert s.signatures(cid)[0].count == 120
        assert s.integrity_check() == "ok"
