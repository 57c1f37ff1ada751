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


def test_a_compile_of_the_static_part_survives_the_family_builds_ending_beside_it(fake_gpus, store, monkeypatch):
    """H200, main c941074, a cold build cache: the family builds (6 families, each a cache hit)
    ended while the static part's nvcc for mma_pingpong-128x64 had just started; the builds'
    phase SIGKILLed every child the process had started since the phase began, that nvcc
    too, and the check ended with `failed (exit -9)`, exit 2 and an empty --json."""
    from hazards.static import runner
    from hazards.static.compile import run_tool

    builds_began, compiling = threading.Event(), threading.Event()

    def one_slow_compile(paths, families=None, skip_tools=(), observer=None):
        assert builds_began.wait(10)
        # the compile starts while the family builds run, and lasts past their end
        threading.Timer(0.3, compiling.set).start()
        run_tool(["sleep", "1.5"], "slow-compile")
        return [], "one compile, not killed"

    def build_while_it_compiles(fam, variants):
        builds_began.set()
        assert compiling.wait(10)
        return fake_items_for(fam, variants)

    monkeypatch.setattr(checkrun, "run_static", one_slow_compile)
    monkeypatch.setattr(runner, "machine_cores", lambda: 2)  # the builds' phase on a pool, as on the H200
    res = run_check(budget_s=1, catalog=[make_family("fam1"), make_family("fam2")], store=store,
                    items_for=build_while_it_compiles, wait_s=0)
    assert res.static_note == "one compile, not killed"
    assert res.exit_code == 0, res.summary_lines()


def test_a_failing_phase_kills_its_own_compilers_never_another_threads():
    """A phase that fails (or is interrupted) ends the compilers its own workers started and no
    other: the static part and the family builds compile at the same time in one process."""
    from hazards.engine.proctree import run_in_group
    from hazards.static.runner import Subject, run_subjects

    phase_began, other_compiling, other_rc = threading.Event(), threading.Event(), []
    own = []

    def another_threads_compile() -> None:
        assert phase_began.wait(10)
        threading.Timer(0.3, other_compiling.set).start()
        other_rc.append(run_in_group(["sleep", "1.5"], 30).returncode)

    def own_compile() -> list:
        own.append(run_in_group(["sleep", "60"], 90).returncode)
        return []

    def failing() -> list:
        phase_began.set()
        assert other_compiling.wait(10)
        raise UserError("this phase cannot be judged")

    other = threading.Thread(target=another_threads_compile)
    other.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(UserError, match="cannot be judged"):
            list(run_subjects([Subject("fails", failing), Subject("compiles", own_compile)], jobs=2))
    finally:
        other.join(30)
    assert time.monotonic() - t0 < 20 and own == [-9], own  # its own compiler was killed, not waited for
    assert other_rc == [0], "the phase killed a compile another thread started"


def _static_part_compiling(returncodes: list, compiling: threading.Event):
    """A stand-in for the static part's run: one compiler (a long sleep in its own group) whose
    return code lands in `returncodes`; `compiling` is set once it is surely running."""
    from hazards.engine.proctree import run_in_group

    def static_compile(paths, families=None, skip_tools=(), observer=None):
        threading.Timer(0.3, compiling.set).start()
        returncodes.append(run_in_group(["sleep", "60"], 90).returncode)
        return [], "killed"
    return static_compile


def test_abandoning_the_static_part_kills_its_compilers_only():
    """Ctrl-C or an error of the GPU part abandons the static part: its compilers are killed;
    another thread's compile and a supervised server (a GPU part's launch server) are not."""
    from hazards.engine.containment import CONTAINMENT
    from hazards.engine.proctree import run_in_group

    static_rc, other_rc = [], []
    compiling = threading.Event()

    static_compile = _static_part_compiling(static_rc, compiling)

    def others_compile() -> None:
        other_rc.append(run_in_group(["sleep", "1.5"], 30).returncode)

    server, _ = CONTAINMENT.spawn(["sleep", "30"], mark="a GPU part's server")
    other = threading.Thread(target=others_compile)
    try:
        import unittest.mock
        with unittest.mock.patch.object(checkrun, "run_static", static_compile):
            static = checkrun.StaticPart([], None, [], None)
            other.start()
            assert compiling.wait(10)
            static.abandon()
        assert static_rc == [-9], static_rc
        other.join(30)
        assert other_rc == [0], "abandoning the static part killed another thread's compile"
        assert server.poll() is None, "the supervised server was killed with the compilers"
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()
        CONTAINMENT.ended(server.pid)


def test_ctrl_c_while_the_check_waits_for_its_static_part_kills_the_static_compilers(monkeypatch):
    """A cold build cache makes the static part outlast the GPU part: the check then waits for
    it. Ctrl-C (or a stop signal) there must end its compilers too; they run in process groups
    of their own, which the terminal's SIGINT does not reach, so left alone they outlive the
    check."""
    import _thread

    static_rc, parts = [], []
    compiling = threading.Event()

    static_compile = _static_part_compiling(static_rc, compiling)

    class Recorded(checkrun.StaticPart):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            parts.append(self)

    def ctrl_c_once_compiling() -> None:
        if compiling.wait(10):
            _thread.interrupt_main()

    monkeypatch.setattr(checkrun, "run_static", static_compile)
    monkeypatch.setattr(checkrun, "StaticPart", Recorded)
    monkeypatch.setattr(checkrun, "_run_check_gpu", lambda *args: None)  # the GPU part has ended
    interrupter = threading.Thread(target=ctrl_c_once_compiling)
    interrupter.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_check(budget_s=1, catalog=[make_family()])
        deadline = time.monotonic() + 10  # not a join: an interrupted join can mark a live thread stopped
        while not static_rc and time.monotonic() < deadline:
            time.sleep(0.05)
        assert static_rc == [-9], "Ctrl-C left the static part's compiler running"
    finally:
        interrupter.join(10)
        for part in parts:  # a check that leaked it: end it here
            part._tools.kill()


def test_a_compiler_ended_by_a_signal_is_not_judged_not_bad_input():
    from hazards.engine.errors import EXIT_NOT_JUDGED
    from hazards.static.compile import run_tool

    with pytest.raises(UserError, match="ended by SIGKILL before it finished") as raised:
        run_tool(["sh", "-c", "kill -KILL $$"], "a compile")
    assert raised.value.exit_code == EXIT_NOT_JUDGED


def test_a_compiler_ended_by_a_signal_with_no_name_is_named_by_its_number():
    from hazards.static.compile import run_tool

    with pytest.raises(UserError, match=r"^a compile was ended by signal 40 before it finished "):
        run_tool(["sh", "-c", "kill -40 $$"], "a compile")  # SIGRTMIN + 6: Python has no name for it


def check_whose_static_compiles_run(command: str, store, monkeypatch):
    """A check of the fake family whose static checks run `sh -c command` as their
    compiler (each variant its own), through the catalog's per-variant judging."""
    import dataclasses

    from hazards import static_catalog
    from hazards.static.compile import run_tool
    from hazards.static_catalog import StaticFindings

    def compile_(params, **kw):
        run_tool(["sh", "-c", command], "fakefam-sm_90a")
        return []

    fam = dataclasses.replace(make_family(), static_check=compile_)

    def static_part(paths, families=None, skip_tools=(), observer=None):
        found = StaticFindings()
        for v in fam.variants:
            found.add(static_catalog._check_variant(fam, v))
        return found, "the catalog, stubbed"

    monkeypatch.setattr(checkrun, "run_static", static_part)
    return run_check(budget_s=1, catalog=[make_family()], store=store, items_for=fake_items_for, wait_s=0)


def assert_static_not_judged_and_gpu_verdicts_kept(res) -> None:
    """Exit 3 with every variant's static part not judged in --json, the GPU verdicts kept,
    and every static JUnit case an error."""
    assert res.exit_code == 3, res.summary_lines()
    assert [f.check for f in res.static_not_judged] == ["tool-killed"] * 3
    assert res.to_json()["static"]["not_judged"] == ["fakefam/reference", "fakefam/fixed", "fakefam/broken"]
    assert {v.status for v in res.verdicts} <= {"clean", "detected"} and res.verdicts
    static_cases = res.junit_suites()[0].cases
    assert static_cases and all(c.status == "error" for c in static_cases), static_cases


def test_a_check_whose_static_compile_was_killed_says_not_judged_and_keeps_the_gpu_verdicts(
        fake_gpus, store, monkeypatch):
    """Someone (the OOM killer, a kill) ends a static part's compiler: that variant's static
    checks could not look, so the check exits 3 with its --json and the GPU verdicts, never
    passes, and never ends as bad input (exit 2) with nothing printed."""
    res = check_whose_static_compiles_run("kill -KILL $$", store, monkeypatch)
    assert_static_not_judged_and_gpu_verdicts_kept(res)
    assert any(line.startswith("static NOT JUDGED fakefam/broken: ") and "SIGKILL" in line
               for line in res.summary_lines())


def test_a_variant_whose_static_compile_was_killed_says_which_variant_and_what_ended_it():
    import dataclasses

    from hazards import static_catalog
    from hazards.static.compile import run_tool

    def compile_(params, **kw):
        run_tool(["sh", "-c", "kill -KILL $$"], "fakefam-sm_90a")
        return []

    fam = dataclasses.replace(make_family(), static_check=compile_)
    [f] = static_catalog._check_variant(fam, fam.variants[-1])
    assert (f.check, f.subject) == ("tool-killed", "fakefam/broken")
    assert f.message == ("static checks of fakefam/broken could not run: fakefam-sm_90a was ended by SIGKILL "
                         "before it finished (the OOM killer, a kill or a stop; nothing judged): sh -c kill -KILL $$")


def test_a_compiler_whose_child_was_killed_is_not_judged_not_bad_input():
    """The OOM killer ends the largest process: nvcc's cicc or ptxas, not nvcc, which then
    exits 137 (128 + SIGKILL) with its shell's 'Killed' (as measured with nvcc 13.0). That is a
    tool ended by a signal, not a source that did not compile (bad input, exit 2)."""
    from hazards.engine.errors import EXIT_NOT_JUDGED
    from hazards.static.compile import run_tool

    with pytest.raises(UserError, match=r"a compile exited 137: a process it ran was ended by SIGKILL .*: "
                                         r"sh -c sh -c 'kill -KILL \$\$'; exit \$\?$") as raised:
        run_tool(["sh", "-c", NVCC_CHILD_KILLED], "a compile")
    assert raised.value.exit_code == EXIT_NOT_JUDGED


NVCC_CHILD_KILLED = "sh -c 'kill -KILL $$'; exit $?"  # a child of the compiler killed: exit 137, 'Killed'


def test_a_check_whose_static_compilers_child_was_killed_says_not_judged_and_keeps_the_gpu_verdicts(
        fake_gpus, store, monkeypatch):
    res = check_whose_static_compiles_run(NVCC_CHILD_KILLED, store, monkeypatch)
    assert_static_not_judged_and_gpu_verdicts_kept(res)
    # nothing is missing: the headline says what to do about a killed tool instead
    assert res.summary_lines()[-1] == ("check COULD NOT JUDGE 3 item(s) (listed above): a tool was killed before "
                                       "it finished (tool-killed): run the check again, with more memory free if "
                                       "the OOM killer ended it"), res.summary_lines()


def test_a_compile_error_exit_is_still_a_failed_compile():
    from hazards.engine.errors import EXIT_BAD_INPUT
    from hazards.static.compile import run_tool

    # nvcc's and nvdisasm's errors exit 1 (13.0), a shell's 'not found' 127; 168 = 128 + 40, a number
    # with no signal name: a failed compile, as before the names were looked up in one place
    for rc in (1, 2, 127, 168, 255):
        with pytest.raises(UserError, match=rf"a compile failed \(exit {rc}\)") as raised:
            run_tool(["sh", "-c", f"echo 'k.cu(3): error: nope' >&2; exit {rc}"], "a compile")
        assert raised.value.exit_code == EXIT_BAD_INPUT


def test_a_compiler_past_its_time_limit_is_not_judged_not_bad_input(monkeypatch):
    from hazards.engine.errors import EXIT_NOT_JUDGED
    from hazards.static.compile import run_tool

    monkeypatch.setattr(toolchain, "COMPILE_TIMEOUT_S", 0.5)
    with pytest.raises(UserError, match=r"a compile timed out after 0.5 s .*: sh -c sleep 30$") as raised:
        run_tool(["sh", "-c", "sleep 30"], "a compile")
    assert raised.value.exit_code == EXIT_NOT_JUDGED


def test_a_check_whose_static_compile_timed_out_says_not_judged_and_keeps_the_gpu_verdicts(
        fake_gpus, store, monkeypatch):
    """A static compiler that runs past its time limit could not judge its subject: the check
    exits 3 with its --json and the GPU verdicts, the finding names the command and the limit,
    and the static part does not end as bad input (exit 2) with nothing printed."""
    monkeypatch.setattr(toolchain, "COMPILE_TIMEOUT_S", 0.2)
    res = check_whose_static_compiles_run("sleep 30", store, monkeypatch)
    assert_static_not_judged_and_gpu_verdicts_kept(res)
    assert all("fakefam-sm_90a timed out after 0.2 s" in f.message and "sh -c sleep 30" in f.message
               for f in res.static_not_judged), res.static_not_judged


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
