"""stress/build.py and stress/toolchain.py: content-addressed cache, toolchain errors, build
failures (fake compiler), the per-user cache folder."""
from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from hazards.engine import build, toolchain
from hazards.engine.errors import ToolchainMissing, UserError
from hazards.engine.toolchain import SM90A

FAKE_NVCC = """#!/bin/sh
# A stand-in for nvcc: --version prints a release line; otherwise copy the source to -o,
# count invocations, and fail when the source contains BROKEN.
if [ "$1" = "--version" ]; then
  echo "Copyright (c) 2005-2099 NVIDIA Corporation"; echo "Built on $(date +%N)"
  echo "Cuda compilation tools, release 99.0, V99.0.1"; exit 0; fi
out=""; src=""
while [ $# -gt 0 ]; do
  case "$1" in -o) out="$2"; shift;; *.cu) src="$1";; esac; shift
done
echo x >> "$FAKE_NVCC_COUNT"
if grep -q BROKEN "$src"; then echo "$src(3): error: identifier BROKEN is undefined" >&2; exit 2; fi
cp "$src" "$out"
"""


@pytest.fixture
def fake_tree(tmp_path, monkeypatch):
    nvcc = tmp_path / "fake-nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    count = tmp_path / "count"
    count.write_text("")
    monkeypatch.setenv("HZ_NVCC", str(nvcc))
    monkeypatch.setenv("FAKE_NVCC_COUNT", str(count))
    toolchain.tool_version.cache_clear()
    root = tmp_path / "standalone"
    (root / "fam").mkdir(parents=True)
    (root / "common").mkdir()
    (root / "other").mkdir()
    (root / "common" / "h.h").write_text("// harness\n")
    (root / "other" / "x.c").write_text("// included from elsewhere\n")
    (root / "fam" / "fam.cu").write_text('#include "../common/h.h"\n#include "../other/x.c"\nint main(){}\n')
    return root, count, tmp_path / "cache"


def compiles(count: Path) -> int:
    return len(count.read_text().split())


def test_unchanged_sources_reuse_the_cached_binary(fake_tree):
    root, count, cache = fake_tree
    a = build.build_family(root, "fam", "fam", cache_dir=cache)
    b = build.build_family(root, "fam", "fam", cache_dir=cache)
    assert a == b and a.is_file() and os.access(a, os.X_OK) and compiles(count) == 1


@pytest.mark.parametrize("edit", ["fam/fam.cu", "common/h.h", "other/x.c"])
def test_changing_any_source_or_included_file_rebuilds(fake_tree, edit):
    root, count, cache = fake_tree
    a = build.build_family(root, "fam", "fam", cache_dir=cache)
    (root / edit).write_text((root / edit).read_text() + "// changed\n")
    b = build.build_family(root, "fam", "fam", cache_dir=cache)
    assert a != b and compiles(count) == 2


def test_defines_and_flags_are_part_of_the_key(fake_tree):
    root, count, cache = fake_tree
    a = build.build_family(root, "fam", "fam", cache_dir=cache)
    b = build.build_family(root, "fam", "fam", cache_dir=cache, defines={"HZ_X": True})
    c = build.build_family(root, "fam", "fam", cache_dir=cache, extra_flags=["-G"])
    assert len({a, b, c}) == 3 and compiles(count) == 3


def test_compile_error_is_one_line_with_the_log_path(fake_tree):
    root, count, cache = fake_tree
    (root / "fam" / "fam.cu").write_text("BROKEN\n")
    with pytest.raises(build.BuildFailed) as exc:
        build.build_family(root, "fam", "fam", cache_dir=cache)
    msg = str(exc.value)
    assert "identifier BROKEN is undefined" in msg and "build.log" in msg and "\n" not in msg


def test_missing_compiler_is_toolchain_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("HZ_NVCC", str(tmp_path / "no-such-nvcc"))
    with pytest.raises(ToolchainMissing):
        build.find_compiler(SM90A)
    monkeypatch.delenv("HZ_NVCC")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setattr(toolchain.os, "access", lambda *a: False)
    with pytest.raises(ToolchainMissing, match="nvcc not found .needed to build for sm_90a.: install the CUDA"):
        build.find_compiler(SM90A)
    with pytest.raises(ToolchainMissing, match="hipcc not found .*install ROCm"):
        build.find_compiler("gfx942")


def test_unknown_target_and_missing_source_are_user_errors(fake_tree):
    from hazards.engine.errors import UserError

    root, _, cache = fake_tree
    with pytest.raises(UserError, match="unknown build target"):
        build.build_family(root, "fam", "fam", cache_dir=cache, target="sm_1000")
    with pytest.raises(UserError, match="no kernel source"):
        build.build_family(root, "fam", "nope", cache_dir=cache)


def test_version_key_ignores_build_dates(fake_tree):
    toolchain.tool_version.cache_clear()  # the fake prints a different "Built on" line every call
    assert toolchain.tool_version(build.find_compiler(SM90A)) == "Cuda compilation tools, release 99.0, V99.0.1"


def test_the_cache_is_per_user_and_never_the_current_folder(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HZ_BUILD_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert toolchain.cache_dir("family") == tmp_path / "xdg" / "gpu-hazards" / "family"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert toolchain.cache_root() == tmp_path / "home" / ".cache" / "gpu-hazards"
    monkeypatch.setenv("HZ_BUILD_DIR", str(tmp_path / "mine"))
    assert toolchain.cache_dir("static") == tmp_path / "mine" / "static"
    assert not (tmp_path / "build").exists()
    assert not (tmp_path / ".hazards").exists()


def test_a_family_build_lands_in_the_per_user_cache(fake_tree, monkeypatch, tmp_path):
    root, count, _ = fake_tree
    monkeypatch.setenv("HZ_BUILD_DIR", str(tmp_path / "cache-root"))
    exe = build.build_family(root, "fam", "fam")
    assert exe.is_relative_to(tmp_path / "cache-root" / "family")


def test_every_tool_names_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    for name in ("CUDA_HOME", "CUDA_PATH", "HZ_NVDISASM", "HZ_CLANG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(toolchain.os, "access", lambda *a: False)
    monkeypatch.setattr(toolchain, "_nvidia_wheel_bins", lambda: [])
    toolchain.find_tool.cache_clear()
    try:
        with pytest.raises(ToolchainMissing, match="nvdisasm not found: pip install 'nvidia-cuda-nvdisasm"):
            toolchain.find_tool("nvdisasm")
        with pytest.raises(ToolchainMissing, match="clang-19 with the AMDGPU backend not found: apt-get install clang-19"):
            toolchain.find_tool("clang")
        with pytest.raises(ToolchainMissing, match="clang for gfx950 not found: apt-get install clang-22 "
                                                   r"\(Debian 12: bookworm-security"):
            toolchain.find_tool("clang", arch="gfx950")
    finally:
        toolchain.find_tool.cache_clear()


def test_an_llvm_tool_of_the_clangs_release_comes_first(monkeypatch, tmp_path):
    # llvm-as assembles a device library for the clang it serves: the same release (llvm-as-19
    # for clang-19), found beside that clang, before whatever `llvm-as` is first on PATH
    beside, path = tmp_path / "llvm19", tmp_path / "bin"
    for folder, names in ((beside, ("clang-19", "llvm-as-19")), (path, ("llvm-as", "llvm-dis"))):
        folder.mkdir()
        for n in names:
            (folder / n).write_text("#!/bin/sh\n")
            (folder / n).chmod(0o755)
    monkeypatch.setenv("PATH", str(path))
    for name in ("HZ_LLVM_AS", "HZ_LLVM_DIS"):
        monkeypatch.delenv(name, raising=False)
    toolchain.find_tool.cache_clear()
    try:
        assert toolchain.find_tool("llvm-as", like=str(beside / "clang-19")) == str(beside / "llvm-as-19")
        assert toolchain.find_tool("llvm-dis", like=str(beside / "clang-19")) == str(path / "llvm-dis")
        monkeypatch.setenv("PATH", str(tmp_path))
        with pytest.raises(ToolchainMissing, match="llvm-dis not found .*apt-get install llvm-19, or set HZ_LLVM_DIS"):
            toolchain.find_tool("llvm-dis", "to build a ROCm device library", like=str(beside / "clang-19"))
    finally:
        toolchain.find_tool.cache_clear()


def test_compute_sanitizer_is_found_like_every_tool_and_names_no_skip(monkeypatch, tmp_path):
    # `stress --sanitizer` has no --skip: the one-line error says how to install it, nothing more
    from hazards.cli.options import parse_skip
    from hazards.engine.targets.sanitizer import find_sanitizer

    monkeypatch.setenv("PATH", str(tmp_path))
    for name in ("CUDA_HOME", "CUDA_PATH", "HZ_COMPUTE_SANITIZER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(toolchain.os, "access", lambda *a: False)
    toolchain.find_tool.cache_clear()
    try:
        with pytest.raises(ToolchainMissing) as e:
            find_sanitizer()
        assert str(e.value) == ("compute-sanitizer not found (needed for --sanitizer): install the CUDA toolkit "
                                "(compute-sanitizer), or set HZ_COMPUTE_SANITIZER")
        with pytest.raises(UserError, match="--skip compute-sanitizer: nothing of that name"):
            parse_skip(["compute-sanitizer"])
    finally:
        toolchain.find_tool.cache_clear()


def test_the_sm90a_flags_are_spelled_once():
    assert toolchain.nvcc_arch_flags(SM90A) == ("-gencode=arch=compute_90a,code=sm_90a",)
    assert build.TARGETS[SM90A].flags[-1] == "-gencode=arch=compute_90a,code=sm_90a"
    assert toolchain.amd_arch_flag("gfx942") == "--offload-arch=gfx942"


def test_a_clang_that_cannot_target_gfx950_is_refused_for_gfx950_by_name(monkeypatch):
    import shutil

    clang19 = shutil.which("clang-19")
    if clang19 is None:
        pytest.skip("clang-19 is not installed")
    monkeypatch.setenv("HZ_CLANG", clang19)
    toolchain.find_tool.cache_clear()
    try:
        assert toolchain.find_tool("clang", arch="gfx942") == clang19
        with pytest.raises(ToolchainMissing, match="HZ_CLANG=.*clang-19 cannot compile for gfx950"):
            toolchain.find_tool("clang", arch="gfx950")
        with pytest.raises(UserError, match="not an AMD architecture"):
            toolchain.find_tool("clang", arch=SM90A)
    finally:
        toolchain.find_tool.cache_clear()


def test_a_killed_producers_half_made_output_is_removed_not_reused(tmp_path):
    # A producer SIGKILLed mid-way leaves its tmp (a file or a folder) beside `out`; the next
    # producer holds the same lock, so such a tmp is stale: it goes, and one under this
    # process's own pid (pids repeat in containers) must not stop the produce with a traceback.
    # A young one of a pid that lives may be another host's producer (a shared file system
    # whose locks it does not see): it stays until older than any produce (pid 1's here).
    out = tmp_path / "tree-abc"
    dead = subprocess.Popen(["true"])
    dead.wait()
    alive = os.getppid()
    for pid in (os.getpid(), dead.pid, alive, 1):
        half = tmp_path / f".tree-abc.{pid}.tmp"
        half.mkdir()
        (half / "half.cu").write_text("half")
    long_ago = time.time() - 2 * toolchain.COMPILE_TIMEOUT_S - 60
    os.utime(tmp_path / ".tree-abc.1.tmp", (long_ago, long_ago))
    other = tmp_path / ".tree-abc.5.tmp.cubin"  # another output's tmp (tree-abc.cubin): not ours
    other.write_text("someone else's")

    def produce(tmp: Path) -> None:
        tmp.mkdir()
        (tmp / "whole.cu").write_text("whole")

    assert toolchain.cached_output(out, produce) == out
    assert sorted(p.name for p in out.iterdir()) == ["whole.cu"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".tree-abc.5.tmp.cubin", f".tree-abc.{alive}.tmp",
                                                                 "tree-abc", "tree-abc.lock"])
