"""`hazards check` ends within about its budget: the static part (compilers on the CPU) runs
beside the GPU part instead of before it, and the default budget keeps the whole command
under a minute (an H100's check at the old defaults took 185 s: 27 s static, then 153 s GPU)."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from campaign_fakes import fake_items_for, make_family

from hazards import checkrun
from hazards.checkrun import run_check
from hazards.engine import toolchain
from hazards.engine.errors import ToolchainMissing, UserError

STATIC_S = 2.5


def slow_static(record: dict):
    def run_static(paths, families=None, skip_tools=(), observer=None):
        record["began"] = time.time()
        time.sleep(STATIC_S)
        record["ended"] = time.time()
        return [], "static checks stubbed: slept"
    return run_static


def test_the_static_part_runs_beside_the_gpu_part_not_before_it(fake_gpus, store, monkeypatch):
    seen: dict = {}
    monkeypatch.setattr(checkrun, "run_static", slow_static(seen))
    t0 = time.monotonic()
    res = run_check(budget_s=3, catalog=[make_family()], store=store, items_for=fake_items_for, wait_s=0)
    wall = time.monotonic() - t0
    runs = store.runs(res.campaign_id)
    assert res.exit_code == 0, res.summary_lines()
    assert min(r.result.started_at for r in runs) < seen["ended"], "the GPU part waited for the static part"
    assert wall < 3 + STATIC_S - 1, wall  # about the longer of the two, not their sum
    assert res.static_note == "static checks stubbed: slept" and res.static_s >= STATIC_S - 0.1


def test_a_static_part_longer_than_the_budget_is_waited_for_and_reported(fake_gpus, store, monkeypatch):
    seen: dict = {}
    monkeypatch.setattr(checkrun, "run_static", slow_static(seen))
    res = run_check(budget_s=1, catalog=[make_family()], store=store, items_for=fake_items_for, wait_s=0)
    assert "ended" in seen and res.static_note == "static checks stubbed: slept"
    assert res.exit_code == 0 and {v.status for v in res.verdicts} <= {"clean", "detected"}


def test_a_missing_path_is_bad_input_before_the_gpu_part_runs(fake_gpus, store, tmp_path):
    t0 = time.monotonic()
    with pytest.raises(UserError, match="no such file or directory"):
        run_check(budget_s=30, paths=[str(tmp_path / "nope.cu")], catalog=[make_family()], store=store,
                  items_for=fake_items_for, wait_s=0)
    assert time.monotonic() - t0 < 10 and store.campaigns() == []


def test_an_error_of_the_static_part_is_raised_after_the_gpu_part(fake_gpus, store, monkeypatch):
    def broken(paths, families=None, skip_tools=(), observer=None):
        raise UserError("the static part broke")

    monkeypatch.setattr(checkrun, "run_static", broken)
    with pytest.raises(UserError, match="the static part broke"):
        run_check(budget_s=1, catalog=[make_family()], store=store, items_for=fake_items_for, wait_s=0)


def test_skipping_a_tool_in_one_thread_does_not_skip_it_in_another():
    """The static part skips clang (`--skip clang`) while the family builds look up nvcc on
    the caller's thread: the skip must stay in the static part's context."""
    inside, release = threading.Event(), threading.Event()

    def static_part() -> None:
        with toolchain.skipping(["nvcc"]):
            inside.set()
            release.wait(10)

    t = threading.Thread(target=static_part)
    t.start()
    try:
        assert inside.wait(10)
        try:
            toolchain.find_tool("nvcc", "a family build")
        except ToolchainMissing as e:
            assert not e.skipped, "a skip of another thread reached this one"
    finally:
        release.set()
        t.join()


def test_the_static_runners_workers_see_the_skip_of_the_thread_that_runs_them():
    from hazards.static.runner import Subject, run_subjects

    def looks_up_nvcc() -> list:
        try:
            toolchain.find_tool("nvcc", "a static check")
        except ToolchainMissing as e:
            return [e.skipped]
        return [False]

    with toolchain.skipping(["nvcc"]):
        found = list(run_subjects([Subject(f"s{i}", looks_up_nvcc) for i in range(4)], jobs=2))
    assert found == [[True]] * 4


def test_killing_the_static_parts_compilers_spares_a_supervised_server():
    from hazards.engine.containment import CONTAINMENT
    from hazards.static.runner import child_pids, kill_children_since

    before = child_pids()
    server, _ = CONTAINMENT.spawn(["sleep", "30"], mark="a GPU part's server")
    compiler = subprocess.Popen(["sleep", "30"])
    try:
        kill_children_since(before)
        assert compiler.wait(timeout=10) != 0
        assert server.poll() is None, "the supervised server was killed with the compilers"
    finally:
        for p in (server, compiler):
            if p.poll() is None:
                p.kill()
            p.wait()
        CONTAINMENT.ended(server.pid)


def test_the_default_budget_keeps_the_whole_check_under_a_minute(capsys):
    import json

    from hazards.cli import main

    rc = main(["check", "--dry-run", "--json", "--skip", "gpu"])
    plan = json.loads(capsys.readouterr().out)
    assert rc == 0 and plan["budget"][0].startswith("50s in all"), plan["budget"]


def test_progress_shows_the_static_phase_beside_the_builds_and_the_campaign():
    import io

    from hazards.cli.progress import CampaignProgress

    out = io.StringIO()
    with CampaignProgress(interval_s=0.05, stream=out, terminal=False) as progress:
        static = progress.phase()
        static.steps_begin("static checks", 3, 2)
        static.step_started("earlyclobber/broken")
        progress.steps_begin("family builds", 1, 1, "compiling")
        progress.step_started("pipeline launch server")
        time.sleep(0.2)
        progress.step_finished("pipeline launch server")
        progress.steps_end()
        static.step_finished("earlyclobber/broken")
        static.steps_end()
    text = out.getvalue()
    ticks = [line for line in text.splitlines() if "compiling and checking earlyclobber/broken" in line]
    assert ticks and "hazards family builds: 0/1 done" in text, text
    assert "hazards static checks: 1/3 done; finished in" in text and "hazards family builds: 1/1 done" in text


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
