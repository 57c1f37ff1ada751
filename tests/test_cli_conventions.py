"""The command line shows its work the way users expect: `--version`, help pages that render
as written with every option's default, one meaning per flag, one way to write a rate, and
exit codes that say what happened."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import typer.main

from hazards.cli import load_commands, main
from hazards.cli.app import app

REPO = Path(__file__).resolve().parent.parent


def commands() -> dict:
    load_commands()
    return typer.main.get_command(app).commands


def options(cmd) -> list:
    return [p for p in cmd.params if p.param_type_name == "option" and not p.hidden and p.name != "help"]


def hazards(*args: str, columns: int = 100) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": str(columns), "TERMINAL_WIDTH": str(columns), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "hazards", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)


def test_version_prints_the_package_version_and_exits_zero():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    r = hazards("--version")
    assert r.returncode == 0 and r.stdout == f"hazards {version}\n"


def test_every_option_that_takes_a_value_shows_its_default_and_no_help_text_spells_one():
    missing = []
    for name, cmd in commands().items():
        for p in options(cmd):
            assert "[default" not in (p.help or ""), (name, p.opts)  # rich markup ate these
            if p.is_flag and not p.secondary_opts:
                continue  # a flag is off unless given
            if not (isinstance(p.show_default, str) or (p.default is not None and p.show_default is not False)):
                missing.append((name, p.opts))
    assert missing == []


def _description(out: str) -> list[str]:
    """The prose lines of a rendered help page (between the usage line and the first box)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "Usage:" in line) + 1
    end = next(i for i, line in enumerate(lines) if line.lstrip().startswith("╭"))
    return [line.rstrip() for line in lines[start:end]]


@pytest.mark.parametrize("name", ["check", "soak", "run", "repro", "stress", "report", "static", "lint", "compare"])
@pytest.mark.parametrize("columns", [60, 160])
def test_help_paragraphs_are_reflowed_to_the_terminal_not_broken_where_the_source_wrapped(name, columns):
    out = hazards(name, "--help", columns=columns).stdout
    width = len(out.splitlines()[0])  # the console's width, padding included
    prose = [line if line.startswith(" ") and not line.startswith("  ") else "" for line in _description(out)]
    for line, nxt in zip(prose, prose[1:]):
        if line and nxt:  # a line break inside a paragraph: only where the next word did not fit
            assert len(line) + 1 + len(nxt.split()[0]) > width - 1, (name, line, nxt)


def test_every_help_shows_defaults_in_brackets():
    out = " ".join(hazards("stress", "--help", columns=200).stdout.split())
    assert "[default: (the family's)]" in out and "[default: sm_90a]" in out


def test_one_meaning_per_flag_across_commands():
    meanings: dict[str, set] = {}
    for name, cmd in commands().items():
        for p in options(cmd):
            for opt in p.opts + p.secondary_opts:
                meanings.setdefault(opt, set()).add(p.help)
    assert {opt: helps for opt, helps in meanings.items() if len(helps) > 1} == {}
    assert meanings["-v"] == meanings["--verbose"]  # -v is verbose wherever it exists
    assert meanings["-n"] == meanings["--runs"]     # -n is the number of runs wherever it exists
    assert "--target" not in meanings               # a GPU architecture is --arch; --targets is a file


def test_renamed_flags_keep_only_unambiguous_old_spellings():
    repro = {o for p in commands()["repro"].params for o in p.opts}
    assert "--max-runs" in repro  # hidden: no other command spells it
    r = hazards("repro", "--max-runs", "0", "--", "true")
    assert r.returncode == 2 and "-n/--runs must be at least 1" in r.stderr
    assert hazards("stress", "pipeline", "-v", "fixed").returncode == 2  # -v no longer picks a variant


@pytest.mark.parametrize("before, after, code", [("0/40", "9/10", 1), ("4/7", "0/10", 0), ("3/10", "3/10", 0)])
def test_compare_exits_one_only_when_the_rate_rose_significantly(before, after, code):
    assert main(["compare", "--before", before, "--after", after]) == code


def test_json_is_offered_by_check_soak_and_report():
    for name in ("check", "soak", "report"):
        assert "--json" in {o for p in commands()[name].params for o in p.opts}, name


def test_a_rate_is_written_one_way():
    from hazards.engine.stats import describe_rate, format_rate

    assert format_rate(4, 7) == "57% (95% CI 18%–90%)"
    assert format_rate(0, 10) == "≤ 26% (95% upper bound)"
    assert format_rate(0, 0) == "n/a (no judged runs)"
    assert describe_rate(4, 7).endswith(format_rate(4, 7))


def test_the_stats_table_and_the_report_write_the_same_rate(tmp_path, capsys):
    from hazards.engine.outcome import Outcome, RunResult
    from hazards.engine.report import build_report, render_markdown
    from hazards.engine.stats import format_rate
    from hazards.engine.store import Store

    db = tmp_path / "r.db"
    with Store(db) as store:
        cid = store.create_campaign("run", {})
        for i in range(9):
            outcome = Outcome.MISMATCH if i % 3 == 0 else Outcome.CLEAN
            store.record_run(cid, RunResult(outcome, "x", target="prog", variant="v"))
        md = render_markdown(build_report(store, cid, figures=False))
    assert main(["stats", "--store", str(db)]) == 0
    table = capsys.readouterr().out
    assert format_rate(3, 9) in md and format_rate(3, 9) in " ".join(table.split())


def test_docs_cli_lists_every_flag():
    table = (REPO / "docs" / "cli.md").read_text()
    rows = {m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|", table, re.M)}
    spelled = {", ".join(sorted(p.opts + p.secondary_opts, key=lambda o: (o.startswith("--"), o)))
               for cmd in commands().values() for p in options(cmd)}
    assert spelled - rows == set(), "add these flags to docs/cli.md"


@pytest.mark.parametrize("argv, words", [
    (["run", "--timeout", "abc", "--", "true"], "Invalid value for '--timeout'"),
    (["bisect", "--alpha", "x"], "Invalid value for '--alpha'"),
    (["stress", "--family", "pipeline"], "No such option: --family"),
    (["store", "bogus"], "No such command 'bogus'"),
])
def test_a_value_the_parser_rejects_is_one_line_like_any_bad_input(capsys, argv, words):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("hazards: error: ") and words in err and err.count("\n") == 1, err


def _example_lines() -> list[tuple[str, str]]:
    """(where, line) of every `hazards ...` example in the README, docs/ (not results) and help texts."""
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "hazards" / "cli").glob("*.py"))]
    return [(f"{f.relative_to(REPO)}:{i}", line) for f in files
            for i, line in enumerate(f.read_text().splitlines(), 1) if "hazards " in line]


def test_examples_name_variants_their_family_has_and_options_their_command_takes():
    from hazards.families import get_family

    wrong = []
    for where, line in _example_lines():
        for fam, variant in re.findall(r"--family ([a-z_]+) --variant ([a-z_0-9]+)", line):
            if variant not in {v.name for v in get_family(fam).variants}:
                wrong.append((where, f"{fam} has no variant {variant}"))
        if re.search(r"hazards stress --family\b", line):  # stress takes the family as its argument
            wrong.append((where, "hazards stress has no --family"))
    assert wrong == []
