"""Forensics at first sight, in every command: a hang under `hazards run` or
`hazards soak` is read before the kill and leaves its hang.md in the run's artifact folder;
a campaign's forensics take a capped share of its budget, a full collection once per stuck
location and a summary after; the command says what it spent."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from forensics_helpers import DATA, PROGRAMS, needs_ptrace, needs_py_spy
from hazards.cli import main
from hazards.engine.forensics import find_forensics_evidence
from hazards.engine.forensics.policy import FULL, NONE, SUMMARY, ForensicsPolicy, forensics_words
from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.store import Store
from hazards.engine.watchdog import HangContext, labelled_run, register_on_hang, run_collectors, set_hang_policy, \
    unregister_on_hang

HUNG_PY = PROGRAMS / "hung_python.py"
HUNG_WORKER = PROGRAMS / "hung_worker.py"
HUNG_TWO_PLACES = PROGRAMS / "hung_two_places.py"
FAKE_SERVER = Path(__file__).resolve().parents[1] / "fakes" / "fake_server.py"


def hang_mds(store_path: Path) -> list[Path]:
    return sorted((store_path.parent / "artifacts").glob("campaign-*/run-*/hang.md"))


@pytest.fixture
def fake_gpus(monkeypatch, tmp_path):
    """Two fake GPUs, leases in a private folder (as tests/campaign's fixture)."""
    monkeypatch.setenv("HZ_FAKE_GPUS", "0,1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("HZ_LEASE_DIR", str(tmp_path / "leases"))


# -- the commands, end to end --------------------------------------------------------------
@needs_py_spy
@needs_ptrace
def test_run_leaves_host_stacks_naming_the_waiting_function(tmp_path, capsys):
    db = tmp_path / "r.db"
    rc = main(["run", "-n", "1", "--timeout", "1.5", "--store", str(db), "--", sys.executable, str(HUNG_PY)])
    err = capsys.readouterr().err
    assert rc == 1
    [md] = hang_mds(db)
    text = md.read_text()
    assert "called from wait_for_result (hung_python.py:14)" in text and "## Forensics\nfull:" in text
    assert (md.parent / "hang.json").is_file()
    assert "forensics: 1 hang, 1 full collection, 0 summaries" in err
    with Store(db) as s:
        [run] = s.runs(1)
        spec = s.campaign(1).spec
    assert "wait_for_result" in run.result.reason and run.result.artifact_dir == str(md.parent)
    assert spec["forensics"]["full"] == 1 and spec["forensics"]["spent_s"] > 0


@needs_py_spy
@needs_ptrace
def test_run_names_the_stuck_worker_not_the_joining_main_thread(tmp_path):
    db = tmp_path / "r.db"
    main(["run", "-n", "1", "--timeout", "1.5", "--store", str(db), "--", sys.executable, str(HUNG_WORKER)])
    [md] = hang_mds(db)
    assert md.read_text().split("\n")[2].startswith("host: fetcher waits in fetch_forever (hung_worker.py:9)")


def test_no_forensics_kills_a_hang_with_nothing_collected(tmp_path):
    db = tmp_path / "r.db"
    main(["run", "-n", "1", "--timeout", "0.5", "--no-forensics", "--store", str(db), "--",
          sys.executable, str(HUNG_PY)])
    assert hang_mds(db) == []
    with Store(db) as s:
        assert find_forensics_evidence(s.runs(1)[0].result.evidence) is None


@pytest.mark.parametrize("args, message", [
    (["--hang-budget", "0"], "--hang-budget must be a positive, finite number of seconds"),
    (["--forensics-share", "1.5"], "--forensics-share must be a share of the budget in (0, 1]"),
])
def test_bad_forensics_options_are_one_line_errors(tmp_path, capsys, args, message):
    rc = main(["run", "-n", "1", *args, "--store", str(tmp_path / "r.db"), "--", sys.executable, str(HUNG_PY)])
    assert rc == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "r.db").exists()


@needs_py_spy
@needs_ptrace
def test_soak_leaves_the_hang_md_of_a_hung_python_target(fake_gpus, tmp_path, capsys):
    targets = tmp_path / "targets.toml"
    targets.write_text(f'[[target]]\nname = "hung-py"\nargv = ["{sys.executable}", "{HUNG_PY}"]\ntimeout = 1\n')
    db = tmp_path / "r.db"
    rc = main(["soak", "--budget", "2s", "--targets", str(targets), "--no-families", "--store", str(db),
               "--report", str(tmp_path / "soak.html"), "--max-gpus", "1"])
    captured = capsys.readouterr()
    assert rc == 1, captured.out  # a clean target that hangs is flagged
    mds = hang_mds(db)
    assert mds, "no hang.md in the soak's artifacts"
    assert "wait_for_result (hung_python.py:14)" in mds[0].read_text()
    with Store(db) as s:
        hangs = s.runs(1, outcome="hang")
        spec = s.campaign(1).spec
    levels = [find_forensics_evidence(r.result.evidence)["level"] for r in hangs]
    assert levels[0] == FULL and all(lv == SUMMARY for lv in levels[1:])  # one location: one full collection
    assert spec["forensics"]["hangs"] == len(hangs) and f"forensics: {len(hangs)} hang" in captured.err
    # the morning report links the new hang signature to the hang.md of its first (fully read) hang
    first_md = Path(hangs[0].result.artifact_dir) / "hang.md"
    assert f"NEW hang in hung-py: stuck at hung_python.py:14 (x{len(hangs)}); hang.md: {first_md}" in captured.out
    assert f"forensics: {len(hangs)} hang" in captured.out


def _levels(db: Path, campaign_id: int = 1) -> list[str]:
    with Store(db) as s:
        return [find_forensics_evidence(r.result.evidence)["level"] for r in s.runs(campaign_id, outcome="hang")]


@needs_py_spy
@needs_ptrace
def test_each_new_stuck_location_gets_one_full_collection_and_repeats_a_summary(tmp_path, capsys):
    db = tmp_path / "r.db"
    main(["run", "-n", "4", "--timeout", "0.8", "--forensics-share", "1", "--store", str(db), "--",
          sys.executable, str(HUNG_TWO_PLACES), str(tmp_path / "counter")])
    # run 2 hangs elsewhere: its summary saw a location new for the item and went on to the full collection
    assert _levels(db) == [FULL, FULL, SUMMARY, SUMMARY]
    with Store(db) as s:
        runs = s.runs(1)
        assert {sig.message for sig in s.signatures(1)} == {"stuck at hung_two_places.py:10",
                                                            "stuck at hung_two_places.py:14"}
        assert s.campaign(1).spec["forensics"]["upgraded"] == 1
    plan = find_forensics_evidence(runs[1].result.evidence)["plan"]
    assert "new stuck location (hung_two_places.py:14)" in plan["why"]
    assert "forensics: 4 hangs, 2 full collections, 2 summaries" in capsys.readouterr().err


@needs_py_spy
@needs_ptrace
def test_a_run_campaign_keeps_its_forensics_within_the_cap(tmp_path):
    db = tmp_path / "r.db"
    # 12 runs x 0.5 s timeout: a 6 s base, 10% of it: 0.6 s for all hangs but the first full
    # collection. The real collectors can take almost nothing on an idle machine (py-spy in
    # tens of ms), which would leave the cap unspent: a collector of a known 0.3 s makes the
    # first collection spend half the cap, so what is left (< 0.5 s) buys no further look.
    slow = _Slow(0.3)
    register_on_hang(slow, order=100)
    try:
        main(["run", "-n", "12", "--timeout", "0.5", "--hang-budget", "3", "--store", str(db), "--",
              sys.executable, str(HUNG_PY)])
    finally:
        unregister_on_hang(slow)
    with Store(db) as s:
        f = s.campaign(1).spec["forensics"]
    assert f["hangs"] == 12 and f["cap_s"] == max(0.6, f["cap_s"]) and f["spent_s"] <= f["cap_s"] + 0.1, f
    levels = _levels(db)
    assert levels[0] == FULL and FULL not in levels[1:] and levels.count(NONE) == f["none"] > 0


def test_a_campaign_whose_share_is_below_one_hang_budget_gets_its_first_look_and_no_more():
    """The first full collection may take a whole hang budget; after it, the share holds (the cap
    once floored at one hang budget let a 40 s soak spend 46% of it on forensics)."""
    policy = ForensicsPolicy(hang_budget_s=2.0, share=0.1)
    slow = _Slow(0.5)
    register_on_hang(slow, order=100)
    set_hang_policy(policy)
    try:
        policy.begin(3.0)  # 10%: 0.3 s, less than the first collection's 0.5 s
        levels = [_hang(policy, t)[0] for t in ["a", "b", "a", "c"]]
    finally:
        set_hang_policy(None)
        unregister_on_hang(slow)
    assert levels == [FULL, NONE, NONE, NONE]
    assert 0.45 <= policy.first_full_s <= policy.spent_s <= 0.6


@needs_py_spy
@needs_ptrace
def test_check_reads_a_canary_hang_once_then_not_again_once_the_store_located_it(fake_gpus, tmp_path, monkeypatch):
    from hazards import checkrun
    from hazards.engine.loop import WorkItem
    from hazards.family import Family, StaticVerdict, Variant

    monkeypatch.setattr(checkrun, "run_static", lambda paths, families=None, skip_tools=(), observer=None: ([], "stubbed"))
    fam = Family(name="fakefam", summary="a canary that hangs", strategy=lambda: None, binary="fakefam",
                 static_model=lambda p: StaticVerdict(p.get("variant") == "broken", "fake"),
                 variants=(Variant("fixed", "fixed", "the fix", params={}),
                           Variant("broken", "broken", "hangs", params={"action": "hang"}, detected_by=("stress",))))

    def items_for(family, variants):
        return [WorkItem(target=family.name, variant=v.name, kind="server", argv=(sys.executable, str(FAKE_SERVER)),
                         params={"variant": v.name, **v.params}, launches=2, timeout_s=1.0) for v in variants]

    db = tmp_path / "r.db"
    for _ in range(2):
        with Store(db) as store:
            res = checkrun.run_check(budget_s=4, catalog=[fam], store=store, items_for=items_for, wait_s=0,
                                     forensics=ForensicsPolicy(hang_budget_s=10, known_canary=NONE))
        assert {v.variant: v.status for v in res.verdicts}["broken"] == "detected"
    first, second = _levels(db, 1), _levels(db, 2)
    assert first[0] == FULL and second and set(second) == {NONE}
    mds = hang_mds(db)
    assert "fake_server.py" in mds[0].read_text()
    assert any("none: a canary whose hang is already located" in m.read_text() for m in mds if "campaign-2" in str(m))


# -- the share ------------------------------------------------------------------------------
class _Slow:
    """A collector standing in for the real ones: takes `seconds` (or what is left)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.__qualname__ = "slow_collector"

    def __call__(self, ctx: HangContext) -> dict:
        time.sleep(max(0.0, min(self.seconds, ctx.remaining() - 0.05)))
        if ctx.plan is not None and ctx.plan.level == FULL:
            ctx.plan.policy.learn(ctx.plan.key, [f"{ctx.plan.key[0]}.py:1"])
        return {"level": ctx.plan.level if ctx.plan else None}


def _hang(policy: ForensicsPolicy, target: str, expect: str | None = None) -> tuple[str, float]:
    ctx = HangContext(pid=0, pgid=0, argv=[], target=target, started_at=time.time(), artifact_dir=None, env={})
    with labelled_run(target=target, variant="", expect=expect):
        ctx.run = {"target": target, "variant": "", "expect": expect}
        t0 = time.monotonic()
        run_collectors(ctx)
        return ctx.plan.level, time.monotonic() - t0


def test_many_hangs_get_one_full_collection_per_location_and_never_more_than_the_cap():
    policy = ForensicsPolicy(hang_budget_s=0.4, share=0.1)
    slow = _Slow(0.3)
    register_on_hang(slow, order=100)
    set_hang_policy(policy)
    try:
        policy.begin(30.0)  # cap: 10% of 30 s = 3 s
        levels = [_hang(policy, t)[0] for t in ["a", "a", "b", "a", "b"]]
        assert levels == [FULL, SUMMARY, FULL, SUMMARY, SUMMARY]
        levels += [_hang(policy, "a")[0] for _ in range(20)]
    finally:
        set_hang_policy(None)
        unregister_on_hang(slow)
    s = policy.summary()
    assert s["full"] == 2 and levels[-1] == NONE  # the cap ended the collections
    assert s["spent_s"] <= s["cap_s"] + 0.1, s
    assert s["hangs"] == 25 and s["none"] == levels.count(NONE) > 0
    words = forensics_words(s)
    assert words.startswith("forensics: 25 hangs, 2 full collections, ") and "without forensics" in words
    assert "cap 10%" in words


def test_a_canary_whose_hang_the_store_located_gets_nothing_under_the_check_default(tmp_path):
    with Store(tmp_path / "r.db") as store:
        cid = store.create_campaign("check", {})
        located = {"collectors": {"hang_forensics": {"hz_forensics": 1, "stuck_at": ["k.cu:40"]}}}
        store.record_run(cid, RunResult(Outcome.HANG, "timed out", target="deadlock", variant="broken",
                                        evidence=located))
        policy = ForensicsPolicy(hang_budget_s=10, known_canary=NONE)
        policy.begin(180.0, store)
    canary = HangContext(pid=0, pgid=0, argv=[], target="x", started_at=0, artifact_dir=None, env={},
                         run={"target": "deadlock", "variant": "broken", "expect": "detect"})
    assert policy.plan(canary) == 0.0 and canary.plan.level == NONE
    assert "already located" in canary.plan.why
    clean = HangContext(pid=0, pgid=0, argv=[], target="x", started_at=0, artifact_dir=None, env={},
                        run={"target": "deadlock", "variant": "fixed", "expect": "clean"})
    assert policy.plan(clean) == 10.0 and clean.plan.level == FULL  # a clean variant's hang is news


def test_a_hang_without_forensics_still_leaves_a_hang_md_saying_why(tmp_path):
    policy = ForensicsPolicy(hang_budget_s=1, known_canary=NONE)
    policy.learn(("deadlock", "broken"), ["k.cu:40"])
    ctx = HangContext(pid=0, pgid=0, argv=[], target="deadlock", started_at=0, artifact_dir=tmp_path, env={},
                      run={"target": "deadlock", "variant": "broken", "expect": "detect"})
    set_hang_policy(policy)
    try:
        out = run_collectors(ctx)
    finally:
        set_hang_policy(None)
    assert find_forensics_evidence(out)["level"] == NONE
    md = (tmp_path / "hang.md").read_text()
    assert "none: a canary whose hang is already located" in md
    assert json.loads((tmp_path / "hang.json").read_text())["level"] == NONE
    # no tripwire, no progress place: the headline says nothing was read, and why
    assert md.split("\n")[2] == ("where it hangs is unknown: forensics: a canary whose hang is already located "
                                 "(its signature is known): no forensics")
    assert "last progress event" not in md


def test_a_summary_hang_md_leads_with_the_tripwire_and_compares_nothing():
    """A summary ran the tripwire but no debugger: hang.md says what the tripwire saw, without a
    side-by-side table whose debugger column would read as 'found nothing'."""
    from hazards.engine.forensics.collector import hang_markdown

    md = hang_markdown({"pid": 7, "level": SUMMARY, "sentence": "", "plan": {"why": "summary only"},
                        "tripwire": {"sentence": "1056 workers wait at barrier GRID", "agreement": "not compared"}})
    assert md.split("\n")[2] == "tripwire: 1056 workers wait at barrier GRID"
    assert "## Tripwire\n\n1056 workers wait at barrier GRID" in md and "side by side" not in md


# -- a hang that gets no collection still says where it is, and from what --------------------
TRIPWIRE_BROKEN_EPOCH = DATA / "h200-soak" / "tripwire-broken_epoch.bin"  # an H200 soak hang's file at the kill
DEADLOCK_NAMES = Path(__file__).resolve().parents[2] / "standalone" / "deadlock" / "deadlock_names.h"
STALL_PLACE = "launch 13, layer 3, phase WAIT_RELEASE, barrier ATTN_RELEASE"


def _uncollected_hang(tmp_path: Path, why: str, *, tripwire: bool, tripwire_bytes: bytes | None = None
                      ) -> tuple[dict, str]:
    """One hang that the policy gives no forensics (`why`: "cap" or "canary"), with the stall's
    last progress place and, if `tripwire`, a tripwire file (the H200 soak's, or `tripwire_bytes`);
    (its collectors' output, its hang.md)."""
    from hazards.engine.tripwire import ENV_PATH, load_names, register_names

    if why == "cap":  # a located item, nothing left of a 0.1 s cap
        policy = ForensicsPolicy(hang_budget_s=1)
        policy.begin(1.0)
    else:
        policy = ForensicsPolicy(hang_budget_s=1, known_canary=NONE)
    policy.learn(("deadlock", "broken_epoch"), ["deadlock.cu:119 (spin)"])
    env = {}
    if tripwire:
        path = tmp_path / "hz-tw-test"
        path.write_bytes(TRIPWIRE_BROKEN_EPOCH.read_bytes() if tripwire_bytes is None else tripwire_bytes)
        register_names(path, load_names(DEADLOCK_NAMES))
        env = {ENV_PATH: str(path)}
    ctx = HangContext(pid=0, pgid=0, argv=[], target="deadlock", started_at=0, artifact_dir=tmp_path / "art",
                      env=env, run={"target": "deadlock", "variant": "broken_epoch", "expect": "detect"},
                      last_progress=STALL_PLACE)
    set_hang_policy(policy)
    try:
        out = run_collectors(ctx)
    finally:
        set_hang_policy(None)
    assert ctx.plan.level == NONE
    return out, (tmp_path / "art" / "hang.md").read_text()


@pytest.mark.parametrize("why", ["cap", "canary"])
def test_a_hang_without_forensics_leads_with_the_tripwire_file_and_says_why_no_debugger_looked(tmp_path, why):
    """Past the forensics cap (or a located canary under `check`), a family with a tripwire file
    gets one read of it (no collector: no attach, no second snapshot): hang.md leads with its
    diagnosis, says it is the tripwire's and why nothing else was read, and keeps the reason."""
    from hazards.engine.tripwire import find_tripwire_evidence

    out, md = _uncollected_hang(tmp_path, why, tripwire=True)
    lines = md.split("\n")
    assert lines[2].startswith("tripwire: 63 workers wait at barrier ATTN_RELEASE epoch 5 (observed 4); "
                               "1 straggler at MOE_W13_W2 layer 4"), lines[2]
    because = "the forensics cap is spent" if why == "cap" else "a canary whose hang is already located"
    assert f"(not read: forensics: {because}" in lines[2]
    assert f"## Forensics\nnone: {because}" in md
    assert f"last progress event before the hang: {STALL_PLACE}" in md
    assert "side by side" not in md and "not compared: the debugger did not look" in md
    assert "## Tripwire (one read of its file before the kill, no collector)" in md
    found = find_forensics_evidence(out)
    assert found["level"] == NONE and found["sentence"] == ""  # the reason stays as the stall verdict said it
    tw = find_tripwire_evidence(out)  # the target keeps it, and reads no post-mortem on top
    assert tw["when"] == "hang, one read" and tw["sentence"].startswith("63 workers wait")
    assert (tmp_path / "art" / "tripwire-hang.txt").read_text().startswith(tw["sentence"])


@pytest.mark.parametrize("why", ["cap", "canary"])
def test_a_hang_without_forensics_or_tripwire_leads_with_the_stalls_last_progress_place(tmp_path, why):
    out, md = _uncollected_hang(tmp_path, why, tripwire=False)
    because = "the forensics cap is spent" if why == "cap" else "a canary whose hang is already located"
    assert md.split("\n")[2].startswith(f"the last progress event before the hang (not a debugger): {STALL_PLACE} "
                                        f"(not read: forensics: {because}"), md
    assert "where it hangs was not read" not in md and f"## Forensics\nnone: {because}" in md
    assert find_forensics_evidence(out)["sentence"] == ""


def test_a_tripwire_file_with_no_breadcrumbs_does_not_hide_the_stalls_last_progress_place(tmp_path):
    """A tripwire file the kernel never wrote (empty: it hung before its first breadcrumb, or the
    file was never mapped) says nothing of where the run is; hang.md leads with the stall's last
    progress place instead, and the tripwire's 'no breadcrumbs' stays in its own section."""
    out, md = _uncollected_hang(tmp_path, "cap", tripwire=True, tripwire_bytes=b"")
    assert md.split("\n")[2].startswith(f"the last progress event before the hang (not a debugger): {STALL_PLACE} "
                                        "(not read: forensics: the forensics cap is spent"), md
    assert "## Tripwire (one read of its file before the kill, no collector)\n\nno breadcrumbs" in md


def test_a_stalled_server_past_the_cap_gets_a_hang_md_naming_its_last_progress_place(tmp_path):
    """End to end: the watchdog hands the stall's last progress place to the on-hang policy."""
    from hazards.engine.targets import ServerTarget

    policy = ForensicsPolicy(hang_budget_s=1)
    with ServerTarget([sys.executable, str(FAKE_SERVER)], grace_s=0.5, handshake_timeout_s=30) as target, \
            policy.installed(1.0):
        policy.learn((target.name, ""), ["fake_server.py:1"])  # located, and a 0.1 s cap: no forensics
        r = target.run({"beats": 3, "beat_s": 0.05, "action": "hang"}, timeout=30, stall=0.5,
                       artifact_dir=tmp_path)
    assert r.outcome is Outcome.HANG and r.error_kind == "stall", r.reason
    md = (tmp_path / "hang.md").read_text()
    assert md.split("\n")[2].startswith("the last progress event before the hang (not a debugger): launch 2 "
                                        "(not read: forensics: the forensics cap is spent"), md
    assert r.reason.startswith("no progress for ") and "not a debugger" not in r.reason


def test_no_collection_writes_the_plan_it_is_given(tmp_path):
    from hazards.engine.forensics.collector import no_collection
    from hazards.engine.forensics.policy import HangPlan

    ctx = HangContext(pid=0, pgid=0, argv=[], target="deadlock", started_at=0, artifact_dir=tmp_path, env={})
    out = no_collection(ctx, HangPlan(NONE, "the forensics cap is spent (4.0 s)", 0.0, ("deadlock", "broken")))
    assert out["level"] == NONE and "## Forensics\nnone: the forensics cap is spent (4.0 s)" in \
        (tmp_path / "hang.md").read_text()
