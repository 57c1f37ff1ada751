"""A perf-gate side at a git revision (`megakernel_layers:NAME@REV`): the name and revision
apart, the revision recorded as its full commit in the JSON and the table, every bad input
one line and exit 2 before any lease, the revision's sources extracted by content under the
build cache (never into the checkout), built from them (a real nvcc build: two revisions
with different sources, two binaries; one revision twice, one build), and a binary that
speaks another protocol a one-line error. On a temporary git repository holding a copy of
the kernel sources (c1 without the family, v2 = today's tree, v3 = v2 with a marker string)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from hazards import kernel_sources
from hazards.engine.errors import UserError
from hazards.gates import perf
from hazards.megakernel_layers import faithful as FA

REPO = Path(__file__).resolve().parents[2]
TODAY = kernel_sources.standalone_dir()
MARKER = b"hz-revision-test-marker-v3"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not os.environ.get("HZ_NVCC"),
                                reason="nvcc is not installed: a revision's megakernel_layers build cannot be checked")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> SimpleNamespace:
    """c1: only standalone/common; v1: the family's folder without its table; v2: today's
    standalone/; v3 (branch main): v2 plus a marker string compiled into the layered
    megakernel's binary."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: no history to make")
    root = tmp_path_factory.mktemp("history") / "repo"
    sa = root / "standalone"
    (sa).mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    shutil.copytree(TODAY / "common", sa / "common")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "c1: no family yet")
    c1 = git(root, "rev-parse", "HEAD")
    shutil.copytree(TODAY / "megakernel_layers", sa / "megakernel_layers", ignore=shutil.ignore_patterns("family.toml"))
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "v1: the family before its table")
    git(root, "tag", "v1")
    shutil.rmtree(sa)
    shutil.copytree(TODAY, sa, ignore=shutil.ignore_patterns("__pycache__"))
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "v2: today's sources")
    git(root, "tag", "v2")
    c2 = git(root, "rev-parse", "HEAD")
    main = sa / "megakernel_layers" / "megakernel_layers.cu"
    main.write_text(main.read_text() + f'\nextern "C" __attribute__((used)) const char hz_revision_marker[] = '
                                       f'"{MARKER.decode()}";\n')
    git(root, "commit", "-q", "-am", "v3: a marker")
    c3 = git(root, "rev-parse", "HEAD")
    return SimpleNamespace(root=root, standalone=sa, c1=c1, c2=c2, c3=c3)


@pytest.fixture
def sources(history, monkeypatch, tmp_path) -> SimpleNamespace:
    """The kernel sources are the temporary repository's; the build cache is this test's."""
    monkeypatch.setattr(kernel_sources, "standalone_dir", lambda: history.standalone)
    monkeypatch.setenv("HZ_BUILD_DIR", str(tmp_path / "cache"))
    return history


def test_a_side_is_split_into_name_and_revision_at_the_at():
    assert perf.split_revision("megakernel_layers:step_a@HEAD~2") == ("megakernel_layers:step_a", "HEAD~2")
    assert perf.split_revision("megakernel_layers:production@v1.2@{1}") == ("megakernel_layers:production",
                                                                            "v1.2@{1}")
    assert perf.split_revision("megakernel_layers:production") == ("megakernel_layers:production", None)
    assert perf.catalog_candidate("megakernel_layers:step_a@HEAD~2").name == "step_a"
    assert perf.catalog_of("megakernel_layers:step_a@HEAD~2") == "megakernel_layers:"
    assert perf.resolve_side("python3 x.py --user@host") == "python3 x.py --user@host"  # a command: as given


def test_a_side_at_a_revision_is_recorded_by_its_full_commit(sources):
    for rev, commit in (("v2", sources.c2), ("main", sources.c3), (sources.c3[:9], sources.c3), ("HEAD~1", sources.c2)):
        assert perf.resolve_side(f"megakernel_layers:depth1@{rev}") == f"megakernel_layers:depth1@{commit}"
    assert perf.resolve_side("megakernel_layers:depth1") == "megakernel_layers:depth1"
    item = perf.side_item(f"megakernel_layers:depth1@{sources.c2}", cwd=str(REPO), timeout=60, cos_min=0.99,
                          launches=3)
    tree = kernel_sources.revision_sources(sources.c2, "megakernel_layers").standalone
    assert item.params == {"candidate": "depth1", "cos_min": 0.99, "revision": sources.c2, "sources": str(tree)}
    assert item.variant == f"depth1@{sources.c2}"
    assert item.argv == perf.side_item("megakernel_layers:depth1", cwd=str(REPO), timeout=60, cos_min=0.99,
                                       launches=3).argv  # one warm server for both


@pytest.mark.parametrize("spec, words", [
    ("megakernel_layers:production@nosuch", "git does not know revision 'nosuch' in "),
    ("megakernel_layers:production@v1", "has no megakernel_layers/family.toml: it predates the family table"),
    ("megakernel_layers:production@C1", "has no standalone/megakernel_layers/ (the family's folder)"),
    ("megakernel_layers:production@", "nothing after '@'"),
    ("megakernel_layers:production@--help", "bad git revision '--help'"),
    ("megakernel_layers:nosuch@v2", "unknown layered-megakernel candidate 'nosuch' (known: production"),
    ("megakernel:baseline@v2", "a side at a git revision is built only for megakernel_layers:NAME@REV"),
])
def test_bad_revisions_are_one_line_errors(sources, spec, words):
    with pytest.raises(UserError) as err:
        perf.resolve_side(spec.replace("C1", sources.c1))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_sources_outside_a_git_checkout_or_without_git_are_one_line_errors(history, monkeypatch, tmp_path):
    loose = tmp_path / "unpacked" / "standalone"
    shutil.copytree(history.standalone / "common", loose / "common")
    monkeypatch.setattr(kernel_sources, "standalone_dir", lambda: loose)
    with pytest.raises(UserError, match=r"are not in a git checkout: a side at a git revision \(@HEAD\) needs"):
        perf.resolve_side("megakernel_layers:production@HEAD")
    monkeypatch.setattr(kernel_sources, "standalone_dir", lambda: history.standalone)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(UserError, match=r"needs git, and git is not installed"):
        perf.resolve_side("megakernel_layers:production@HEAD")


def test_the_cli_refuses_a_bad_revision_before_waiting_for_a_gpu(monkeypatch, tmp_path):
    from hazards.engine.leases import acquire

    monkeypatch.setenv("HZ_FAKE_GPUS", "0")
    monkeypatch.setenv("HZ_LEASE_DIR", str(tmp_path / "leases"))
    monkeypatch.setenv("HZ_STORE", str(tmp_path / "results.db"))
    # the project's own checkout (a git repository, none, or one another user owns: one line, exit 2)
    with acquire("0", "someone-else", lock_dir=os.environ["HZ_LEASE_DIR"]):
        for spec, words in (("megakernel_layers:production@no-such-revision-x", ("git does not know revision",
                                                                                   "not in a git checkout",
                                                                                   "git is not installed",
                                                                                   "dubious ownership")),
                            ("megakernel:improved@HEAD", ("built only for megakernel_layers:NAME@REV",))):
            r = subprocess.run([sys.executable, "-m", "hazards", "gate", "perf", "--baseline",
                                "megakernel_layers:production", "--candidate", spec, "--wait", "1s"],
                               cwd=REPO, capture_output=True, text=True, timeout=120)
            err = r.stderr.strip()
            assert r.returncode == 2 and any(w in err for w in words), err
            assert "someone-else" not in err and "Traceback" not in err and len(err.splitlines()) == 1, err


def test_a_revisions_sources_are_extracted_by_content_into_the_build_cache(sources, tmp_path):
    v2 = kernel_sources.revision_sources("v2", "megakernel_layers")
    again = kernel_sources.revision_sources(sources.c2, "megakernel_layers")
    v3 = kernel_sources.revision_sources("main", "megakernel_layers")
    assert v2 == again and v2.commit == sources.c2 and v3.commit == sources.c3
    assert v2.standalone.parent == tmp_path / "cache" / "revisions" and v3.standalone != v2.standalone
    tree = git(sources.root, "rev-parse", f"{sources.c2}:standalone")
    assert v2.standalone.name == f"standalone-{tree}"
    cu = "megakernel_layers/megakernel_layers.cu"
    assert (v2.standalone / cu).read_bytes() == (TODAY / cu).read_bytes()
    assert MARKER in (v3.standalone / cu).read_bytes() and MARKER not in (v2.standalone / cu).read_bytes()
    assert not list(v2.standalone.parent.glob(".*tmp*"))  # nothing half extracted
    # the user's checkout untouched: no change, no worktree, HEAD where it was
    assert git(sources.root, "status", "--porcelain") == ""
    assert len(git(sources.root, "worktree", "list").splitlines()) == 1
    assert git(sources.root, "rev-parse", "HEAD") == sources.c3


@needs_nvcc
def test_a_revision_from_before_the_profile_server_is_a_one_line_protocol_mismatch():
    # the project's own history: d12e448 added --profile-serve; its parent's binary prints its
    # usage and exits 2 (before touching a GPU), as any binary of another protocol may
    try:
        spec = perf.resolve_side("megakernel_layers:production@d12e448~1")
    except UserError as exc:  # an installed package, a shallow clone
        pytest.skip(f"the project's history is not here: {exc}")
    rev = perf.catalog_revision(spec)
    faithful = FA.Faithful()
    try:
        reply = FA.handle(faithful, {"id": 1, "launches": 1, "params": {
            "candidate": "production", "revision": rev.commit, "sources": str(rev.standalone)}})
    finally:
        faithful.close()
    assert reply["status"] == "bad_request", reply
    assert reply["message"] == (f"ProtocolMismatch: the binary built from revision {rev.commit[:12]} exited (code 2) "
                                "before its first MKL_PROFILE reply: it does not speak this checkout's "
                                "--profile-serve protocol (the faithful server is today's Python)")


@needs_nvcc
def test_a_side_at_a_revision_is_built_from_that_revisions_sources(sources):
    at = {rev: kernel_sources.revision_sources(rev, "megakernel_layers") for rev in ("v2", "main")}
    faithful = FA.Faithful()
    try:
        v2, v3 = faithful.binary((), at["v2"]), faithful.binary((), at["main"])
    finally:
        faithful.close()
    assert v2 != v3 and MARKER in v3.read_bytes() and MARKER not in v2.read_bytes()
    # the same sources are the same build: today's tree (v2's content) compiles nothing more
    from hazards.family import build_harness

    assert build_harness("megakernel_layers", defines={"HZ_PROFILER": 1}, standalone=TODAY) == v2
    built = v3.stat().st_mtime_ns
    again = FA.Faithful()  # a new server: the build cache, not the server's memory
    try:
        assert again.binary((), kernel_sources.revision_sources(sources.c3, "megakernel_layers")) == v3
        assert v3.stat().st_mtime_ns == built
    finally:
        again.close()


def fake_binary(tmp_path: Path, body: str) -> Path:
    exe = tmp_path / "old-binary"
    exe.write_text(f"#!{sys.executable}\nimport sys, time\n{body}\n")
    exe.chmod(0o755)
    return exe


def ask_at_a_revision(sources: Path) -> dict:
    """One request for production at a (made-up) revision, through a fresh Faithful."""
    faithful = FA.Faithful()
    try:
        return FA.handle(faithful, {"id": 1, "launches": 1,
                                    "params": {"candidate": "production", "revision": "ab" * 20,
                                               "sources": str(sources)}})
    finally:
        faithful.close()


@pytest.mark.parametrize("body, words", [
    ("print('usage: old-binary --once JSON'); sys.exit(2)",
     "exited (code 2) before its first MKL_PROFILE reply: it does not speak this checkout's --profile-serve"),
    ("sys.stdin.readline(); print('MKL_PROFILE {\"status\": \"ok\", \"launches\": 1}', flush=True); sys.stdin.read()",
     "reply lacks cos, rel_err, grid, capacity, task_names, kernel_us, layers"),
    ("sys.stdin.readline(); print('MKL_PROFILE v1 ok', flush=True); sys.stdin.read()", "not a JSON object"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGABRT)",  # an old parser's uncaught exception, or a crash
     "was ended by SIGABRT before its first MKL_PROFILE reply: it crashed, was killed, or it does not speak"),
])
def test_a_revisions_binary_that_speaks_another_protocol_is_a_one_line_bad_request(tmp_path, monkeypatch, body,
                                                                                    words):
    monkeypatch.setattr(FA.Faithful, "binary", lambda self, defines, revision=None, profiled=True: fake_binary(tmp_path, body))
    reply = ask_at_a_revision(tmp_path)
    assert reply["status"] == "bad_request" and words in reply["message"], reply
    assert reply["message"].startswith("ProtocolMismatch: ") and "\n" not in reply["message"]
    if "exited" in words:
        assert "the binary built from revision abababababab" in reply["message"]


def test_a_revisions_binary_gone_before_the_request_is_written_is_still_a_protocol_mismatch(tmp_path, monkeypatch):
    # Under load the old binary can exit before the request reaches its stdin: the write then
    # fails with a broken pipe, which must not replace the one-line mismatch by a traceback.
    monkeypatch.setattr(FA.Faithful, "binary", lambda self, defines, revision=None, profiled=True:
                        fake_binary(tmp_path, "print('usage: old-binary --once JSON'); sys.exit(2)"))
    started = FA.Faithful._server

    def exited_first(self, defines, revision=None, profiled=True):
        proc = started(self, defines, revision, profiled)
        proc.wait()
        return proc
    monkeypatch.setattr(FA.Faithful, "_server", exited_first)
    reply = ask_at_a_revision(tmp_path)
    assert reply["status"] == "bad_request" and reply["message"].startswith(
        "ProtocolMismatch: the binary built from revision abababababab exited (code 2)"), reply


def test_todays_binary_exiting_is_still_a_device_fault(tmp_path, monkeypatch):
    from hazards.engine.protocol_server import StopServing

    exe = fake_binary(tmp_path, "sys.exit(3)")
    monkeypatch.setattr(FA.Faithful, "binary", lambda self, defines, revision=None, profiled=True: exe)
    faithful = FA.Faithful()
    try:
        with pytest.raises(StopServing) as stop:
            FA.handle(faithful, {"id": 1, "launches": 1, "params": {"candidate": "production"}})
    finally:
        faithful.close()
    assert stop.value.reply["status"] == "fault" and "exited (code 3) before replying" in stop.value.reply["message"]


@pytest.mark.parametrize("fields", [{"revision": 7, "sources": "/x"}, {"revision": "ab" * 20}, {"sources": "/x"}])
def test_a_request_with_half_a_revision_is_a_bad_request(fields):
    reply = FA.handle(None, {"id": 1, "launches": 1, "params": {"candidate": "production", **fields}})
    assert reply["status"] == "bad_request" and "come together" in reply["message"]


def test_the_gate_names_each_side_by_its_full_commit_in_json_table_and_store(sources, monkeypatch, tmp_path):
    from hazards.engine.store import Store

    monkeypatch.setenv("HZ_FAKE_GPUS", "0")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(REPO / "tests")]))
    monkeypatch.setitem(perf.CATALOGS, "megakernel_layers:", "gates.fake_layers_server")
    store = tmp_path / "results.db"
    kw = dict(workers=[64], repeats=8, tasks=["worker"], lock_dir=str(tmp_path / "leases"), store_path=store,
              wait_s=5)
    with pytest.raises(UserError, match=r"the same candidate was given twice \(two revisions name one commit\)"):
        perf.run_gate("megakernel_layers:production", ["megakernel_layers:production@v2",
                                                       f"megakernel_layers:production@{sources.c2}"], **kw)
    extracted, extract = [], kernel_sources.revision_sources
    monkeypatch.setattr(kernel_sources, "revision_sources",
                        lambda rev, *a, **k: extracted.append(rev) or extract(rev, *a, **k))
    out = perf.run_gate("megakernel_layers:production@v2", ["megakernel_layers:production@main"], **kw)
    assert extracted == ["v2", "main"]  # each side's revision extracted once, as the user named it
    base, cand = f"megakernel_layers:production@{sources.c2}", f"megakernel_layers:production@{sources.c3}"
    assert out["verdict"] == "no-change" and out["baseline"] == base and out["candidate"] == cand
    b_side, c_side = out["baseline_side"], out["candidate_side"]
    assert b_side["revision"] == sources.c2 and b_side["given"] == "megakernel_layers:production@v2"
    assert c_side["revision"] == sources.c3 and c_side["candidate"]["name"] == "production"
    assert f"{cand} vs {base}: NO-CHANGE" in perf.format_report(out)
    json.dumps(out)
    with Store(store, create=False) as st:
        camp = st.campaign(out["campaign"])
        runs = list(st.iter_runs(camp.id))
    assert camp.spec["baseline"] == base and camp.spec["candidates"] == [cand]
    # the server was asked for each side's commit and its extracted tree, and answered for them
    asked = {r.result.variant: {(row["revision"], row["sources"]) for row in r.result.metrics["faithful"]}
             for r in runs}
    trees = {c: str(kernel_sources.revision_sources(c, "megakernel_layers").standalone) for c in (sources.c2, sources.c3)}
    assert asked == {f"production@{c}": {(c, trees[c])} for c in (sources.c2, sources.c3)}


KILLED_MID_EXTRACTION = """
import os, signal, sys, tarfile
from pathlib import Path
from hazards import kernel_sources

def one_member_then_killed(self, path, *args, **kwargs):
    self.extract(self.next(), path)
    os.kill(os.getpid(), signal.SIGKILL)

tarfile.TarFile.extractall = one_member_then_killed
kernel_sources.revision_sources(sys.argv[1], "megakernel_layers", standalone=Path(sys.argv[2]))
"""


def test_an_extraction_killed_half_way_is_redone_whole_and_leaves_nothing(sources, tmp_path):
    killed = subprocess.run([sys.executable, "-c", KILLED_MID_EXTRACTION, "v2", str(sources.standalone)],
                            env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr
    revisions = tmp_path / "cache" / "revisions"
    assert any(p.name.startswith(".standalone-") for p in revisions.iterdir())  # what the kill left
    v2 = kernel_sources.revision_sources("v2", "megakernel_layers")
    cu = "megakernel_layers/megakernel_layers.cu"
    assert (v2.standalone / cu).read_bytes() == (TODAY / cu).read_bytes()
    assert sorted(p.name for p in revisions.iterdir()) == [v2.standalone.name, v2.standalone.name + ".lock"]


def test_a_revision_that_cannot_be_extracted_is_one_line_and_leaves_nothing(sources, monkeypatch, tmp_path):
    import errno
    import tarfile

    def disk_full(self, path, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(tarfile.TarFile, "extractall", disk_full)
    with pytest.raises(UserError) as err:
        perf.resolve_side("megakernel_layers:production@v2")
    msg = str(err.value)
    assert msg.startswith(f"cannot extract revision 'v2' ({sources.c2[:12]}) into ") and "No space left" in msg, msg
    assert "\n" not in msg
    assert [p.name for p in (tmp_path / "cache" / "revisions").iterdir() if not p.name.endswith(".lock")] == []


def use_one_commit(sa: Path, message: str, monkeypatch, tmp_path: Path) -> None:
    """Commit everything in `sa`'s parent as a new one-commit repository, and read the kernel
    sources from `sa` with a build cache of the test's own."""
    root = sa.parent
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", message)
    monkeypatch.setattr(kernel_sources, "standalone_dir", lambda: sa)
    monkeypatch.setenv("HZ_BUILD_DIR", str(tmp_path / "cache"))


@pytest.mark.skipif(not hasattr(__import__("tarfile"), "data_filter"), reason="tarfile has no data filter (Python < 3.11.4)")
def test_a_revision_with_a_link_out_of_its_tree_is_one_line(history, monkeypatch, tmp_path):
    root = tmp_path / "linked"
    sa = root / "standalone"
    shutil.copytree(history.standalone / "megakernel_layers", sa / "megakernel_layers")
    (sa / "megakernel_layers" / "README.md").symlink_to("../../docs/megakernel-layers.md")  # out of standalone/
    use_one_commit(sa, "a link out of the kernel tree", monkeypatch, tmp_path)
    with pytest.raises(UserError) as err:
        perf.resolve_side("megakernel_layers:production@HEAD")
    assert str(err.value).startswith("cannot extract revision 'HEAD' (") and "\n" not in str(err.value), err.value


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed: no repository to make")
def test_sources_that_are_no_part_of_the_checkout_around_them_say_so(tmp_path, monkeypatch):
    # an installed package in a virtual environment inside the user's own repository: git
    # finds the user's repository, whose history holds no kernel sources of ours
    root = tmp_path / "users-project"
    loose = root / "venv" / "hazards" / "standalone"
    shutil.copytree(TODAY / "megakernel_layers", loose / "megakernel_layers")
    (root / ".gitignore").write_text("venv/\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "the user's project")
    monkeypatch.setattr(kernel_sources, "standalone_dir", lambda: loose)
    with pytest.raises(UserError) as err:
        perf.resolve_side("megakernel_layers:production@HEAD")
    assert f"the kernel sources {loose.resolve()} are no part of the git checkout {root.resolve()}" in str(err.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a repository another user owns needs root")
def test_a_checkout_git_will_not_read_says_gits_reason(history, monkeypatch, tmp_path):
    # root on a checkout its user owns (a container on a mounted folder): git refuses it as
    # of dubious ownership; "not in a git checkout" would send the user looking elsewhere
    root = tmp_path / "theirs"
    shutil.copytree(history.root, root, symlinks=True)
    for path in (root, *root.rglob("*")):
        os.lchown(path, 4321, 4321)
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setattr(kernel_sources, "standalone_dir", lambda: root / "standalone")
    with pytest.raises(UserError) as err:
        perf.resolve_side("megakernel_layers:production@HEAD")
    assert "dubious ownership" in str(err.value) and "\n" not in str(err.value), err.value


def test_each_side_keeps_its_own_spelling_when_two_revisions_name_one_commit(sources, monkeypatch, tmp_path):
    monkeypatch.setenv("HZ_FAKE_GPUS", "0")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(REPO / "tests")]))
    monkeypatch.setitem(perf.CATALOGS, "megakernel_layers:", "gates.fake_layers_server")
    out = perf.run_gate("megakernel_layers:production@v2", [f"megakernel_layers:production@{sources.c2[:10]}"],
                        workers=[64], repeats=8, tasks=["worker"], lock_dir=str(tmp_path / "leases"),
                        store_path=tmp_path / "results.db", wait_s=5)
    assert out["baseline_side"]["given"] == "megakernel_layers:production@v2"
    assert out["candidate_side"]["given"] == f"megakernel_layers:production@{sources.c2[:10]}"


def test_a_revisions_binary_whose_device_did_not_start_is_a_fault_not_a_mismatch(tmp_path, monkeypatch):
    # exit 3 is the harness's device fault (a failed device initialisation under --serve): it
    # says nothing of the protocol the binary speaks
    from hazards.engine.protocol_server import StopServing

    body, words = ("print('hz: device fault: cudaErrorNoDevice', file=sys.stderr); sys.exit(3)",
                   "exited (code 3) before replying")
    monkeypatch.setattr(FA.Faithful, "binary", lambda self, defines, revision=None, profiled=True: fake_binary(tmp_path, body))
    faithful = FA.Faithful()
    try:
        with pytest.raises(StopServing) as stop:
            FA.handle(faithful, {"id": 1, "launches": 1, "params": {"candidate": "production", "revision": "ab" * 20,
                                                                     "sources": str(tmp_path)}})
    finally:
        faithful.close()
    reply = stop.value.reply
    assert reply["status"] == "fault" and words in reply["message"], reply
    assert "revision abababababab" in reply["message"], reply


def test_a_candidates_define_the_revisions_kernel_never_reads_is_refused(history, monkeypatch, tmp_path):
    # step_a is MKL_CAMPAIGN_STEP=1: at a revision before that switch the build would be that
    # revision's default kernel, gated and recorded under step_a's name
    root = tmp_path / "before-the-switch"
    sa = root / "standalone"
    shutil.copytree(history.standalone, sa)
    kernel = [p for p in (sa / "megakernel_layers").rglob("*") if p.is_file() and p.suffix in (".cu", ".cuh", ".h")]
    today = {p: p.read_text() for p in kernel}
    for p in kernel:
        p.write_text(today[p].replace("MKL_CAMPAIGN_STEP", "MKL_OLD_STEP"))
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "before MKL_CAMPAIGN_STEP")
    before = git(root, "rev-parse", "HEAD")
    for p in kernel:
        p.write_text(today[p])
    git(root, "commit", "-q", "-am", "MKL_CAMPAIGN_STEP")
    monkeypatch.setattr(kernel_sources, "standalone_dir", lambda: sa)
    monkeypatch.setenv("HZ_BUILD_DIR", str(tmp_path / "cache"))
    with pytest.raises(UserError) as err:
        perf.resolve_side("megakernel_layers:step_a@HEAD~1")
    assert "never reads MKL_CAMPAIGN_STEP, which step_a sets" in str(err.value) and "\n" not in str(err.value)
    assert perf.resolve_side("megakernel_layers:step_a@HEAD").endswith("@" + git(root, "rev-parse", "HEAD"))
    # noop's define is read by no kernel, today's included (its point: a separate build); production sets none
    for name in ("noop", "production"):
        assert perf.resolve_side(f"megakernel_layers:{name}@HEAD~1") == f"megakernel_layers:{name}@{before}"


def test_a_candidates_define_the_revisions_kernel_defines_itself_unguarded_is_refused(history, monkeypatch,
                                                                                        tmp_path):
    # step_g_on_e sets MKL_ATTN_AHEAD=0; from step (f)'s commit until the candidate's, the kernel
    # defined MKL_ATTN_AHEAD itself (no #ifndef): -DMKL_ATTN_AHEAD=0 is then redefined by the source
    # (nvcc warns, builds), and step (g) on step (f) would be gated and recorded as step_g_on_e
    import re

    root = tmp_path / "unguarded"
    sa = root / "standalone"
    shutil.copytree(history.standalone, sa)
    header = sa / "megakernel_layers" / "mkl_kernel.cuh"
    today = header.read_text()
    unguarded, n = re.subn(r"#ifndef MKL_ATTN_AHEAD\n(#define MKL_ATTN_AHEAD[^\n]*\n)#endif\n", r"\1", today)
    assert n == 1
    header.write_text(unguarded)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "MKL_ATTN_AHEAD defined unguarded")
    before = git(root, "rev-parse", "HEAD")
    header.write_text(today)
    git(root, "commit", "-q", "-am", "MKL_ATTN_AHEAD overridable")
    monkeypatch.setattr(kernel_sources, "standalone_dir", lambda: sa)
    monkeypatch.setenv("HZ_BUILD_DIR", str(tmp_path / "cache"))
    with pytest.raises(UserError) as err:
        perf.resolve_side("megakernel_layers:step_g_on_e@HEAD~1")
    msg = str(err.value)
    assert "defines MKL_ATTN_AHEAD itself" in msg and "step_g_on_e" in msg and "\n" not in msg, msg
    assert "MKL_CAMPAIGN_STEP" not in msg.split("defines", 1)[1]  # guarded there: not blamed
    assert perf.resolve_side("megakernel_layers:step_g_on_e@HEAD").endswith("@" + git(root, "rev-parse", "HEAD"))
    # a candidate whose defines the revision guards is built there as before
    assert perf.resolve_side("megakernel_layers:step_g@HEAD~1") == f"megakernel_layers:step_g@{before}"


def test_every_define_a_catalog_candidate_sets_is_one_todays_kernel_lets_the_build_set():
    """The same gap without a revision: a define the kernel sets itself would be ignored by the
    candidate's build, which would then be the default kernel under the candidate's name."""
    from hazards.kernel_sources import family_dir

    for cand in FA.CANDIDATES.values():
        for name, _ in cand.defines:
            assert not perf._defines_unguarded(family_dir("megakernel_layers"), name), (cand.name, name)


@pytest.mark.parametrize("var, value", [("GIT_INDEX_FILE", "/elsewhere/.git/index"), ("GIT_DIR", ".git"),
                                        ("GIT_WORK_TREE", "/elsewhere")])
def test_a_gate_run_from_a_git_hook_reads_the_kernel_sources_own_repository(sources, monkeypatch, var, value):
    # git exports GIT_INDEX_FILE to a pre-commit hook, GIT_DIR and GIT_WORK_TREE to others: they
    # name the repository the hook runs for, not the one the kernel sources are in
    monkeypatch.setenv(var, value)
    assert perf.resolve_side("megakernel_layers:production@v2") == f"megakernel_layers:production@{sources.c2}"


def test_a_revision_whose_gitattributes_drop_a_source_from_the_archive_is_refused(history, monkeypatch, tmp_path):
    # `git archive` leaves out what `export-ignore` names: the tree extracted would not be the
    # revision's, and its build another binary (or a missing include) under the revision's name
    root = tmp_path / "attributes"
    sa = root / "standalone"
    shutil.copytree(history.standalone, sa)
    (sa / ".gitattributes").write_text("megakernel_layers/mkl_kernel.cuh export-ignore\n")
    use_one_commit(sa, "a release archive without the kernel", monkeypatch, tmp_path)
    with pytest.raises(UserError) as err:
        perf.resolve_side("megakernel_layers:production@HEAD")
    msg = str(err.value)
    assert "git archive left out 1 file of the revision (megakernel_layers/mkl_kernel.cuh" in msg and "\n" not in msg, msg
    assert [p.name for p in (tmp_path / "cache" / "revisions").iterdir() if not p.name.endswith(".lock")] == []
