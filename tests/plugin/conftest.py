"""Helpers for the plugin's tests: run an inner pytest session in a subprocess.

The inner session loads the plugin the way a user's would: through the installed
`pytest11` entry point, or with `-p hazards.pytest_plugin` when the package is not installed.
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import subprocess
import sys
import textwrap
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


def plugin_args() -> list[str]:
    """`-p hazards.pytest_plugin` unless the installed entry point already loads it."""
    autoload = not os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    eps = importlib.metadata.entry_points(group="pytest11")
    if autoload and any(ep.value == "hazards.pytest_plugin" for ep in eps):
        return []
    return ["-p", "hazards.pytest_plugin"]


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

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> Inner:
        full_env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
        full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        full_env["HZ_LEASE_DIR"] = str(self.lease_dir)
        full_env.update(self.env)
        full_env.update(env or {})
        argv = [sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider",
                "-o", "addopts=", "--rootdir", str(self.path), *args]
        proc = subprocess.run(argv, cwd=self.path, env=full_env, capture_output=True, text=True, timeout=timeout)
        return Inner(proc.returncode, proc.stdout, proc.stderr)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The GPU tests here use the plugin's fixtures and its `gpu` marker. When the plugin is
    # not loaded (package not installed, no `-p hazards.pytest_plugin`), skip them, saying so.
    pm = config.pluginmanager
    if pm.get_plugin("hazards") is not None or pm.get_plugin("hazards.pytest_plugin") is not None:
        return
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason="needs the hazards pytest plugin: install the package or pass -p hazards.pytest_plugin")
    for item in items:
        if item.get_closest_marker("gpu") and here in item.path.parents:
            item.add_marker(skip)


@pytest.fixture
def inner(tmp_path: Path) -> InnerPytest:
    """An empty folder to run an inner pytest session in (its own lease folder)."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return InnerPytest(tmp_path)
