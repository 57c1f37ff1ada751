"""A project's `[tool.hazards]` defaults: flag > environment > file > built-in default, the
nearest pyproject.toml with the table wins, a command's own table over the shared one, and a
bad table is one line, exit 2."""
from __future__ import annotations

import pytest

from cli_helpers import hazards

ENV_CLEAN = {"HZ_FAMILIES": "", "HZ_BUDGET": "", "HZ_SKIP": ""}


def _project(tmp_path, text: str):
    (tmp_path / "pyproject.toml").write_text(text)
    sub = tmp_path / "deep" / "inside"
    sub.mkdir(parents=True)
    return sub


def _unknown_family(res) -> str:
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.count("\n") == 1, res.stderr
    return res.stderr.split("no family ")[1].split()[0].strip("'")


def test_flag_beats_environment_beats_file(tmp_path):
    cwd = _project(tmp_path, '[tool.hazards]\nfamilies = ["from-file"]\n')
    env = {k: v for k, v in ENV_CLEAN.items() if k != "HZ_FAMILIES"}
    # An empty HZ_FAMILIES is no value: click falls back to the file.
    assert _unknown_family(hazards("check", "--static", cwd=cwd, env={**env, "HZ_FAMILIES": ""})) == "from-file"
    assert _unknown_family(hazards("check", "--static", cwd=cwd, env={**env, "HZ_FAMILIES": "from-env"})) == "from-env"
    assert _unknown_family(hazards("check", "--static", "--families", "from-flag", cwd=cwd,
                                   env={**env, "HZ_FAMILIES": "from-env"})) == "from-flag"


def test_a_commands_own_table_wins_and_paths_are_relative_to_the_file(tmp_path):
    cwd = _project(tmp_path, '[tool.hazards]\nstore = "shared.db"\n[tool.hazards.stats]\nstore = "stats/own.db"\n')
    res = hazards("stats", cwd=cwd, env={"HZ_STORE": ""})
    assert res.returncode == 2 and f"no results store at {tmp_path / 'stats' / 'own.db'}" in res.stderr, res.stderr


def test_the_file_value_is_the_default_that_help_shows(tmp_path):
    cwd = _project(tmp_path, '[tool.hazards]\nbudget = "7m"\n[tool.hazards.soak]\nbudget = "45m"\n')
    soak = hazards("soak", "--help", cwd=cwd, env={**ENV_CLEAN, "COLUMNS": "200"})
    check = hazards("check", "--help", cwd=cwd, env={**ENV_CLEAN, "COLUMNS": "200"})
    assert "[default: 45m]" in soak.stdout and "[default: 7m]" in check.stdout
    assert "HZ_BUDGET" in soak.stdout  # the environment variable is named in --help
    top = hazards("--help", cwd=cwd, env={"COLUMNS": "200"})
    assert "the flag, its HZ_* environment variable" in top.stdout


@pytest.mark.parametrize("text, words", [
    ('[tool.hazards]\nbudgte = "3m"\n', "unknown key 'budgte'"),
    ('[tool.hazards]\nfamilies = [1, 2]\n', "must be a name or a list of names"),
    ('[tool.hazards]\nbudget = ""\n', "budget must be a non-empty string, got ''"),
    ('[tool.hazards.chek]\nbudget = "3m"\n', "[tool.hazards.chek] names no command"),
    ('[tool.hazards\n', "not a readable TOML file"),
])
def test_a_bad_table_is_one_line_and_exit_2(tmp_path, text, words):
    cwd = _project(tmp_path, text)
    res = hazards("stats", cwd=cwd)
    assert res.returncode == 2 and words in res.stderr and res.stderr.count("\n") == 1, res.stderr
    assert "Traceback" not in res.stderr


def test_a_pyproject_without_the_table_is_not_the_projects(tmp_path):
    cwd = _project(tmp_path, '[tool.hazards]\nstore = "outer.db"\n')
    (cwd.parent / "pyproject.toml").write_text('[project]\nname = "inner"\n')
    res = hazards("stats", cwd=cwd, env={"HZ_STORE": ""})
    assert f"no results store at {tmp_path / 'outer.db'}" in res.stderr, res.stderr


def test_a_subcommand_of_a_group_takes_the_files_store(tmp_path):
    # `hazards store check` and `hazards gate perf` are subcommands: click looks their
    # defaults up under the group's name, so the shared table must reach them nested.
    cwd = _project(tmp_path, '[tool.hazards]\nstore = "project.db"\n')
    res = hazards("store", "check", cwd=cwd, env={"HZ_STORE": ""})
    assert res.returncode == 2 and f"no results store at {tmp_path / 'project.db'}" in res.stderr, res.stderr


def test_help_says_a_file_may_set_the_store_families_and_skip(tmp_path):
    # these options' built-in defaults are words ("all", "nothing", a relative path) that --help
    # shows as they are, whatever the project's table says: so they name the table too
    cwd = _project(tmp_path, '[tool.hazards]\nstore = "ci/ci.db"\nfamilies = ["pipeline"]\nskip = ["nvdisasm"]\n')
    env = {**ENV_CLEAN, "COLUMNS": "400", "HZ_STORE": ""}
    check = " ".join(hazards("check", "--help", cwd=cwd, env=env).stdout.split())
    for builtin, key in ((".hazards/results.db", "store"), ("all", "families"), ("nothing", "skip")):
        assert f"[default: ({builtin}, or pyproject.toml's tool.hazards {key})]" in check, check
    group = " ".join(hazards("store", "check", "--help", cwd=cwd, env=env).stdout.split())
    assert "[default: (.hazards/results.db, or pyproject.toml's tool.hazards store)]" in group
