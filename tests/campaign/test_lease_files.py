"""Lease files are safe to share: one folder per machine for every user and
working directory, never a symbolic link followed, lockable by another user whatever the
creator's umask."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from hazards.engine.errors import UserError
from hazards.engine.leases import (DEFAULT_LOCK_DIR, LeaseUnavailable, acquire, lock_dir_path,
                                   read_lease_log)

REPO = Path(__file__).resolve().parents[2]

# Acquire (and keep, or release) GPU argv[1] in lease folder argv[2] under umask argv[3],
# as uid argv[4] (root drops to it after the imports); print what happened as JSON.
LEASER = textwrap.dedent("""
    import json, os, sys, time
    from hazards.engine.leases import acquire, LeaseUnavailable
    gpu, lock_dir, umask, uid, keep = sys.argv[1], sys.argv[2] or None, int(sys.argv[3], 8), int(sys.argv[4]), sys.argv[5]
    os.umask(umask)
    if uid >= 0 and uid != os.getuid():
        os.setgid(uid); os.setuid(uid)
    try:
        lease = acquire(gpu, f"uid {os.getuid()}", lock_dir=lock_dir)
    except LeaseUnavailable as e:
        print(json.dumps({"refused": str(e)}), flush=True); sys.exit(3)
    print(json.dumps({"acquired": str(lease.lock_path), "uid": os.getuid()}), flush=True)
    if keep == "keep":
        time.sleep(120)
    lease.release()
""")


def _leaser(gpu: str, lock_dir: str, *, umask: str = "077", uid: int = -1, keep: bool = False,
            cwd: Path = REPO, env: dict | None = None) -> subprocess.Popen:
    full = {**os.environ, "PYTHONPATH": str(REPO), "HZ_FAKE_GPUS": gpu, **(env or {})}
    full.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.Popen([sys.executable, "-c", LEASER, gpu, lock_dir, umask, str(uid),
                             "keep" if keep else "release"], cwd=cwd, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _first_line(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    return json.loads(line)


@pytest.fixture
def shared_base():
    """A folder every user can reach (tmp_path's parents are private to root)."""
    base = Path(tempfile.mkdtemp(prefix="hz-leases-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_the_default_lease_folder_is_one_per_machine_whatever_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("HZ_LEASE_DIR", raising=False)
    assert lock_dir_path() == DEFAULT_LOCK_DIR == Path("/tmp/gpu-hazards-leases")
    gpu = f"test{secrets.token_hex(4)}"  # a fake GPU of its own: real runs here are not disturbed
    env = {k: v for k, v in os.environ.items() if k != "HZ_LEASE_DIR"}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _leaser(gpu, "", keep=True, cwd=tmp_path / "a", env=env)
    try:
        assert "acquired" in _first_line(first)
        second = _leaser(gpu, "", cwd=tmp_path / "b", env=env)
        out, _ = second.communicate(timeout=60)
        assert second.returncode == 3 and "uid" in json.loads(out)["refused"]
    finally:
        first.kill()
        first.communicate()
        (DEFAULT_LOCK_DIR / f"gpu{gpu}.lock").unlink(missing_ok=True)


@pytest.mark.parametrize("name", ["gpu0.lock", "log.jsonl"])
def test_a_planted_symbolic_link_is_refused_and_its_target_untouched(tmp_path, monkeypatch, name):
    monkeypatch.setenv("HZ_FAKE_GPUS", "0")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    lock_dir = tmp_path / "leases"
    lock_dir.mkdir()
    (lock_dir / name).symlink_to(victim)
    with pytest.raises(UserError, match="symbolic link|Too many levels"):
        acquire("0", "me", lock_dir=lock_dir)
    assert victim.read_text() == "precious\n"
    assert read_lease_log(lock_dir) == []  # the log is not read through a link either


def test_a_symbolic_link_in_place_of_the_lease_folder_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HZ_FAKE_GPUS", "0")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "leases").symlink_to(elsewhere)
    with pytest.raises(UserError, match="lease folder .* is a symbolic link"):
        acquire("0", "me", lock_dir=tmp_path / "leases")
    assert list(elsewhere.iterdir()) == []


def test_files_made_under_umask_077_are_shared_by_mode(shared_base):
    proc = _leaser("0", str(shared_base / "leases"), umask="077")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert stat.S_IMODE((shared_base / "leases").stat().st_mode) == 0o1777
    for name in ("gpu0.lock", "log.jsonl"):
        assert stat.S_IMODE((shared_base / "leases" / name).stat().st_mode) == 0o666, name


@pytest.mark.skipif(os.geteuid() != 0, reason="changing uid needs root; the modes test covers this")
def test_a_lock_file_made_under_umask_077_is_lockable_by_another_user(shared_base):
    lock_dir = str(shared_base / "leases")
    made = _leaser("0", lock_dir, umask="077")  # root creates folder, lock file and log
    assert made.communicate(timeout=60)[0] and made.returncode == 0
    other = _leaser("0", lock_dir, umask="077", uid=65534)
    out, err = other.communicate(timeout=60)
    assert other.returncode == 0, err
    assert json.loads(out)["uid"] == 65534
    # and the exclusion holds across users: nobody is refused while root holds it
    holder = _leaser("0", lock_dir, umask="077", keep=True)
    try:
        assert "acquired" in _first_line(holder)
        refused = _leaser("0", lock_dir, umask="077", uid=65534)
        out, _ = refused.communicate(timeout=60)
        assert refused.returncode == 3 and "uid 0" in json.loads(out)["refused"]
    finally:
        holder.kill()
        holder.communicate()
    events = [(e["event"], e.get("holder")) for e in read_lease_log(lock_dir)]
    assert ("acquire", "uid 65534") in events and ("release", "uid 65534") in events


def test_a_lock_file_another_user_left_unwritable_is_still_locked_read_only(shared_base):
    lock_dir = shared_base / "leases"
    made = _leaser("0", str(lock_dir))
    assert made.communicate(timeout=60)[0] and made.returncode == 0
    (lock_dir / "gpu0.lock").chmod(0o444)
    as_other = 65534 if os.geteuid() == 0 else -1  # root would open a 0444 file for writing anyway
    holder = _leaser("0", str(lock_dir), uid=as_other, keep=True)
    try:
        assert "acquired" in _first_line(holder)
        refused = _leaser("0", str(lock_dir))
        out, _ = refused.communicate(timeout=60)
        assert refused.returncode == 3, out
    finally:
        holder.kill()
        holder.communicate()


def test_a_lease_folder_writable_by_others_without_the_sticky_bit_is_refused(tmp_path, monkeypatch):
    """Without the sticky bit anyone may delete a held lock file, and the next process then
    locks a new one: the same GPU handed to two holders. Refused, with the fix named."""
    monkeypatch.setenv("HZ_FAKE_GPUS", "0")
    lock_dir = tmp_path / "leases"
    lock_dir.mkdir()
    for mode in (0o777, 0o775):
        lock_dir.chmod(mode)
        with pytest.raises(UserError, match=r"writable by others without the sticky bit.*chmod \+t") as refused:
            acquire("0", "me", lock_dir=lock_dir)
        assert "\n" not in str(refused.value)
    assert list(lock_dir.iterdir()) == []
    lock_dir.chmod(0o1777)  # shared the intended way: accepted
    acquire("0", "me", lock_dir=lock_dir).release()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_lease_folder_owned_by_another_user_is_refused(shared_base, monkeypatch):
    """Its owner may delete any file in it, sticky or not: refused unless it is ours or root's."""
    monkeypatch.setenv("HZ_FAKE_GPUS", "0")
    lock_dir = shared_base / "leases"
    lock_dir.mkdir(mode=0o1777)
    lock_dir.chmod(0o1777)
    os.chown(lock_dir, 65534, 65534)
    with pytest.raises(UserError, match="owned by another user .*uid 65534.*HZ_LEASE_DIR"):
        acquire("0", "me", lock_dir=lock_dir)
    assert list(lock_dir.iterdir()) == []
    os.chown(lock_dir, 0, 0)  # root's, as a shared folder should be: accepted
    acquire("0", "me", lock_dir=lock_dir).release()
