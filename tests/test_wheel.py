"""The wheel carries the kernels: a built wheel holds every kernel source, family table and
header users include, and an unpacked wheel, imported from a folder outside any checkout,
finds them through importlib.resources and builds into the per-user cache, never into the
current folder or the installed package.

Builds the wheel from a copy of the tracked sources (`pip wheel --no-deps
--no-build-isolation`: offline, and nothing is written into this checkout)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# One worker runs this module: the wheel (module-scoped) is built once per session, not per worker.
pytestmark = pytest.mark.xdist_group("wheel")
SHIPPED = ("pyproject.toml", "README.md", "hazards", "stress", "standalone")


def _tracked(root: Path) -> list[Path]:
    """The files a clean clone has (git ls-files), or every file but caches outside git."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", *SHIPPED], cwd=root, capture_output=True, text=True,
                             check=True).stdout
        return [Path(p) for p in out.split("\0") if p and (root / p).is_file()]
    except (OSError, subprocess.CalledProcessError):
        return [p.relative_to(root) for name in SHIPPED for p in
                ([root / name] if (root / name).is_file() else (root / name).rglob("*"))
                if p.is_file() and "__pycache__" not in p.parts]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src, dist = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    for rel in _tracked(ROOT):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "--no-index", "-w", str(dist), str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (whl,) = dist.glob("gpu_hazards-*.whl")
    return whl


@pytest.fixture(scope="module")
def site(wheel, tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    return site


def _run_installed(site: Path, code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """`python -c code` that imports the unpacked wheel, from `cwd`, with no checkout on the path."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HZ_BUILD_DIR")}
    environ.update(PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1", **env)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=environ, capture_output=True, text=True,
                          timeout=600)


def test_the_wheel_holds_every_kernel_source_table_and_user_header(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    kernels = [p for p in _tracked(ROOT) if p.parts[0] == "standalone"]
    assert kernels and {"standalone/include/hz_tripwire.h", "standalone/common/harness.h"} <= {
        p.as_posix() for p in kernels}
    missing = [p.as_posix() for p in kernels if "hazards/" + p.as_posix() not in names]
    assert not missing, f"not in the wheel: {missing}"
    tables = {p.parts[1] for p in kernels if p.name == "family.toml"}
    assert {"pipeline", "ordering", "deadlock", "barrier_layout"} <= tables
    assert "hazards/engine/toolchain.py" in names and "hazards/kernel_sources.py" in names


def test_an_unpacked_wheel_finds_its_kernels_outside_any_checkout(site, tmp_path):
    code = """
import json, hazards
from hazards import kernel_sources as sources
from hazards.families import all_families
fams = all_families()
print(json.dumps({"hazards": hazards.__file__, "standalone": str(sources.standalone_dir()),
                  "include": str(sources.include_dir()),
                  "tables": sorted(str(f.table_path) for f in fams),
                  "sources": sorted(str(f.source_path) for f in fams)}))
"""
    proc = _run_installed(site, code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    shipped = site / "hazards" / "standalone"
    assert Path(got["hazards"]).is_relative_to(site) and Path(got["standalone"]) == shipped
    assert (Path(got["include"]) / "hz_tripwire.h").is_file()
    assert got["tables"] and all(Path(t).is_relative_to(shipped) and Path(t).is_file() for t in got["tables"])
    assert all(Path(s).is_relative_to(shipped) for s in got["sources"])
    assert list(tmp_path.iterdir()) == []  # nothing written where it ran


def test_an_installed_static_build_lands_in_the_user_cache_not_the_current_folder(site, tmp_path):
    from hazards.engine.errors import ToolchainMissing
    from hazards.engine.toolchain import find_tool

    try:
        find_tool("clang")
    except ToolchainMissing as e:
        pytest.skip(str(e))
    before = sorted(p.relative_to(site) for p in site.rglob("*"))
    work, xdg = tmp_path / "work", tmp_path / "xdg"
    work.mkdir()
    code = """
from hazards.families import earlyclobber
from hazards.static.compile import compile_amdgcn
print(compile_amdgcn(earlyclobber.SOURCE, defines=earlyclobber.FAMILY.defines({"variant": "fixed"})).path)
"""
    proc = _run_installed(site, code, work, XDG_CACHE_HOME=str(xdg))
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).is_relative_to(xdg / "gpu-hazards" / "static")
    assert list(work.iterdir()) == []
    assert sorted(p.relative_to(site) for p in site.rglob("*")) == before  # the package is untouched


def test_an_installed_family_binary_embeds_its_table(site, tmp_path):
    from hazards.engine.errors import ToolchainMissing
    from hazards.engine.toolchain import find_tool

    try:
        find_tool("nvcc")
    except ToolchainMissing as e:
        pytest.skip(str(e))
    code = """
import json, subprocess
from hazards.families import get_family
from hazards.stress_family import family_binary
fam = get_family("pipeline")
exe = family_binary(fam)
listing = json.loads(subprocess.run([str(exe), "--list"], capture_output=True, text=True, check=True).stdout)
print(json.dumps({"exe": str(exe), "same": listing == {"hz_protocol": 1, **fam.harness_json()}}))
"""
    proc = _run_installed(site, code, tmp_path, HZ_BUILD_DIR=str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["same"] and Path(got["exe"]).is_relative_to(tmp_path / "cache" / "family")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]


def _contributor_venv(path: Path) -> dict[str, str]:
    """A venv like a contributor's, active (PATH, VIRTUAL_ENV), whose own site-packages holds a
    dependency the base interpreter also has (filelock, copied): a wheel check that ran against
    the base interpreter's packages instead of the active venv's would see another copy."""
    import filelock

    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(path)], check=True)
    purelib = subprocess.run([str(path / "bin" / "python"), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    shutil.copytree(Path(filelock.__file__).parent, Path(purelib) / "filelock")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HZ_BUILD_DIR", "HZ_STORE")}
    env.update(VIRTUAL_ENV=str(path), PATH=f"{path / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    return env


def test_the_installed_wheel_runs_the_cli_from_outside_the_checkout(wheel, tmp_path):
    """What .ci/run checks: the wheel installed --no-deps into a venv that sees the active
    interpreter's packages runs `hazards --version`, `list`, `check --static` and `run` from a
    folder outside the checkout, and every module of the checkout comes from the wheel. Run
    from inside a contributor's venv: the wheel must see what that venv installed."""
    from hazards.engine.errors import ToolchainMissing
    from hazards.engine.toolchain import find_tool

    try:
        find_tool("clang")  # `check --static` needs the static-check compilers
        find_tool("nvcc")
    except ToolchainMissing as e:
        pytest.skip(str(e))
    env = _contributor_venv(tmp_path / "contributor-venv")
    (tmp_path / "work").mkdir()
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "check_wheel.sh"), str(wheel)], cwd=tmp_path / "work", env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for step in ("the wheel runs against the active interpreter's dependencies", "hazards --version", "hazards list", "hazards check --static", "hazards run",
                 "every module of the checkout loads from the installed wheel", "passed"):
        assert f"check_wheel: {step}" in proc.stdout
    assert "check passed" in proc.stdout and "0 failures in 3 runs" in proc.stdout
