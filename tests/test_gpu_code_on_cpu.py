"""GPU-side code, checked on a CPU so that a rename breaks CI and not the GPU run.

A rename (`reference.SEED_CFG` -> `CONTRACT_CFG`) left the faithful check reading a name
that no longer existed; only the H200 saw it, because every CPU test stopped at "no GPU"
before the line ran. Here, without a GPU: every GPU-side module imports (the ragged-decode
and layered megakernels, the gates, the bench scripts); every module attribute and every
`from hazards... import NAME` they, the GPU tests and ci/gpu's scripts spell resolves,
inside functions too;
and the host-side logic (argument parsing, configuration building, the faithful checks' setup)
runs up to its first device call.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import pkgutil
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.script_module import load_script

REPO = Path(__file__).resolve().parents[1]
GPU_PACKAGES = ("hazards.ragged_decode", "hazards.megakernel_layers", "hazards.gates")
BENCH = sorted(p for p in (REPO / "bench").glob("*.py") if '__name__ == "__main__"' in p.read_text())
CI_SCRIPTS = sorted((REPO / "ci" / "gpu").glob("*.py"))  # run on the GPU machine only
GPU_TESTS = sorted(p for p in (REPO / "tests").rglob("test_*.py")
                   if "mark.gpu" in p.read_text() and p != Path(__file__).resolve())


def _gpu_modules() -> list[str]:
    names = []
    for package in GPU_PACKAGES:
        pkg = importlib.import_module(package)
        names.append(package)
        names += [m.name for m in pkgutil.walk_packages(pkg.__path__, package + ".")]
    return sorted(names)


GPU_MODULES = _gpu_modules()


def _module_path(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, name
    return Path(spec.origin)


@pytest.mark.parametrize("name", GPU_MODULES)
def test_every_gpu_side_module_imports_without_a_gpu(name):
    importlib.import_module(name)


@pytest.mark.parametrize("path", BENCH, ids=lambda p: p.name)
def test_every_bench_script_imports_and_parses_its_arguments_without_a_gpu(path, monkeypatch, capsys):
    module = load_script(path, f"bench_{path.stem}")
    main = getattr(module, "main", None)
    if main is None or "argparse" not in path.read_text():
        return  # nothing to parse: importing it was the check
    monkeypatch.setattr(sys, "argv", [str(path), "--help"])
    with pytest.raises(SystemExit) as done:
        main() if main.__code__.co_argcount == 0 else main(["--help"])
    assert done.value.code == 0, capsys.readouterr()
    assert "usage:" in capsys.readouterr().out


def _is_ours(module: str) -> bool:
    return module == "hazards" or module.startswith("hazards.")


def _resolve(module: str, name: str) -> str | None:
    """The module `module.name` if it is one, else None (an attribute, or nothing)."""
    try:
        return importlib.import_module(f"{module}.{name}").__name__
    except ModuleNotFoundError:
        return None


def _package_of(path: Path) -> str | None:
    """The package a repository file's relative imports start from (stress/ is hazards.engine)."""
    rel = path.resolve().relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "stress":
        parts = ["hazards", "engine", *parts[1:]]
    elif parts[0] != "hazards":
        return None
    return ".".join(parts if parts[-1] == "__init__" and parts.pop() else parts[:-1])


def _absolute(node: ast.ImportFrom, path: Path) -> str | None:
    """The module an ImportFrom names, relative ones resolved against `path`'s package."""
    if node.level == 0:
        return node.module
    package = _package_of(path)
    if package is None:
        return None
    base = package.split(".")
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def unresolved(path: Path) -> list[str]:
    """Every `from hazards.X import NAME` (relative ones too) and `module.NAME` (for a name
    bound to one of our modules by an import, anywhere in the file, and never assigned)
    whose NAME does not exist."""
    tree = ast.parse(path.read_text(), str(path))
    assigned = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    assigned |= {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}
    bound: dict[str, set[str]] = {}  # local name -> the modules imports bind it to
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_ours(alias.name) and alias.asname:
                    bound.setdefault(alias.asname, set()).add(alias.name)
        elif isinstance(node, ast.ImportFrom) and _is_ours(module := _absolute(node, path) or ""):
            source = importlib.import_module(module)
            for alias in node.names:
                sub = _resolve(module, alias.name) if alias.name != "*" else None
                if sub is not None:
                    bound.setdefault(alias.asname or alias.name, set()).add(sub)
                elif alias.name != "*" and not hasattr(source, alias.name):
                    missing.append(f"{path.name}:{node.lineno}: from {module} import {alias.name}")
    modules = {name: next(iter(mods)) for name, mods in bound.items() if len(mods) == 1}  # one meaning only
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and isinstance(node.ctx, ast.Load):
            name = node.value.id
            if name in modules and name not in assigned:
                module = importlib.import_module(modules[name])
                if not hasattr(module, node.attr) and _resolve(modules[name], node.attr) is None:
                    missing.append(f"{path.name}:{node.lineno}: {name}.{node.attr} ({modules[name]})")
    return missing


@pytest.mark.parametrize("path", [_module_path(m) for m in GPU_MODULES] + BENCH + CI_SCRIPTS + GPU_TESTS,
                         ids=lambda p: str(p.relative_to(REPO)))
def test_every_name_gpu_code_takes_from_our_modules_exists(path):
    assert unresolved(path) == []


def test_every_name_the_rest_of_the_package_takes_from_our_modules_exists():
    """The same over hazards/ and the engine (stress/, relative imports resolved): code
    that only a GPU, a missing tool or a rare error path reaches is checked here too."""
    paths = sorted(p for root in ("hazards", "stress") for p in (REPO / root).rglob("*.py"))
    assert [m for p in paths for m in unresolved(p)] == []


def test_the_resolver_finds_a_renamed_constant(tmp_path):
    """The check above can fail: the very line that broke on the H200 is found."""
    bad = tmp_path / "faithful.py"
    bad.write_text("def f():\n    from hazards.ragged_decode import reference\n    return dict(reference.SEED_CFG)\n"
                   "from hazards.ragged_decode.reference import SEED_LENS\n")
    found = unresolved(bad)
    assert len(found) == 2 and "reference.SEED_CFG" in found[0] + found[1] and "SEED_LENS" in found[0] + found[1]
    engine = REPO / "stress" / "campaign.py"  # a relative import, resolved against the engine package
    node = ast.parse("from .store import NoSuchThing\n").body[0]
    assert _absolute(node, engine) == "hazards.engine.store"


def _stopped_at_the_device(exc: BaseException) -> bool:
    """The error a CPU-only torch raises at the first CUDA allocation or call."""
    text = f"{type(exc).__name__}: {exc}"
    return isinstance(exc, (AssertionError, RuntimeError)) and ("CUDA" in text or "cuda" in text)


def test_the_ragged_decode_faithful_check_builds_its_configuration_up_to_the_device(monkeypatch):
    torch = pytest.importorskip("torch")
    from hazards.ragged_decode import faithful, reference

    assert faithful.main(["--launches", "0"]) == 2
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # on to the first device call
    with pytest.raises(BaseException) as stopped:
        faithful.Faithful(lens_scale=16)
    assert _stopped_at_the_device(stopped.value), repr(stopped.value)
    assert len(reference.CONTRACT_LENS) == 128  # the geometry the check uses: the ragged-decode contract's multiset


def test_the_ragged_decode_faithful_check_refuses_bad_input_before_the_device(capsys):
    from hazards.ragged_decode import faithful

    assert faithful.main(["--candidate", "nosuch", "--launches", "1"]) == 2
    assert "nosuch" in capsys.readouterr().err
    assert faithful.parse_request({"params": {"candidate": "production", "workers": 64}},
                                  faithful.candidates.get)[1] == 64


def test_the_layered_faithful_check_parses_and_knows_its_candidates(capsys):
    from hazards.megakernel_layers import faithful

    assert faithful.main(["--launches", "0"]) == 2
    for name in faithful.CANDIDATES:
        assert faithful.candidate(name).name == name
    assert faithful.main(["--candidate", "nosuch"]) == 2
    assert "nosuch" in capsys.readouterr().err


@pytest.mark.parametrize("module", ["hazards.ragged_decode.check", "hazards.ragged_decode.faithful",
                                    "hazards.megakernel_layers.faithful", "hazards.megakernel_layers.calibration",
                                    "hazards.gates.synthlm.harness", "hazards.gates.synthlm.train"])
def test_every_gpu_side_entry_point_parses_its_arguments(module, capsys):
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0 and "usage:" in capsys.readouterr().out


def test_the_false_stall_round_refuses_a_name_that_matches_nothing(tmp_path):
    # A mistyped FAMILY/VARIANT measured nothing and printed an empty round ("0 gaps") that
    # read like a pass; now it stops with one line before the GPU hammer starts.
    stall_measure = load_script(REPO / "ci" / "gpu" / "stall_measure.py")
    with pytest.raises(SystemExit) as stop:
        stall_measure.falsestall(tmp_path, 1.0, "ordering/pc_fixed,barrier_layot")
    assert str(stop.value) == ("stall_measure.py: barrier_layot: no such family, FAMILY/VARIANT or "
                               "ragged_decode")
    assert list(tmp_path.iterdir()) == []


def test_the_false_stall_round_measures_the_variants_its_list_names():
    stall_measure = load_script(REPO / "ci" / "gpu" / "stall_measure.py")
    fams = {f.name: f for f in stall_measure.cuda_binary_families()}
    items = [(fams["ordering"], "pc_fixed"), (fams["ordering"], "pc_fence"), (fams["pipeline"], "fixed"),
             (None, "ragged_decode")]
    assert stall_measure.only_named(items, "ordering/pc_fixed,ragged_decode") == [items[0], items[3]]
    assert stall_measure.only_named(items, "ordering") == items[:2]


# the marker only inside a pytester test's source text (the plugin's own tests): no GPU test of its own
NOT_GPU_TESTS = {"tests/plugin/test_opt_in.py"}


def test_the_whole_gpu_suite_script_runs_every_gpu_marked_test_file():
    """ci/gpu/final-gpu-tests.sh is the whole GPU suite run before a resolve: a gpu-marked test file its pytest
    command does not name is a GPU test nobody runs (the fastpath's hang tests were missed once). Read from the
    command itself, not the script's comments; every path it names exists."""
    script = (REPO / "ci" / "gpu" / "final-gpu-tests.sh").read_text()
    command = re.search(r"python3 -m pytest -m gpu (.*?)> \$R/gpu-tests\.txt", script, re.S)
    assert command, "no `python3 -m pytest -m gpu ... > $R/gpu-tests.txt` command in final-gpu-tests.sh"
    named = set(re.findall(r"\btests/\S+\.py\b", command.group(1)))
    assert named and all((REPO / n).is_file() for n in named), sorted(n for n in named if not (REPO / n).is_file())
    marked = {str(p.relative_to(REPO)) for p in GPU_TESTS} - NOT_GPU_TESTS
    assert marked <= named, f"gpu-marked test files final-gpu-tests.sh's pytest command does not run: {sorted(marked - named)}"


def _preamble(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    """Source ci/gpu/plan-preamble.sh as a device plan does (PLAN=p, OUT=tmp_path), then run `body`."""
    env = {k: v for k, v in os.environ.items() if k not in ("PLAN", "LIMIT")} | {"OUT": str(tmp_path)}
    return subprocess.run(["bash", "-c", f"PLAN=p source ci/gpu/plan-preamble.sh >/dev/null 2>&1\n{body}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def test_a_device_plan_gets_the_suites_prebuild_filtered_to_one_family_and_its_folder_as_one_tarball(tmp_path):
    """A plan sources ci/gpu/plan-preamble.sh instead of copying its preamble: the prebuild it runs is
    final-gpu-tests.sh's own (the layered campaign's builds with it), cut to one family when asked, and it writes
    into the plan's folder, which comes back as one tarball (the device tool returns only a few files)."""
    done = _preamble(tmp_path, "plan_prebuild_script megakernel_layers && cp $PLAN_PREBUILD $PLAN_DIR/one.sh\n"
                               "plan_prebuild_script && cp $PLAN_PREBUILD $PLAN_DIR/all.sh\necho $PLAN_PREBUILD")
    assert done.returncode == 0, done.stderr
    with tarfile.open(tmp_path / "p.tar.gz") as tar:
        one, every = (tar.extractfile(f"p/{n}.sh").read().decode() for n in ("one", "all"))
        assert "p/env.txt" in tar.getnames()
    assert not (tmp_path / "p").exists() and not Path(done.stdout.split()[-1]).exists()  # nothing left behind
    suite = (REPO / "ci" / "gpu" / "final-gpu-tests.sh").read_text()
    python = suite[suite.index("timeout 120 python3 - "):suite.index("\nPY\n")]
    assert every.startswith(python.split("\n", 1)[0].replace("$R/build.txt", f"{tmp_path}/p/build.txt"))
    assert every.split("\n", 1)[1] == python.split("\n", 1)[1] + "\nPY\n"
    assert 'if f.binary and f.name == "megakernel_layers"]' in one and one.count("\n") == every.count("\n")
    compile(one.split("\n", 1)[1].rsplit("PY\n", 1)[0], "prebuild", "exec")


def test_a_plans_prebuild_that_cannot_be_cut_out_is_an_error_and_a_group_without_time_is_not_started(tmp_path):
    done = _preamble(tmp_path, "sed() { command sed \"$@\" | command sed 's/^fams = /families = /'; }\n"
                               "plan_prebuild_script megakernel_layers")
    assert done.returncode != 0 and "plan-preamble: no prebuild in final-gpu-tests.sh" in done.stderr
    done = _preamble(tmp_path, "LIMIT=5; run_group late 60 tests/test_gpu_code_on_cpu.py")
    assert done.returncode == 0 and "== group late not started" in done.stdout
    assert not (tmp_path / "gpu-late.txt").exists()
