"""The kill loop on fake programs whose mutants are killed or survive as designed: a mutant the
test catches is killed with the run's evidence, one it cannot see survives with a bound, one that
breaks the build is did-not-build, one the lint flags is killed-static; nothing is written into
the user's folder; every mutant's runs are a campaign in the store."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from hazards.engine.store import Store

REPO = Path(__file__).resolve().parents[2]

KERNEL = textwrap.dedent('''\
    __global__ void k(int* data, int* flag) {
      data[0] = 42;
      __threadfence();
      atomicExch(flag, 1);
      __syncthreads();
    }
    int g(int* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    __global__ void l(const float4* p, float4* o) {
      float4 a, b;
      asm volatile("global_load_dwordx4 %0, %2, off\\n\\t"
                   "global_load_dwordx4 %1, %3, off\\n\\t"
                   : "=&v"(a), "=&v"(b) : "v"(p), "v"(p + 1));
      o[0] = a; o[1] = b;
    }
''')
# The "compiler": a relaxed order does not build; otherwise the source is the program.
BUILD = textwrap.dedent('''\
    import shutil, sys
    src, out = sys.argv[1], sys.argv[2]
    if "__ATOMIC_RELAXED" in open(src).read():
        sys.exit("build.py: error: relaxed order refused")
    shutil.copy(src, out + "/kernel.txt")
''')
# The "test": a missing fence is a wrong answer, a flag published before its data a hang.
CHECK = textwrap.dedent('''\
    import sys, time
    text = open(sys.argv[1]).read()
    if "__threadfence" not in text:
        print('HZ_RESULT {"status": "mismatch", "detail": "stale data"}')
        sys.exit(1)
    if text.index("atomicExch") < text.index("data[0] = 42"):
        time.sleep(600)
    print('HZ_RESULT {"status": "ok"}')
''')


def _tree_hash(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _mutate(project: Path, tmp_path: Path, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """`hazards mutate ARGS --store tmp_path/r.db` run in `project` without a GPU (`env`: more variables)."""
    return subprocess.run([sys.executable, "-m", "hazards", "mutate", *args, "--store", str(tmp_path / "r.db")],
                          cwd=project, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO), "HZ_FAKE_GPUS": "", **env})


def test_mutants_are_killed_or_survive_as_designed_and_the_users_files_stay(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "kernel.cu").write_text(KERNEL)
    (project / "build.py").write_text(BUILD)
    (project / "check.py").write_text(CHECK)
    before = _tree_hash(project)
    store = tmp_path / "r.db"
    res = _mutate(project, tmp_path, "kernel.cu", "--root", ".",
                  "--build", f"{sys.executable} build.py {{src}} {{out}}",
                  "--test", f"{sys.executable} {{dir}}/check.py {{out}}/kernel.txt",
                  "--timeout", "3", "-n", "4", "--budget", "5m", "--jobs", "2", "--json", timeout=600)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]  # survivors exist
    got = json.loads(res.stdout)
    fates = {m["id"]: m["fate"] for m in got["mutants"]}
    assert fates["remove-fence@3"] == "killed"
    assert fates["flag-before-data@4"] == "killed"
    assert fates["remove-barrier@5"] == "survived"
    assert fates["weaken-order@7"] == "did-not-build"
    assert fates["drop-earlyclobber@12"] == "killed-static"  # a's "=v" may take the second load's address
    by_id = {m["id"]: m for m in got["mutants"]}
    assert by_id["remove-fence@3"]["evidence"].startswith("mismatch")
    assert by_id["flag-before-data@4"]["evidence"].startswith("hang")
    assert "upper bound" in by_id["remove-barrier@5"]["bound"] and by_id["remove-barrier@5"]["runs"] == 4
    assert "asm-overlap" in by_id["drop-earlyclobber@12"]["evidence"] or "overlap" in by_id["drop-earlyclobber@12"]["evidence"]
    killed = sum(1 for f in fates.values() if f in ("killed", "killed-static"))
    judged = sum(1 for f in fates.values() if f in ("killed", "killed-static", "survived"))
    assert got["score"] == {"killed": killed, "judged": judged, "mutants": len(fates)}
    assert _tree_hash(project) == before  # the user's folder is untouched: no file written or changed
    with Store(store, create=False) as s:
        camps = [c for c in s.campaigns(kind="mutate") if not c.spec.get("baseline")]
        assert {c.spec["mutant"]["id"] for c in camps} == {i for i, f in fates.items() if f in ("killed", "survived")}
        assert all(c.spec["fate"] == fates[c.spec["mutant"]["id"]] for c in camps)


def test_a_test_that_fails_on_the_original_is_refused(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    (project / "kernel.cu").write_text("void f(){ __threadfence(); }\n")
    res = _mutate(project, tmp_path, "kernel.cu", "--test", "false", "--timeout", "5")
    assert res.returncode == 2 and "not clean on the unmutated sources" in res.stderr, res.stderr
    assert "exit code 1" in res.stderr  # the failing run's reason, so the user can see why
    assert sorted(p.name for p in project.iterdir()) == ["kernel.cu"]


def test_a_test_that_cannot_run_on_the_original_is_could_not_judge_not_bad_input(tmp_path):
    # Every run an error (here an import error; on a machine without a GPU, every family's run):
    # nothing judged the original, so the command could not judge (exit 3) and says why.
    project = tmp_path / "p"
    project.mkdir()
    (project / "kernel.cu").write_text("void f(){ __threadfence(); }\n")
    res = _mutate(project, tmp_path, "kernel.cu", "--test", f"{sys.executable} -c 'import no_such_module_here'",
                  "--timeout", "30")
    assert res.returncode == 3 and "could not judge" in res.stderr and "no_such_module_here" in res.stderr, res.stderr
    assert res.stderr.count("hazards: error:") == 1 and "Traceback" not in res.stderr
    assert sorted(p.name for p in project.iterdir()) == ["kernel.cu"]


def test_src_is_the_source_file_for_the_unmutated_run_as_for_every_mutant(tmp_path):
    # A test that reads {src} itself: on the original it was given the copy's folder, so the
    # baseline failed and the command refused a test that passes.
    project = tmp_path / "p"
    project.mkdir()
    (project / "kernel.cu").write_text("void f(int* d, int* g){ d[0] = 1; __threadfence(); g[0] = 1; }\n")
    res = _mutate(project, tmp_path, "kernel.cu", "--operators", "remove-fence",
                  "--test", "grep -q __threadfence {src}", "--timeout", "30", "-n", "2", "--json")
    assert res.returncode == 0, res.stderr
    assert [m["fate"] for m in json.loads(res.stdout)["mutants"]] == ["killed"]


def test_hypothesis_spends_the_budget_across_operators_first_and_writes_nothing(tmp_path, monkeypatch):
    # Mutants in source order come operator by operator; a budget for k of them must judge k
    # operators, the same order every time, and leave the current folder as it was.
    from hazards.mutate.kill import spending_order

    monkeypatch.chdir(tmp_path)
    items = [(op, f"k{i % 2}.cu", 10 * i) for op in ("fence", "order", "scope", "barrier") for i in range(5)]
    order = spending_order(items, lambda it: it)
    assert sorted(order) == sorted(items)
    assert {op for op, _, _ in order[:4]} == {"fence", "order", "scope", "barrier"}
    assert {f for _, f, _ in order[:2]} == {"k0.cu", "k1.cu"}  # the first two already span both files
    assert spending_order(items, lambda it: it) == order
    assert list(tmp_path.iterdir()) == []  # no .hypothesis folder in the user's folder


def test_a_survivors_bound_is_per_launch_when_the_test_reports_its_launches(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    (project / "kernel.cu").write_text("void f(int* d, int* g){ d[0] = 1; __threadfence(); g[0] = 1; }\n")
    (project / "check.py").write_text('print(\'HZ_RESULT {"status": "ok", "launches": 100, "mismatched": 0}\')\n')
    res = _mutate(project, tmp_path, "kernel.cu", "--operators", "remove-fence", "--test",
                  f"{sys.executable} {{dir}}/check.py", "--timeout", "30", "-n", "3", "--json")
    assert res.returncode == 1, res.stderr
    (m,) = json.loads(res.stdout)["mutants"]
    assert m["fate"] == "survived" and m["runs"] == 3 and m["launches"] == 300
    assert m["bound"].startswith("0 failures in 300 launches (3 runs): per-launch rate ≤ "), m["bound"]


def test_the_catalog_judge_runs_every_variant_in_one_server_and_stops_at_the_first_failure(tmp_path, capsys):
    from hazards.mutate.catalog import commands, judge

    server = tmp_path / "bin"
    server.write_text(f"#!/bin/sh\nexec {sys.executable} {REPO / 'tests' / 'fakes' / 'fake_server.py'} --harness\n")
    server.chmod(0o755)
    assert judge(str(server), 10, ["fixed", "fixed_pingpong"]) == 0
    clean = json.loads(capsys.readouterr().out.split("HZ_RESULT ", 1)[1])
    assert clean["status"] == "ok" and clean["launches"] == 20 and clean["mismatched"] == 0
    assert judge(str(server), 10, ["fixed", "broken_war", "fixed_pingpong"]) == 1
    bad = json.loads(capsys.readouterr().out.split("HZ_RESULT ", 1)[1])
    assert bad["variant"] == "broken_war" and bad["launches"] == 20 and bad["mismatched"] == 10
    _, test = commands("pipeline", [], 50)
    assert " judge {out}/bin 50 reference fixed fixed_pingpong" in test  # one process, every clean variant


def test_the_catalog_judge_calls_a_server_that_stopped_reading_a_fault_not_a_traceback(tmp_path, capsys):
    # A server whose stdin is gone after its handshake (it crashed, or closed it): the request's
    # write fails with a broken pipe, which must be the judge's fault result, exit 3.
    from hazards.mutate.catalog import judge

    server = tmp_path / "bin"
    server.write_text(f"#!{sys.executable}\nimport os, time\nos.close(0)\nprint('{{\"hello\": 1}}', flush=True)\n"
                      "time.sleep(0.5)\n")
    server.chmod(0o755)
    assert judge(str(server), 10, ["fixed"]) == 3
    out = json.loads(capsys.readouterr().out.split("HZ_RESULT ", 1)[1])
    assert out["status"] == "fault" and "stopped reading its requests before fixed" in out["message"], out
    import psutil  # the server it killed is reaped, not a zombie until the judge exits

    assert [c for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE] == []


def test_prebuild_builds_the_original_and_each_mutant_tree_once(monkeypatch):
    # A GPU round prebuilds a slow family beside its first rows; the build cache is keyed by
    # content, so the trees it builds must be exactly the ones the kill loop will build.
    from hazards.mutate import catalog

    built: list[str] = []
    monkeypatch.setattr(catalog, "_build", lambda family, tree, out: built.append(
        (Path(tree) / "pipeline" / "pipeline.cu").read_text()))
    assert catalog.prebuild("pipeline", [Path("pipeline.cu")], ["remove-barrier"], 2) == 0
    original = (REPO / "standalone" / "pipeline" / "pipeline.cu").read_text()
    from hazards.mutate.mutants import mutants_of

    _, mutants = mutants_of(REPO / "standalone" / "pipeline" / "pipeline.cu", operators=["remove-barrier"],
                            defines=catalog.build_defines("pipeline"))
    assert sorted(built) == sorted([original, *(m.apply(original) for m in mutants)]) and len(mutants) == 2


CHECK_PY = f"{sys.executable} {{dir}}/check.py {{src}}"


def _project_with_check(tmp_path: Path, kernel_line: str, check_body: str) -> Path:
    """A folder with kernel.cu (one line) and check.py, whose body sees the source as `text`."""
    project = tmp_path / "p"
    project.mkdir()
    (project / "kernel.cu").write_text(kernel_line + "\n")
    (project / "check.py").write_text("import sys, time\ntext = open(sys.argv[1]).read()\n" + check_body)
    return project


def test_two_identical_files_mutated_alike_are_each_judged_in_their_own_file(tmp_path):
    # A header vendored twice: the same mutated text in two files is two different trees, so
    # the second mutant must not reuse the first one's build (its own file left unmutated).
    project = tmp_path / "p"
    for sub in ("one", "two"):
        (project / sub).mkdir(parents=True)
        (project / sub / "k.cu").write_text("void f(int* d, int* g){ d[0] = 1; __threadfence(); g[0] = 1; }\n")
    res = _mutate(project, tmp_path, "one/k.cu", "two/k.cu", "--root", ".", "--operators", "remove-fence",
                  "--test", "grep -q __threadfence {dir}/two/k.cu", "--timeout", "30", "-n", "2", "--json")
    assert res.returncode == 1, res.stderr
    fates = {m["path"]: m["fate"] for m in json.loads(res.stdout)["mutants"]}
    assert fates == {"one/k.cu": "survived", "two/k.cu": "killed"}


def test_a_build_that_runs_past_its_timeout_leaves_no_process_behind(tmp_path, stray_sleep):
    from hazards.mutate.kill import Fate, KillConfig, _build

    cfg = KillConfig(root=tmp_path, test="true", build=stray_sleep.command, build_timeout_s=0.5)
    fate, why = _build(cfg, tmp_path, tmp_path / "k.cu")
    assert fate is Fate.TIMED_OUT_BUILD, why
    assert not stray_sleep.left(), "the build's compiler (here a sleep) outlived the timed-out build"


def test_a_mutant_that_slows_every_run_stops_when_the_budget_ends(tmp_path):
    # The original's runs are fast, so the mutant's share buys many runs; each of its runs is
    # slow (not a hang): they must stop at the budget, not run n times the slow run.
    project = _project_with_check(tmp_path, "void f(int* d, int* g){ d[0] = 1; __threadfence(); g[0] = 1; }",
                                  "if '__threadfence' not in text:\n    time.sleep(2)\n")
    res = _mutate(project, tmp_path, "kernel.cu", "--operators", "remove-fence", "--test", CHECK_PY,
                  "--timeout", "3", "-n", "50", "--budget", "8s", "--json")
    assert res.returncode in (1, 3), res.stderr
    (m,) = json.loads(res.stdout)["mutants"]
    # at most the budget plus one timeout (a run in flight at the budget's end is judged) of 2-s runs
    assert m["fate"] in ("survived", "not-run") and m["runs"] <= 6, m


def test_a_stop_signal_during_the_builds_ends_the_builds_in_flight_at_once(tmp_path, stray_sleep):
    # Worker threads run the builds and never see the main thread's interruption: the command
    # waited for every build in flight to finish (up to the build timeout) before it stopped.
    project = tmp_path / "p"
    project.mkdir()
    (project / "kernel.cu").write_text("".join(f"void f{i}(int* d){{ d[0] = 1; __threadfence(); d[1] = 1; }}\n"
                                               for i in range(4)))
    proc = subprocess.Popen([sys.executable, "-m", "hazards", "mutate", "kernel.cu", "--no-preprocess",
                             "--build", stray_sleep.command, "--test", "true", "--jobs", "2",
                             "--store", str(tmp_path / "r.db")], cwd=project, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), "HZ_FAKE_GPUS": ""})
    try:
        deadline = time.monotonic() + 120
        while not stray_sleep.running() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert stray_sleep.running(), "the builds never started"
        proc.terminate()
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=120)
        waited = time.monotonic() - t0
    finally:
        proc.kill()
        left = stray_sleep.left()
    assert waited < 20, f"stopped {waited:.0f} s after the signal (its builds sleep for hours)"
    assert proc.returncode != 0 and "Traceback" not in err, err
    assert not left, "a build outlived the command"


def test_a_root_with_a_named_pipe_and_a_socket_is_copied_without_them(tmp_path):
    # copytree raised on them (a traceback, exit 1: "a mutant survived") and left its scratch folder
    import socket

    project = tmp_path / "p"
    project.mkdir()
    (project / "kernel.cu").write_text("void f(int* d, int* g){ d[0] = 1; __threadfence(); g[0] = 1; }\n")
    os.mkfifo(project / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(project / "sock"))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    try:
        res = _mutate(project, tmp_path, "kernel.cu", "--operators", "remove-fence", "--test",
                      "grep -q __threadfence {src}", "--timeout", "30", "-n", "2", TMPDIR=str(scratch))
    finally:
        sock.close()
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert list(scratch.iterdir()) == []


def test_a_root_that_cannot_be_copied_is_one_line_and_leaves_no_scratch_folder(tmp_path, monkeypatch):
    import shutil

    import pytest

    from hazards.engine.errors import UserError
    from hazards.mutate.kill import Scratch

    (tmp_path / "secret.h").write_text("x\n")

    def unreadable(src, dst, **kw):  # the tests run as root, who reads a mode-000 file
        raise PermissionError(13, "Permission denied", src)

    monkeypatch.setattr(shutil, "copy2", unreadable)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    with pytest.raises(UserError, match="cannot copy --root .*secret.h: .*Permission denied"):
        Scratch(tmp_path)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("hazards-mutate-")]


def test_the_scratch_copies_are_made_from_one_listing_of_the_root(tmp_path, monkeypatch):
    # --root is listed once: its size is checked, and base and every mutant's copy are made,
    # from that one listing. Each folder of the root is scanned once; no copy is scanned.
    from hazards.mutate.kill import Scratch

    root = tmp_path / "p"
    (root / "sub" / "deep").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref\n")
    (root / "k.cu").write_text("original\n")
    (root / "sub" / "h.h").write_text("header\n")
    (root / "sub" / "deep" / "d.txt").write_text("deep\n")
    (root / "link.h").symlink_to("sub/h.h")
    (root / "sub_link").symlink_to("sub")
    scanned: list[str] = []
    real_scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda path=".": scanned.append(str(path)) or real_scandir(path))
    scratch = Scratch(root)
    try:
        copy = scratch.copy_with("m1", Path("k.cu"), "mutated\n")
        again = scratch.copy_with("m2", Path("sub/h.h"), "mutated header\n")
        assert sorted(scanned) == sorted(str(root.resolve() / rel) for rel in ("", "sub", "sub/deep"))
        for tree in (scratch.base, copy, again):
            assert sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.name != ".hazards-out") == \
                ["k.cu", "link.h", "sub", "sub/deep", "sub/deep/d.txt", "sub/h.h", "sub_link"]
            assert os.readlink(tree / "link.h") == "sub/h.h" and os.readlink(tree / "sub_link") == "sub"
        assert (copy / "k.cu").read_text() == "mutated\n" and (again / "k.cu").read_text() == "original\n"
        assert (copy / "sub" / "h.h").stat().st_ino == (scratch.base / "sub" / "h.h").stat().st_ino
        assert (again / "sub" / "h.h").read_text() == "mutated header\n"
        assert (root / "k.cu").read_text() == "original\n"
    finally:
        scratch.close()


def test_a_build_that_writes_into_a_file_of_the_root_in_place_is_refused(tmp_path):
    # `cp` onto a file the root already has writes into the inode every mutant's copy shares:
    # the parallel builds would read each other's output
    project = tmp_path / "p"
    project.mkdir()
    (project / "kernel.cu").write_text("void f(int* d, int* g){ d[0] = 1; __threadfence(); g[0] = 1; __syncthreads(); }\n")
    (project / "built.cu").write_text("stale\n")
    res = _mutate(project, tmp_path, "kernel.cu", "--build", "cp {src} {dir}/built.cu",
                  "--test", "grep -q __threadfence {dir}/built.cu", "--timeout", "30", "-n", "2")
    assert res.returncode == 2 and "wrote into built.cu in place" in res.stderr, res.stderr
    assert (project / "built.cu").read_text() == "stale\n"


def test_a_file_the_test_writes_in_place_is_restored_before_the_next_mutants_runs(tmp_path):
    # The test fails when a run before it left state.txt dirty, and a run without the fence
    # dirties it: only the fence mutant's own second run may see that, never another mutant.
    project = tmp_path / "p"
    project.mkdir()
    (project / "kernel.cu").write_text("void f(int* d, int* g){ d[0] = 1; __threadfence(); g[0] = 1;\n"
                                       "  __syncthreads(); d[1] = 2;\n  __syncthreads(); }\n")
    (project / "state.txt").write_text("clean\n")
    (project / "check.sh").write_text('grep -q dirty "$1/state.txt" && exit 1\n'
                                      'grep -q __threadfence "$2" || echo dirty > "$1/state.txt"\nexit 0\n')
    res = _mutate(project, tmp_path, "kernel.cu", "--operators", "remove-fence,remove-barrier",
                  "--test", "bash {dir}/check.sh {dir} {src}", "--timeout", "30", "-n", "2", "--json")
    fates = {m["id"]: m["fate"] for m in json.loads(res.stdout)["mutants"]}
    assert fates == {"remove-fence@1": "killed", "remove-barrier@2": "survived", "remove-barrier@3": "survived"}, \
        res.stderr
    assert (project / "state.txt").read_text() == "clean\n"


def test_a_root_too_big_to_copy_is_refused_before_any_copy(tmp_path, monkeypatch):
    # the default root is the first source's folder: a kernel in a home folder copied the home
    import pytest

    from hazards.engine.errors import UserError
    from hazards.mutate import kill

    root = tmp_path / "home"
    (root / ".git").mkdir(parents=True)
    (root / ".git" / "pack").write_bytes(b"x" * 4096)  # ignored: not counted
    (root / "k.cu").write_bytes(b"y" * 1000)
    monkeypatch.setattr(kill, "MAX_ROOT_BYTES", 2000)
    kill.Scratch(root).close()  # 1000 bytes to copy: fine
    (root / "cache.bin").write_bytes(b"z" * 1500)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr("tempfile.tempdir", None)
    with pytest.raises(UserError, match="give --root the folder the build needs"):
        kill.Scratch(root)
    assert list(scratch.iterdir()) == []


def test_mutants_left_unjudged_make_the_exit_could_not_judge_even_when_every_judged_one_was_killed(tmp_path):
    # One mutant killed, one whose every run is an error (not judged): "every judged mutant was
    # killed" is not "the test sees every missing synchronization", so the exit is 3, not 0,
    # and stderr names how many were left unjudged.
    project = _project_with_check(tmp_path, "void f(int* d){ d[0] = 1; __threadfence(); d[1] = 1; __syncthreads(); }",
                                  "if '__syncthreads' not in text:\n    import no_such_module_here\n"
                                  "sys.exit(0 if '__threadfence' in text else 1)\n")
    res = _mutate(project, tmp_path, "kernel.cu", "--no-preprocess", "--operators", "remove-fence,remove-barrier",
                  "--test", CHECK_PY, "--timeout", "30", "-n", "2", "--json")
    assert sorted(m["fate"] for m in json.loads(res.stdout)["mutants"]) == ["killed", "not-judged"], res.stdout
    assert res.returncode == 3 and "1 of 2 mutants not judged (1 not-judged)" in res.stderr, res.stderr
