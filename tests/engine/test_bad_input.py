"""Bad input through the real entry point: one line on stderr, non-zero exit, no traceback,
and the existing results store byte-identical."""
from __future__ import annotations

import os
import sqlite3
import sys
import time
import tomllib
from pathlib import Path

import pytest

from cli_helpers import hazards, sha256, tree
from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.store import Store


@pytest.fixture
def store_file(tmp_path):
    """A store with one campaign and two runs, closed (WAL checkpointed into the file)."""
    path = tmp_path / "results.db"
    with Store(path) as s:
        cid = s.create_campaign("run", {"argv": ["true"], "cwd": str(tmp_path), "n": 5, "timeout": 5.0,
                                        "until_fail": False, "name": None, "result_regex": None})
        for o in ("clean", "fault"):
            s.record_run(cid, RunResult(outcome=Outcome(o), reason=o, target="true", started_at=time.time()))
    return path


def assert_one_line_error(proc, exit_code=2, match=None):
    err_lines = proc.stderr.strip().splitlines()
    assert proc.returncode == exit_code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    assert len(err_lines) == 1, proc.stderr
    assert err_lines[0].startswith("hazards: error: ")
    if match:
        assert match in err_lines[0]


# The bad command lines and the words their error must contain: a data file.
BAD_RUNS = {name: (case["args"], case["message"])
            for name, case in tomllib.loads((Path(__file__).parent / "bad_runs.toml").read_text()).items()}


@pytest.mark.parametrize("case", sorted(BAD_RUNS))
def test_bad_input_is_one_line_and_leaves_the_store_byte_identical(tmp_path, store_file, case):
    args, match = BAD_RUNS[case]
    digest, files = sha256(store_file), tree(tmp_path)
    proc = hazards(*args, "--store", str(store_file), cwd=tmp_path) if "--" not in args else \
        hazards(*args[:args.index("--")], "--store", str(store_file), *args[args.index("--"):], cwd=tmp_path)
    assert_one_line_error(proc, match=match)
    assert sha256(store_file) == digest
    assert tree(tmp_path) == files


@pytest.mark.parametrize("store", ["/proc/hz-no-such/results.db", "/sys/hz-results.db",
                                   "{tmp}/afile/results.db", "{tmp}"])
def test_unwritable_store_path_fails_before_running_and_creates_nothing(tmp_path, store):
    (tmp_path / "afile").write_text("not a folder")
    marker = tmp_path / "ran"
    files = tree(tmp_path)
    proc = hazards("run", "-n", "3", "--store", store.format(tmp=tmp_path), "--",
                   "touch", str(marker), cwd=tmp_path)
    assert_one_line_error(proc)
    assert not marker.exists()  # the command never ran
    assert tree(tmp_path) == files  # no .hazards/ or stray database anywhere


def test_unwritable_store_from_env_is_refused_too(tmp_path):
    proc = hazards("run", "-n", "1", "--", "true", cwd=tmp_path, env={"HZ_STORE": "/proc/hz-x/r.db"})
    assert_one_line_error(proc)
    assert tree(tmp_path) == []


def test_stats_and_resume_without_a_store_create_nothing(tmp_path):
    proc = hazards("run", "-n", "1", "--", "/no/such/program", cwd=tmp_path)  # default store path
    assert_one_line_error(proc, match="command not found")
    for args in (["stats"], ["run", "--resume", "1"], ["compare", "--before-campaign", "1", "--after", "0/3"]):
        proc = hazards(*args, cwd=tmp_path)
        assert_one_line_error(proc, match="no results store")
    assert tree(tmp_path) == []


def test_store_with_unknown_schema_version_is_refused_untouched(tmp_path, store_file):
    db = sqlite3.connect(store_file)
    db.execute("PRAGMA user_version = 7")
    db.commit()
    db.close()
    digest = sha256(store_file)
    for args in (["run", "-n", "1", "--store", str(store_file), "--", "true"],
                 ["stats", "--store", str(store_file)]):
        proc = hazards(*args, cwd=tmp_path)
        assert_one_line_error(proc, match="schema version 7")
    assert sha256(store_file) == digest


def test_garbage_store_file_is_refused_untouched_with_the_store_exit_code(tmp_path):
    """A damaged store is not bad input: exit 4 (the store failed), one line naming the file
    and what to do; nothing written (2 before: it read as a usage error)."""
    bad = tmp_path / "results.db"
    bad.write_bytes(b"this is not sqlite\n" * 200)
    digest = sha256(bad)
    for args in (["run", "-n", "1", "--store", str(bad), "--", "true"], ["stats", "--store", str(bad)]):
        proc = hazards(*args, cwd=tmp_path)
        assert_one_line_error(proc, exit_code=4, match=f"results store {bad}: file is not a database")
        assert "the file is damaged: move it aside" in proc.stderr
    assert sha256(bad) == digest


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders; /proc covers it here")
def test_store_under_a_read_only_folder_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        proc = hazards("run", "-n", "1", "--store", str(ro / "r.db"), "--", "true", cwd=tmp_path)
        assert_one_line_error(proc, match="not writable")
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


NAMES_THAT_MATCH_NOTHING = {
    "static family": (["static", "--families", "nosuch"], "families with static checks: barrier_layout"),
    "static family without static checks": (["static", "--families", "pipeline"], "has no static checks"),
    "check family": (["check", "--families", "nosuch"], "known: barrier_layout"),
    "check skip": (["check", "--skip", "cpu"], "give gpu, static, nvcc"),
    "soak family": (["soak", "--families", "nosuch"], "known: barrier_layout"),
    "soak family that cannot run": (["soak", "--families", "earlyclobber"], "families with a launch server: "),
    "stress family": (["stress", "nosuch"], "known: barrier_layout"),
    "stress family that cannot run": (["stress", "earlyclobber"], "families with one: barrier_layout"),
    "stress variant": (["stress", "pipeline", "--variant", "nosuch"], "known: reference, fixed"),
    "repro family": (["repro", "--family", "nosuch"], "known: barrier_layout"),
    "repro variant": (["repro", "--family", "pipeline", "--variant", "nosuch"], "known: reference, fixed"),
    "repro parameter": (["repro", "--family", "pipeline", "--binary", "/bin/true", "--params", '{"nosuch": 1}'],
                        "has no parameter 'nosuch' (known: stages, "),
}


@pytest.mark.parametrize("case", sorted(NAMES_THAT_MATCH_NOTHING))
def test_a_name_that_matches_nothing_is_exit_2_with_the_valid_names(tmp_path, store_file, case):
    """Before: `static --families nosuch` exited 0 having checked nothing,
    `repro --params` ran with a parameter the family does not have, and the refusals of a
    family that cannot run did not say which can."""
    args, match = NAMES_THAT_MATCH_NOTHING[case]
    digest, files = sha256(store_file), tree(tmp_path)
    store = [] if args[0] == "static" else ["--store", str(store_file)]
    proc = hazards(*args, *store, cwd=tmp_path, env={"HZ_FAKE_GPUS": "0"})
    assert_one_line_error(proc, match=match)
    assert sha256(store_file) == digest and tree(tmp_path) == files


MISSING_INTERPRETERS = {"absolute": "#!/nonexistent/python9\nprint(1)\n",
                        "through env": "#!/usr/bin/env hz-no-such-python\nprint(1)\n"}


@pytest.mark.parametrize("case", sorted(MISSING_INTERPRETERS))
def test_a_script_whose_interpreter_is_missing_is_refused_before_any_campaign(tmp_path, store_file, case):
    """Before: the campaign row was created and every run ended in `error` (exit 3)."""
    script = tmp_path / "job.sh"
    script.write_text(MISSING_INTERPRETERS[case])
    script.chmod(0o755)
    digest = sha256(store_file)
    proc = hazards("run", "-n", "2", "--store", str(store_file), "--", "./job.sh", cwd=tmp_path)
    assert_one_line_error(proc, match="command ./job.sh: its interpreter ")
    assert sha256(store_file) == digest


BAD_TARGETS = {
    "infinite timeout": ("timeout = inf", "timeout must be a positive, finite number of seconds, got inf"),
    "nan handshake": ('kind = "server"\nhandshake_timeout = nan', "handshake_timeout must be a positive, finite"),
    "missing program": None,
    "missing interpreter": None,
    "server key on a command": ("launches = 10", "'launches' does not apply to a command target"),
    "zero launches": ('kind = "server"\nlaunches = 0', "launches must be at least 1"),
    "bad regex": ('result_regex = "(["', "result_regex is not a valid regular expression"),
}


@pytest.mark.parametrize("case", sorted(BAD_TARGETS))
def test_a_bad_targets_file_is_refused_before_any_campaign_row(tmp_path, store_file, case):
    """Before: an infinite timeout, a program that cannot start, a missing interpreter were
    accepted: a soak campaign was created and its runs errored (or hung forever)."""
    script = tmp_path / "job.sh"
    script.write_text("#!/nonexistent/bash\n")
    script.chmod(0o755)
    argv, extra, match = f'["{sys.executable}", "-c", "pass"]', "", None
    if case == "missing program":
        argv, match = '["/no/such/program"]', "command not found: /no/such/program"
    elif case == "missing interpreter":
        argv, match = '["./job.sh"]', "its interpreter /nonexistent/bash"
    else:
        extra, match = BAD_TARGETS[case]
    (tmp_path / "t.toml").write_text(f'[[target]]\nname = "t"\nargv = {argv}\n{extra}\n')
    digest, files = sha256(store_file), tree(tmp_path)
    proc = hazards("soak", "--no-families", "--targets", "t.toml", "--budget", "3s", "--store", str(store_file),
                   cwd=tmp_path, env={"HZ_FAKE_GPUS": "0", "HZ_LEASE_DIR": str(tmp_path / "leases")})
    assert_one_line_error(proc, match=match)
    assert "targets file t.toml, target #1 (t): " in proc.stderr
    assert sha256(store_file) == digest and tree(tmp_path) == files


def _foreign_elf() -> bytes:
    """The first bytes of a 64-bit little-endian ELF for a machine that is not this one."""
    import platform
    machine = 62 if platform.machine() != "x86_64" else 183  # x86-64, else AArch64
    return b"\x7fELF\x02\x01\x01" + bytes(9) + (2).to_bytes(2, "little") + machine.to_bytes(2, "little") + bytes(44)


@pytest.mark.parametrize("content, message", [
    (b"\x00\x13garbage that is no program" * 4, "exec format error"),
    (b"echo a script without its #! line\n", "exec format error"),
    (_foreign_elf(), "exec format error"),
])
@pytest.mark.parametrize("command", ["run", "repro"])
def test_a_program_the_kernel_cannot_execute_is_refused_before_any_campaign(tmp_path, store_file, content,
                                                                            message, command):
    """Exec format error (no ELF header for this machine, no #! line): exit 2 and one line
    before any campaign row, like a missing program (before: a campaign of error runs)."""
    from hazards.engine.targets.base import binfmt_handles
    if binfmt_handles(content):
        pytest.skip("binfmt_misc on this machine runs such a file")
    program = tmp_path / "prog"
    program.write_bytes(content)
    program.chmod(0o755)
    digest = sha256(store_file)
    proc = hazards(command, "-n", "1", "--store", str(store_file), "--", "./prog", cwd=tmp_path)
    assert_one_line_error(proc, match=message)
    assert sha256(store_file) == digest


@pytest.mark.parametrize("command", ["run", "soak"])
def test_resuming_a_campaign_whose_supervisor_still_runs_is_refused_up_front(tmp_path, command):
    """A second `--resume` while the campaign's supervisor lives would run beside it (and lost
    its run to a traceback): one line, exit 2, the store untouched."""
    from hazards.engine.outcome import HOST
    from hazards.engine.proctree import start_ticks
    from hazards.engine.recovery import boot_id

    path = tmp_path / "results.db"
    alive = {"pid": os.getpid(), "ticks": start_ticks(os.getpid()), "boot_id": boot_id(), "host": HOST}
    spec = {"argv": ["true"], "cwd": str(tmp_path), "n": 5, "timeout": 5.0, "until_fail": False, "name": None,
            "result_regex": None, "sessions": [{"started": time.time(), "supervisor": alive}]}
    with Store(path) as s:
        cid = s.create_campaign(command, spec)  # status 'running', its supervisor this test
    digest = sha256(path)
    proc = hazards(command, "--resume", str(cid), "--store", str(path), cwd=tmp_path)
    assert_one_line_error(proc, match=f"campaign {cid} is still running")
    assert f"pid {os.getpid()}" in proc.stderr
    assert sha256(path) == digest
