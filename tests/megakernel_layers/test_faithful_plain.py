"""The plain build's `launch` row on the CPU: the faithful server asks the plain build (no
HZ_PROFILER, the machine code users run) for timed launches in the same request as the profiled
ones, and turns its reply into one row whose slowCTA, wall and sumCTA are the median event time.
Fake binaries stand in for the plain build: a good reply, replies that lack the field or carry
bad times (one-line errors), and a revision's plain build from before plain launches (the row is
left out, with the reason)."""
from __future__ import annotations

import array
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from hazards.engine.classify import faithful_problem
from hazards.engine.protocol_server import StopServing
from hazards.kernel_sources import RevisionSources
from hazards.megakernel_layers import faithful as FA

NAMES = "2=qkv,3=attn_chunk,4=attn_merge,5=oproj,6=router_topk,7=moe_w13,8=moe_w2,11=worker"
SHAPE = {"layers": 4, "seq": 4096, "chunks": 33, "qkv_tiles": 80, "w13_tiles": 33, "bytes_per_step": 1.04e9}
PROFILED = {"status": "ok", "cos": 0.99991, "rel_err": 8e-3, "grid": 132, "capacity": 2, "kernel_us": [410, 400],
            "task_names": NAMES, "build": "megakernel_layers-profiled", **SHAPE}


def plain_reply(**over) -> dict:
    return {"status": "ok", "launches": 0, "cos": 0.99993, "rel_err": 7e-3, "grid": 132, "tripwire": "off",
            "profiler": 0, "plain_launches": 3, "plain_us": [610.0, 590.0, 600.0], **SHAPE, **over}


def fake_plain(tmp_path: Path, reply: dict | None, *, exit_code: int = 0) -> Path:
    """A plain build that records each request it gets and answers `reply` (None: exits
    `exit_code` before any reply, as a plain build from before plain launches does)."""
    exe = tmp_path / "plain" / "megakernel_layers"
    exe.parent.mkdir(exist_ok=True)
    log = tmp_path / "requests.jsonl"
    if reply is None:
        body = f"sys.stderr.write('hz: bad request: built without -DHZ_PROFILER\\n'); sys.exit({exit_code})"
    else:
        body = (f"for line in sys.stdin:\n    open({str(log)!r}, 'a').write(line)\n"
                f"    print('MKL_PROFILE ' + {json.dumps(json.dumps(reply))}, flush=True)")
    exe.write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
    exe.chmod(0o755)
    return exe


def ring_file(path: Path) -> Path:
    """Two launches of one worker span and one qkv span (claimed 2, capacity 2)."""
    words = []
    for _ in range(2):
        words += [2, 2, 100, 160, (2 << 48), 0, 50, 900, (11 << 48), 0]
    path.write_bytes(array.array("Q", words).tobytes())
    return path


@pytest.fixture
def faithful(tmp_path, monkeypatch):
    """A Faithful whose profiled side is a canned reply and ring, and whose plain build is
    whatever `monkeypatch`ed `plain_exe` says."""
    ring = ring_file(tmp_path / "ring.bin")
    f = FA.Faithful()
    asked = []

    def profile(cand, workers, launches, revision=None):
        asked.append((cand.name, workers, launches, revision))
        return dict(PROFILED), FA.read_rings(ring, launches, FA.task_names(NAMES))

    monkeypatch.setattr(f, "profile", profile)
    f.asked = asked
    yield f
    f.close()


def use_plain(monkeypatch, exe: Path, built: list | None = None) -> None:
    def binary(self, defines, revision=None, profiled=True):
        assert not profiled, "the profiled side is canned here"
        if built is not None:
            built.append((defines, revision))
        return exe
    monkeypatch.setattr(FA.Faithful, "binary", binary)


def test_the_plain_builds_times_become_one_launch_row(faithful, monkeypatch, tmp_path):
    use_plain(monkeypatch, fake_plain(tmp_path, plain_reply()))
    res = faithful.measure(FA.candidate("step_p"), 132, 2, 0.99, plain_launches=3)
    *tasks, launch = res["rows"]
    assert [r["task"] for r in tasks] == ["qkv", "worker"]
    assert launch["task_id"] == FA.LAUNCH_TASK_ID == 1 << 16 and launch["task"] == "launch"
    assert launch["slowCTA_us"] == launch["wall_us"] == launch["sumCTA_us"] == 600.0  # the median of 3
    assert launch["single_metric"] is True and launch["launches"] == 3 and launch["cos"] == 0.99993
    assert launch["build"] == "plain" and launch["candidate"] == "step_p" and launch["workers"] == 132
    assert faithful_problem(launch) is None, launch
    assert res["skipped_rows"] == {} and res["mismatched"] == 0
    # the plain build got the step's own params, no profiled launches and no ring
    [request] = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert request == {"params": {"grid": 132}, "launches": 0, "plain_launches": 3}


def test_without_plain_launches_no_plain_build_is_asked(faithful, monkeypatch, tmp_path):
    use_plain(monkeypatch, fake_plain(tmp_path, plain_reply()))
    res = faithful.measure(FA.candidate("production"), 132, 2, 0.99)
    assert [r["task"] for r in res["rows"]] == ["qkv", "worker"]
    assert not (tmp_path / "requests.jsonl").exists()


def test_a_plain_build_below_the_cosine_makes_the_sample_mismatched(faithful, monkeypatch, tmp_path):
    use_plain(monkeypatch, fake_plain(tmp_path, plain_reply(cos=0.5)))
    res = faithful.measure(FA.candidate("production"), 132, 2, 0.99, plain_launches=3)
    assert res["mismatched"] == 1 and res["rows"][-1]["cos"] == 0.5


def test_the_server_reply_carries_the_launch_row(faithful, monkeypatch, tmp_path):
    use_plain(monkeypatch, fake_plain(tmp_path, plain_reply()))
    reply = FA.handle(faithful, {"id": 1, "launches": 2, "params": {"candidate": "production", "workers": 132,
                                                                   "plain_launches": 3}})
    assert reply["status"] == "ok" and reply["metrics"]["plain_launches"] == 3, reply
    assert [r["task"] for r in reply["metrics"]["faithful"]] == ["qkv", "worker", "launch"]
    assert "skipped_rows" not in reply["metrics"]


BAD = [
    ({k: v for k, v in plain_reply().items() if k != "plain_us"},
     "ProtocolMismatch: the plain binary's reply lacks plain_us"),
    (plain_reply(plain_us=[610.0, -1.0, 600.0]), "ValueError: the plain binary replied plain_us"),
    (plain_reply(plain_us=[610.0, 600.0]), "not 3 finite positive times"),
    (plain_reply(plain_us=[610.0, None, 600.0]), "not 3 finite positive times"),
    (plain_reply(plain_us="600"), "not 3 finite positive times"),
    (plain_reply(plain_us=[610.0, 0, 600.0]), "not 3 finite positive times"),
    (plain_reply(grid=64), "the plain build ran grid 64"),
]


@pytest.mark.parametrize("reply, words", BAD)
def test_a_bad_plain_reply_is_a_one_line_bad_request(faithful, monkeypatch, tmp_path, reply, words):
    use_plain(monkeypatch, fake_plain(tmp_path, reply))
    out = FA.handle(faithful, {"id": 1, "launches": 2, "params": {"candidate": "production", "workers": 132,
                                                                 "plain_launches": 3}})
    assert out["status"] == "bad_request" and words in out["message"], out
    assert "\n" not in out["message"]


def test_a_plain_reply_without_the_field_from_a_revision_names_the_revision(faithful, monkeypatch, tmp_path):
    reply = {k: v for k, v in plain_reply().items() if k != "plain_us"}
    use_plain(monkeypatch, fake_plain(tmp_path, reply))
    with pytest.raises(FA.ProtocolMismatch, match="the plain build from revision abababababab's reply lacks plain_us"):
        faithful.measure(FA.candidate("production"), 132, 2, 0.99, RevisionSources("ab" * 20, tmp_path),
                         plain_launches=3)


def revision_tree(tmp_path: Path, harness: str) -> RevisionSources:
    """A revision whose megakernel_layers.cu is `harness`."""
    cu = tmp_path / "rev" / "megakernel_layers" / "megakernel_layers.cu"
    cu.parent.mkdir(parents=True, exist_ok=True)
    cu.write_text(harness)
    return RevisionSources("ab" * 20, tmp_path / "rev")


OLD_HARNESS = 'if (const hz::json::Value* v = req.get("launches")) { /* no plain launches */ }\n'
NEW_HARNESS = OLD_HARNESS + 'if (const hz::json::Value* v = req.get("plain_launches")) {}\n'


def test_a_revisions_plain_build_from_before_plain_launches_leaves_the_row_out_and_says_why(faithful, monkeypatch,
                                                                                          tmp_path):
    built = []
    use_plain(monkeypatch, fake_plain(tmp_path, None, exit_code=2), built)
    rev = revision_tree(tmp_path, OLD_HARNESS)
    for _ in range(2):
        res = faithful.measure(FA.candidate("production"), 132, 2, 0.99, rev, plain_launches=3)
        assert [r["task"] for r in res["rows"]] == ["qkv", "worker"]
        why = res["skipped_rows"]["launch"]
        assert why == ("not measured: revision abababababab's megakernel_layers.cu does not read "
                       'req.get("plain_launches") (a revision from before plain launches: its plain build refuses '
                       "--profile-serve)")
    assert built == []  # decided from its sources: its plain build is neither built nor started
    reply = FA.handle(faithful, {"id": 1, "launches": 2, "params": {
        "candidate": "production", "workers": 132, "plain_launches": 3, "revision": rev.commit,
        "sources": str(rev.standalone)}})
    assert reply["status"] == "ok" and reply["metrics"]["skipped_rows"]["launch"] == why


@pytest.mark.parametrize("how, words", [
    ("sys.exit(2)", "exited (code 2) before its first MKL_PROFILE reply"),
    ("sys.exit(1)", "exited (code 1) before its first MKL_PROFILE reply"),
    ("os.kill(os.getpid(), signal.SIGSEGV)", "was ended by SIGSEGV before its first MKL_PROFILE reply"),
])
def test_a_revision_that_knows_plain_launches_whose_plain_build_exits_stops_not_skips_the_row(
        faithful, monkeypatch, tmp_path, how, words):
    exe = fake_plain(tmp_path, None)
    exe.write_text(f"#!{sys.executable}\nimport os, signal, sys\nsys.stdin.readline()\n{how}\n")
    use_plain(monkeypatch, exe)
    rev = revision_tree(tmp_path, NEW_HARNESS)
    with pytest.raises(FA.ProtocolMismatch, match=re.escape("the plain build from revision abababababab " + words)):
        faithful.measure(FA.candidate("production"), 132, 2, 0.99, rev, plain_launches=3)
    assert faithful.no_plain == {}  # nothing cached: a restarted plain build is asked again
    reply = FA.handle(faithful, {"id": 1, "launches": 2, "params": {  # one line, as the profiled build's
        "candidate": "production", "workers": 132, "plain_launches": 3, "revision": rev.commit,
        "sources": str(rev.standalone)}})
    assert reply["status"] == "bad_request" and reply["message"].startswith("ProtocolMismatch: ") and words in reply[
        "message"] and "\n" not in reply["message"], reply


def test_a_revisions_plain_build_restarted_after_a_crash_is_not_skipped_when_it_crashes_again(faithful, monkeypatch,
                                                                                            tmp_path):
    # the first process answers, then dies (killed here); its restart (a new pid) crashes before replying
    count = tmp_path / "starts"
    exe = fake_plain(tmp_path, None)
    exe.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                   f"n = int(open({str(count)!r}).read()) if os.path.exists({str(count)!r}) else 0\n"
                   f"open({str(count)!r}, 'w').write(str(n + 1))\n"
                   "for line in sys.stdin:\n"
                   "    if n: os.abort()\n"
                   f"    print('MKL_PROFILE ' + {json.dumps(json.dumps(plain_reply()))}, flush=True)\n")
    use_plain(monkeypatch, exe)
    rev = revision_tree(tmp_path, NEW_HARNESS)
    res = faithful.measure(FA.candidate("production"), 132, 2, 0.99, rev, plain_launches=3)
    assert res["rows"][-1]["task"] == "launch" and res["skipped_rows"] == {}
    [proc] = faithful.procs.values()
    proc.kill()
    proc.wait()
    with pytest.raises(FA.ProtocolMismatch, match="was ended by SIGABRT"):
        faithful.measure(FA.candidate("production"), 132, 2, 0.99, rev, plain_launches=3)
    assert faithful.no_plain == {}


def test_a_revisions_plain_build_exiting_with_the_device_fault_code_is_a_device_error(faithful, monkeypatch,
                                                                                     tmp_path):
    use_plain(monkeypatch, fake_plain(tmp_path, None, exit_code=3))
    rev = revision_tree(tmp_path, NEW_HARNESS)
    with pytest.raises(FA.DeviceError, match="exited [(]code 3[)] before replying"):
        faithful.measure(FA.candidate("production"), 132, 2, 0.99, rev, plain_launches=3)


def test_the_harness_reads_the_field_the_old_revision_check_looks_for():
    from hazards.kernel_sources import standalone_dir

    cu = Path(standalone_dir()) / "megakernel_layers" / "megakernel_layers.cu"
    assert FA.PLAIN_REQUEST_FIELD in cu.read_text()
    assert FA.plain_unknown(RevisionSources("ab" * 20, Path(standalone_dir()))) is None


def test_todays_plain_build_exiting_is_a_device_fault_not_a_skipped_row(faithful, monkeypatch, tmp_path):
    use_plain(monkeypatch, fake_plain(tmp_path, None, exit_code=2))
    with pytest.raises(StopServing) as stop:
        FA.handle(faithful, {"id": 1, "launches": 2, "params": {"candidate": "production", "plain_launches": 3}})
    assert "the plain binary exited (code 2) before replying" in stop.value.reply["message"]


@pytest.mark.parametrize("value", [-1, 1001, True, "20", 2.5])
def test_a_bad_plain_launches_field_is_a_bad_request(value):
    reply = FA.handle(None, {"id": 1, "launches": 1, "params": {"candidate": "production", "plain_launches": value}})
    assert reply["status"] == "bad_request" and "plain_launches must be an integer in [0, 1000]" in reply["message"]


def test_the_plain_build_is_the_default_build_with_the_candidates_defines(monkeypatch, tmp_path):
    import hazards.family

    calls = []
    monkeypatch.setattr(hazards.family, "build_harness",
                        lambda folder, defines=None, standalone=None: calls.append(defines) or
                        tmp_path / str(len(calls)) / "megakernel_layers")
    f = FA.Faithful()
    try:
        step_p = FA.candidate("step_p").defines
        plain, profiled = f.binary(step_p, None, False), f.binary(step_p)
        assert plain != profiled and f.binary(step_p, None, False) == plain  # one build each, kept
    finally:
        f.close()
    assert calls == [dict(step_p), {"HZ_PROFILER": 1, **dict(step_p)}]


@pytest.mark.skipif(shutil.which("nvcc") is None and not os.environ.get("HZ_NVCC"),
                    reason="nvcc is not installed: a revision's plain build cannot be built")
def test_a_real_plain_build_from_before_plain_launches_exits_before_replying_so_its_row_is_left_out():
    # 608bae7 (before plain launches): its plain build refuses --profile-serve and exits 2 before
    # touching a GPU, so this runs on the CPU; the row is then left out with this reason
    from hazards.engine.errors import UserError
    from hazards.gates import perf

    try:
        rev = perf.catalog_revision(perf.resolve_side("megakernel_layers:production@608bae7"))
    except UserError as exc:  # an installed package, a shallow clone
        pytest.skip(f"the project's history is not here: {exc}")
    f = FA.Faithful()
    try:
        with pytest.raises(FA.ProtocolMismatch) as err:
            f.plain(FA.candidate("production"), 132, 3, revision=rev)
    finally:
        f.close()
    assert err.value.exited and str(err.value).startswith(
        f"the plain build from revision {rev.commit[:12]} exited (code 2) before its first MKL_PROFILE reply")


def test_the_pythons_plain_launches_bound_is_the_harness_bound():
    from hazards.kernel_sources import standalone_dir

    cu = (Path(standalone_dir()) / "megakernel_layers" / "megakernel_layers.cu").read_text()
    [(check, said)] = re.findall(r'req\.get\("plain_launches"\)\)\s*\{\s*if \(!v->is_integer\(\) \|\| v->num < 0 \|\| '
                                 r'v->num > (\d+)\) throw hz::BadRequest\("plain_launches must be in \[0, (\d+)\]"\)', cu)
    assert int(check) == int(said) == FA.MAX_PLAIN_LAUNCHES
