"""The plugin is opt-in: installed, it adds its options to every pytest session and does
nothing else until the session asks for it (`-p hazards`, `-p hazards.pytest_plugin`,
`hazards = true`, an `--hz-*` option). Checked in a user's project that has its own `gpu`
marker and its own `stress` package, in interpreters where gpu-hazards is installed (its
entry point found) or not (`pythons` in conftest.py)."""
from __future__ import annotations

import json

import pytest

from hazards.engine import leases
from hazards.engine.gpus import gpu_available

# One worker runs this module: the two interpreters of `pythons` are built once, not per worker.
pytestmark = pytest.mark.xdist_group("plugin-pythons")

# A project of a user's own: its `gpu` marker, its `stress` package, and a conftest that
# records what CUDA_VISIBLE_DEVICES was when conftests were imported.
USER_PROJECT = {
    "stress/__init__.py": "OWNER = 'the user'\n",
    "conftest.py": """
        import json, os
        from pathlib import Path

        Path(os.environ["HZ_TEST_OUT"]).write_text(json.dumps({"cvd": os.environ.get("CUDA_VISIBLE_DEVICES")}))
    """,
    "test_user.py": """
        import os

        import hypothesis  # the plugin registers its profiles for modules that use hypothesis
        import pytest

        def test_own_stress_package():
            import stress
            assert stress.OWNER == "the user"

        @pytest.mark.gpu
        def test_own_gpu_marker_is_left_alone():
            pass

        @pytest.mark.hz_gpu
        def test_hz_gpu():
            pass

        def test_hypothesis_profiles():
            from hypothesis import settings
            from hypothesis.errors import InvalidArgument
            try:
                settings.get_profile("hazards-nightly")
            except InvalidArgument:
                print("HZ-PROFILES: absent")
            else:
                print("HZ-PROFILES: registered")
    """,
}
OWN_GPU_MARKER = "[pytest]\nmarkers =\n    gpu: this project's own GPU tests\n"


@pytest.fixture
def user_project(inner):
    for name, text in USER_PROJECT.items():
        inner.write(name, text)
    inner.write("pytest.ini", OWN_GPU_MARKER)
    return inner


def _cvd_at_conftest(project) -> str | None:
    return json.loads((project.path / "out.json").read_text())["cvd"]


def test_an_installed_plugin_stays_out_of_a_session_that_did_not_ask(user_project, pythons):
    # A GPU is free to lease (fake), CUDA_VISIBLE_DEVICES is unset: an active plugin would
    # lease GPU 0, export it, register its profiles and skip the project's `gpu` test.
    res = user_project.run("-rs", "-s", "-W", "ignore::pytest.PytestUnknownMarkWarning", python=pythons["installed"],
                           opt_in=False, env={"HZ_FAKE_GPUS": "0", "HZ_TEST_OUT": str(user_project.path / "out.json")})
    assert res.ret == 0 and res.outcomes == {"passed": 4}, res.stdout + res.stderr
    assert "gpu-hazards" in res.stdout  # the entry point was loaded ...
    said = [line for line in res.stdout.splitlines() if "hazards:" in line]
    # ... and did nothing, saying only that the test using hz_gpu needs the plugin turned on
    assert said == ["hazards: test_user.py::test_hz_gpu uses @pytest.mark.hz_gpu, but the gpu-hazards pytest plugin "
                    "is opt-in: turn it on with `-p hazards` (or `hazards = true` in [tool.pytest.ini_options], "
                    "or any --hz-* option)"], res.stdout
    assert _cvd_at_conftest(user_project) is None
    assert leases.read_lease_log(user_project.lease_dir) == []
    assert "HZ-PROFILES: absent" in res.stdout
    helped = user_project.run("--help", python=pythons["installed"], opt_in=False)
    assert "--hz-repeat" in helped.stdout and "hazards (bool)" in helped.stdout  # options are registered
    markers = user_project.run("--markers", python=pythons["installed"], opt_in=False)
    assert "hz_gpu" not in markers.stdout and "hz_timeout" not in markers.stdout


def test_a_gpu_leased_elsewhere_leaves_the_sessions_cuda_visible_devices_alone(user_project, pythons):
    with leases.acquire("0", "someone-else", lock_dir=user_project.lease_dir):
        res = user_project.run("-W", "ignore::pytest.PytestUnknownMarkWarning", python=pythons["installed"],
                               opt_in=False, env={"HZ_FAKE_GPUS": "0", "CUDA_VISIBLE_DEVICES": "0",
                                                  "HZ_TEST_OUT": str(user_project.path / "out.json")})
    assert res.ret == 0 and res.outcomes == {"passed": 4}, res.stdout + res.stderr
    assert _cvd_at_conftest(user_project) == "0"


def test_a_plugin_fixture_without_opt_in_is_explained_in_one_line(inner, pythons):
    """Without opt-in, `hz_gpu` would only be "fixture not found" and `hz_timeout` silently
    inert: one line says the plugin is opt-in and how to turn it on (the session goes on)."""
    inner.write("test_fixture.py", """
        import pytest

        def test_uses_the_gpu_fixture(hz_gpu):
            pass

        @pytest.mark.hz_timeout(5)
        def test_with_a_timeout():
            pass
    """)
    res = inner.run("-W", "ignore::pytest.PytestUnknownMarkWarning", python=pythons["installed"], opt_in=False)
    assert res.outcomes == {"passed": 1, "errors": 1}, res.stdout + res.stderr
    said = [line for line in res.stdout.splitlines() if line.startswith("hazards:")]
    assert said == ["hazards: test_fixture.py::test_uses_the_gpu_fixture uses fixture hz_gpu and 1 more, but the "
                    "gpu-hazards pytest plugin is opt-in: turn it on with `-p hazards` (or `hazards = true` in "
                    "[tool.pytest.ini_options], or any --hz-* option)"], res.stdout


OPT_INS = [
    ("installed", ["-p", "hazards"], None, "-p hazards"),
    ("installed", ["-p", "hazards.pytest_plugin"], None, "-p hazards.pytest_plugin"),
    ("installed", ["--hz-lease-wait", "0"], None, "--hz-lease-wait given"),  # the default value, given
    ("installed", [], "pytest.ini", "hazards = true in pytest.ini"),
    ("installed", [], "pyproject.toml", "hazards = true in pyproject.toml"),
    ("bare", ["-p", "hazards"], None, "-p hazards"),
    ("bare", ["-p", "hazards.pytest_plugin"], None, "-p hazards.pytest_plugin"),
]


@pytest.mark.parametrize("python, args, ini, why", OPT_INS,
                         ids=[f"{p}:{' '.join(a) or ini}" for p, a, ini, _ in OPT_INS])
def test_each_way_of_opting_in_turns_the_plugin_on(user_project, pythons, python, args, ini, why):
    if ini == "pytest.ini":
        user_project.write("pytest.ini", OWN_GPU_MARKER + "hazards = true\n")
    elif ini == "pyproject.toml":
        (user_project.path / "pytest.ini").unlink()
        user_project.write("pyproject.toml", """
            [tool.pytest.ini_options]
            hazards = true
            markers = ["gpu: this project's own GPU tests"]
        """)
    res = user_project.run("-rs", "-s", *args, python=pythons[python], opt_in=False,
                           env={"HZ_FAKE_GPUS": "0", "HZ_TEST_OUT": str(user_project.path / "out.json")})
    assert "INTERNALERROR" not in res.stdout + res.stderr, res.stdout + res.stderr
    assert f"hazards: plugin on ({why})" in res.stdout, res.stdout + res.stderr
    assert _cvd_at_conftest(user_project) == "0"  # leased, and exported before conftests were imported
    assert [e["holder"] for e in leases.read_lease_log(user_project.lease_dir) if e["event"] == "acquire"] == [
        "pytest:main"]
    assert "HZ-PROFILES: registered" in res.stdout
    if gpu_available():
        return
    # The project's own `gpu` test runs; only the plugin's `hz_gpu` marker skips without a GPU.
    assert res.outcomes == {"passed": 3, "skipped": 1}, res.stdout
    assert len(res.lines_with("no usable NVIDIA GPU")) == 1, res.stdout
