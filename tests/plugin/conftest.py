"""Helpers for the plugin's tests: run an inner pytest session in a subprocess.

The inner session opts in the way a user's would, with `-p hazards` (the entry point when
the package is installed, the checkout's package otherwise). The tests of how the plugin
loads (installed or not, opted in or not) run in interpreters built here that see this
machine's packages but not its gpu-hazards install (`pythons`).
"""
from __future__ import annotations

import dataclasses
import os
import site
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from _pytest.pytester import RunResult

REPO = Path(__file__).resolve().parents[2]

# Variables an outer session (xdist worker, hz_timeout child, a lease) may have set that
# must not leak into the inner session.
_SCRUBBED = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID",
             "PYTEST_CURRENT_TEST", "PYTEST_ADDOPTS", "HZ_PYTEST_CHILD", "HZ_CHILD_REPORTS",
             "HZ_HYPOTHESIS_PROFILE", "HZ_FAKE_GPUS", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
             "HZ_LEASE_DIR", "HZ_LEASED",
             # hypothesis loads its own derandomized 'ci' profile when it sees one of these
             # (hypothesis._settings._CI_VARS); inner sessions must start from the real default
             "CI", "__TOX_ENVIRONMENT_VARIABLE_ORIGINAL_CI", "TF_BUILD", "bamboo.buildKey", "BUILDKITE",
             "CIRCLECI", "CIRRUS_CI", "CODEBUILD_BUILD_ID", "GITHUB_ACTIONS", "GITLAB_CI",
             "HEROKU_TEST_RUN_ID", "TEAMCITY_VERSION")


PLUGIN_ARGS = ("-p", "hazards")  # how the inner sessions opt in


@dataclasses.dataclass
class Inner:
    """The outcome of an inner pytest run."""

    ret: int
    stdout: str
    stderr: str

    @property
    def outcomes(self) -> dict[str, int]:
        return RunResult.parse_summary_nouns(self.stdout.splitlines())

    def lines_with(self, text: str) -> list[str]:
        return [line for line in self.stdout.splitlines() if text in line]


class InnerPytest:
    """Writes test files into a folder and runs `python -m pytest` there."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lease_dir = path / "leases"
        self.env: dict[str, str] = {}

    def write(self, name: str, text: str) -> Path:
        target = self.path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(text))
        return target

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120,
            python: str | Path = sys.executable, opt_in: bool = True) -> Inner:
        """`python -m pytest [-p hazards] ARGS` in this folder; `opt_in=False` leaves the
        plugin to whatever the project and ARGS say."""
        full_env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
        full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        full_env["HZ_LEASE_DIR"] = str(self.lease_dir)
        full_env.update(self.env)
        full_env.update(env or {})
        argv = [str(python), "-m", "pytest", *(PLUGIN_ARGS if opt_in else ()), "-p", "no:cacheprovider",
                "-o", "addopts=", "--rootdir", str(self.path), *args]
        proc = subprocess.run(argv, cwd=self.path, env=full_env, capture_output=True, text=True, timeout=timeout)
        return Inner(proc.returncode, proc.stdout, proc.stderr)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The GPU tests here use the plugin's fixtures and its marker. When the plugin is off
    # (addopts cleared, e.g. `-o addopts=`), skip them, saying so.
    from hazards.pytest_plugin.entry_point import is_active

    if is_active(config):
        return
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason="needs the hazards pytest plugin: pass -p hazards")
    for item in items:
        if item.get_closest_marker("gpu") and here in item.path.parents:
            item.add_marker(skip)


@pytest.fixture
def inner(tmp_path: Path) -> InnerPytest:
    """An empty folder to run an inner pytest session in (its own lease folder)."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return InnerPytest(tmp_path)


def _site_packages(prefix: Path) -> Path:
    return prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def _entry_points_txt() -> str:
    """The entry points pyproject.toml declares, as an installed dist-info lists them."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
    return "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
                   for group, eps in groups.items())


@pytest.fixture(scope="session")
def pythons(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Interpreters that see this machine's packages but not its own gpu-hazards install.

    "bare": the package is not installed (the checkout is importable through PYTHONPATH
    only, as in `PYTHONPATH=$PWD pytest -p hazards.pytest_plugin`). "installed": the same
    plus the package's metadata from pyproject.toml, so pytest finds its `pytest11` entry
    point as it would after `pip install gpu-hazards`. Each is a venv whose site-packages
    links every entry of this interpreter's site-packages except gpu-hazards' own.
    """
    root = tmp_path_factory.mktemp("pythons")
    ours = [Path(p) for p in site.getsitepackages()]
    out = {}
    for kind in ("bare", "installed"):
        prefix = root / kind
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True, timeout=120)
        target = _site_packages(prefix)
        for folder in ours:
            for entry in folder.iterdir() if folder.is_dir() else ():
                name = entry.name.lower()
                if "gpu_hazards" in name or name in ("hazards", "stress") or (target / entry.name).exists():
                    continue
                (target / entry.name).symlink_to(entry)
        if kind == "installed":
            dist = target / "gpu_hazards-0.1.0.dist-info"
            dist.mkdir()
            (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gpu-hazards\nVersion: 0.1.0\n")
            (dist / "entry_points.txt").write_text(_entry_points_txt())
            (target / "gpu_hazards.pth").write_text(str(REPO) + "\n")  # as an editable install does
        out[kind] = prefix / "bin" / "python"
    return out
