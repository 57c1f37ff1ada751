"""Dependencies that respect the user's environment: a small core, extras
for what only some users need, no torch pin, a setup that never replaces an installed
torch, and a one-line install hint where an optional module is missing."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hazards.engine.extras import EXTRA_MODULES

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
# Distribution name -> the top-level module it is imported as, where the two differ.
IMPORT_NAME = {"nvidia-ml-py": "pynvml", "pytest-xdist": "xdist", "pytest-timeout": "pytest_timeout",
               "pytest-repeat": "pytest_repeat", "pytest-flakefinder": "pytest_flakefinder",
               "nvidia-cuda-nvdisasm": "nvidia", "nvidia-cuda-cuobjdump": "nvidia", "py-spy": None}


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower()


def _extra(name: str, seen: frozenset[str] = frozenset()) -> list[str]:
    """The requirements of one extra, with `gpu-hazards[...]` self-references expanded."""
    out = []
    for req in PROJECT["optional-dependencies"][name]:
        m = re.fullmatch(r"gpu-hazards\[(.*)\]", req)
        if m:
            for inner in m.group(1).split(","):
                if inner not in seen:
                    out += _extra(inner.strip(), seen | {name})
        else:
            out.append(req)
    return out


def _third_party_imports() -> set[str]:
    """Top-level names that the package's code (hazards/, stress/) imports, stdlib excluded."""
    names = set()
    for path in [*ROOT.joinpath("hazards").rglob("*.py"), *ROOT.joinpath("stress").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("hazards", "stress")}


def test_no_extra_pins_torch_so_an_installed_cuda_torch_satisfies_every_one():
    for extra in PROJECT["optional-dependencies"]:
        for req in _extra(extra):
            if _name(req) == "torch":
                assert "==" not in req and "<" not in req and ">=" in req, f"[{extra}] {req}: a lower bound only"
    assert "torch" in {_name(r) for r in _extra("dev")}  # the test suite still gets one


def test_the_core_is_only_what_the_core_code_imports():
    core = {_name(r) for r in PROJECT["dependencies"]}
    imported = _third_party_imports()
    for dist in core:
        module = IMPORT_NAME.get(dist, dist)
        assert module in imported, f"{dist} is a core dependency that no module imports"
        assert dist not in {"numpy", "matplotlib", "jinja2", "pytest", "pytest-xdist", "ray", "torch"}, dist
    # Every third-party import is declared: in the core, or in the extra that brings it.
    declared = {IMPORT_NAME.get(d, d) for d in core}
    for extra in PROJECT["optional-dependencies"]:
        declared |= {IMPORT_NAME.get(_name(r), _name(r)) for r in _extra(extra)}
    assert imported <= declared | {"pytest"}, f"imported but declared nowhere: {sorted(imported - declared)}"


def test_the_extras_module_table_matches_pyproject():
    for extra, modules in EXTRA_MODULES.items():
        brought = {IMPORT_NAME.get(_name(r), _name(r)) for r in _extra(extra)}
        assert set(modules) <= brought, f"[{extra}] brings {sorted(brought)}, the code expects {modules}"
    dev = {_name(r) for r in _extra("dev")}
    assert {"pytest-xdist", "xmlschema", "pytest-timeout", "pytest-repeat", "pytest-flakefinder", "matplotlib",
            "jinja2", "ray", "py-spy", "torch"} <= dev


def test_every_package_folder_is_in_the_wheel():
    declared = set(PYPROJECT["tool"]["setuptools"]["packages"])
    mapped = {v: k for k, v in PYPROJECT["tool"]["setuptools"]["package-dir"].items()}
    folders = {p.parent for top in ("hazards", "stress") for p in ROOT.joinpath(top).rglob("*.py")}
    for folder in folders:
        rel = folder.relative_to(ROOT).parts
        name = ".".join([*mapped[rel[0]].split("."), *rel[1:]]) if rel[0] in mapped else ".".join(rel)
        assert name in declared, f"{folder.relative_to(ROOT)} holds modules but {name} is not in [tool.setuptools] packages"


# Imports of these top-level names fail as if they were not installed (a finder placed
# first, so nothing of theirs is in sys.modules for other libraries to trip over).
BLOCKER = """
import importlib.abc, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NotInstalled())
"""


def _run_without(modules: list[str], argv: list[str], cwd: Path, prelude: str = "") -> subprocess.CompletedProcess:
    """`hazards ARGV` in a Python where `modules` cannot be imported (as if not installed)."""
    code = f"BLOCKED = {modules!r}\n{BLOCKER}\n{prelude}\nfrom hazards.cli import main\nsys.exit(main({argv!r}))\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HZ_STORE": str(cwd / "results.db")}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


OPTIONAL = sorted({m for modules in EXTRA_MODULES.values() for m in modules} | {"pytest", "_pytest"})


def test_the_core_cli_runs_without_any_extra(tmp_path):
    for argv in (["--version"], ["list"], ["run", "-n", "2", "--timeout", "60", "--", sys.executable, "-c", "pass"],
                 ["stats"]):
        res = _run_without(OPTIONAL, argv, tmp_path)
        assert res.returncode == 0, f"hazards {' '.join(argv)}: {res.stderr[-2000:]}"


def test_a_missing_reports_extra_is_one_line_naming_the_extra(tmp_path):
    made = _run_without([], ["run", "-n", "1", "--timeout", "60", "--", sys.executable, "-c", "pass"], tmp_path)
    assert made.returncode == 0, made.stderr
    res = _run_without(["matplotlib"], ["report"], tmp_path)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "matplotlib" in lines[0] and lines[0].endswith("pip install 'gpu-hazards[reports]'"), \
        res.stderr
    assert not (tmp_path / "reports").exists()  # nothing written before saying so


def test_an_optional_module_missing_deeper_down_is_still_one_line(tmp_path):
    # An ImportError of an extra's module that no check caught (here the report's own check
    # replaced by a bare import): the CLI's last resort names the extra, no traceback.
    made = _run_without([], ["run", "-n", "1", "--timeout", "60", "--", sys.executable, "-c", "pass"], tmp_path)
    assert made.returncode == 0, made.stderr
    prelude = ("import hazards.engine.report as report\n"
               "def bare_import():\n    import jinja2\n"
               "report.report_modules = bare_import\n")
    res = _run_without(["jinja2"], ["report"], tmp_path, prelude=prelude)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == ("hazards: error: hazards report needs jinja2, which is not installed: "
                                  "pip install 'gpu-hazards[reports]'"), res.stderr


# -- scripts/setup.sh, with a stand-in interpreter that logs what it is asked to do --------
FAKE_PYTHON = """#!/usr/bin/env bash
printf '%s\\n' "$*" >> "$FAKE_LOG"
case "$*" in
  "-c import torch; print(torch.__version__)")
    [ "$FAKE_TORCH" = 1 ] || exit 1; echo "2.11.0+cu130" ;;
  *"import setuptools"*) exit 0 ;;
  "-m pip install"*)
    if [ "$FAKE_ONLINE" != 1 ] && [[ "$*" == *torch* ]]; then echo "offline: no index" >&2; exit 1; fi ;;
esac
exit 0
"""


def _setup(tmp_path: Path, torch_installed: bool, online: bool) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "fake-python"
    fake.write_text(FAKE_PYTHON)
    for name in ("apt-get", "sudo"):  # in case clang-19 or chromium is missing: never install for real
        (bin_dir / name).write_text("#!/usr/bin/env bash\nexit 0\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    log = tmp_path / "log"
    env = {**os.environ, "HZ_SETUP_PYTHON": str(fake), "FAKE_LOG": str(log), "FAKE_TORCH": str(int(torch_installed)),
           "FAKE_ONLINE": str(int(online)), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    res = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], env=env, capture_output=True, text=True,
                         timeout=120)
    calls = log.read_text().splitlines() if log.exists() else []
    return res, [c for c in calls if c.startswith("-m pip")]


def test_setup_keeps_an_installed_torch_and_needs_no_network_for_it(tmp_path):
    res, pips = _setup(tmp_path, torch_installed=True, online=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "setup: torch 2.11.0+cu130 is installed: kept as it is" in res.stdout
    assert len(pips) == 1 and pips[0].startswith("-m pip install -q --no-build-isolation -c ") and \
        pips[0].endswith('-e .[dev]'), pips


def test_setup_installs_the_cpu_torch_only_when_none_is_importable(tmp_path):
    res, pips = _setup(tmp_path, torch_installed=False, online=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert pips[0] == "-m pip install -q torch==2.13.0", pips
    assert pips[1].endswith("-e .[dev]") and len(pips) == 2
