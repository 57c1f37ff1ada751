"""Progress people can watch: every command that runs campaigns shows counts, the rate with
its interval, ETA and what runs where; a CI log gets complete status lines at a fixed
interval; a loop of `error` runs stops early; soak without a GPU says so before building."""
from __future__ import annotations

import io
import math
import re
import sys

import pytest
from campaign_fakes import fake_items_for, make_family

from hazards import checkrun
from hazards.cli import main
from hazards.engine.loop import WorkItem
from hazards.engine.leases import no_gpu_lease
from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.stats import format_rate
from hazards.engine.store import empty_counts

LONG_NAME = "a-program-whose-name-alone-takes-more-than-eighty-columns-of-a-ci-log-line-to-write-out"
STATUS = re.compile(r"^hazards (\w+) #(\d+) (.*?): (\d+)(?:/(\d+))? runs \(clean (\d+), hang (\d+), fault (\d+), "
                    r"mismatch (\d+), error (\d+)\)")


def _status_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if STATUS.match(line)]


class FakeLease:
    """A GPU lease as the progress display sees it."""

    def __init__(self, gpu: str) -> None:
        self.gpu, self.is_gpu = gpu, True


def test_a_ci_log_gets_complete_status_lines_with_counts_rate_interval_eta_and_the_gpu():
    from hazards.cli.progress import CampaignProgress
    from hazards.engine.campaign import LoopStart

    clock = [100.0]
    out = io.StringIO()
    item = WorkItem(target=LONG_NAME, kind="command")
    with CampaignProgress(interval_s=3600, stream=out, terminal=False, clock=lambda: clock[0]) as p:
        p.begin(LoopStart(7, "run", [item], 40, math.inf, empty_counts(), [FakeLease("3")]))
        p.started(FakeLease("3"), item)
        for k in range(10):
            clock[0] += 2.0
            p.finished(k + 1, item, RunResult(Outcome.FAULT if k in (2, 5) else Outcome.CLEAN, "x"))
        line = p.status_line()
    # one line, whole: the name, every outcome count, the rate in the one format, speed, ETA, where
    assert "\n" not in line and len(line) > 160
    m = STATUS.match(line)
    assert m and m.group(3) == LONG_NAME and m.group(4, 5) == ("10", "40") and m.group(6, 8) == ("8", "2")
    assert f"failure rate {format_rate(2, 10)}" in line
    assert "2.0 s/run over 20s" in line and "ETA 1m00s" in line and "running on GPU 3" in line
    assert out.getvalue().splitlines()[0] == f"hazards run #7 {LONG_NAME}: started on GPU 3; 40 runs"


def test_a_terminal_gets_a_live_display_with_counts_rate_and_eta(monkeypatch):
    from hazards.cli.progress import CampaignProgress
    from hazards.engine.campaign import LoopStart

    monkeypatch.setenv("COLUMNS", "200")
    out = io.StringIO()
    items = [WorkItem(target="fam", variant="broken", expect="detect", kind="server"),
             WorkItem(target="fam", variant="fixed", expect="clean", kind="server")]
    clock = [0.0]
    with CampaignProgress(stream=out, terminal=True, clock=lambda: clock[0]) as p:
        p.begin(LoopStart(3, "soak", items, None, 600.0, empty_counts(), [FakeLease("0"), FakeLease("1")]))
        p.started(FakeLease("0"), items[0])
        p.started(FakeLease("1"), items[1])
        clock[0] = 60.0
        p.finished(1, items[0], RunResult(Outcome.MISMATCH, "bad", metrics={"launches": 10, "mismatched": 4}))
        p.finished(2, items[1], RunResult(Outcome.CLEAN, "ok", metrics={"launches": 10}))
        line = p.status_line()
    shown = out.getvalue()
    assert "\x1b[" in shown  # a rich display (colours, cursor movement), not log lines
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown)
    assert "hazards soak #3 2 items" in plain and "mismatch 1" in plain and "clean 1" in plain
    assert "canaries detected 1/1" in plain and format_rate(0, 1) in plain
    assert "ETA 9m00s" in line and "fam/broken on GPU 0, fam/fixed on GPU 1" in line
    assert "20 launches" in line and "4 mismatched" in line


def test_status_lines_come_at_the_set_interval_and_zero_turns_progress_off(tmp_path, capsys):
    prog = [sys.executable, "-c", "import time; time.sleep(0.4)"]
    rc = main(["run", "-n", "4", "--progress-interval", "0.3s", "--store", str(tmp_path / "r.db"), "--", *prog])
    err = capsys.readouterr().err
    lines = _status_lines(err)
    assert rc == 0 and len(lines) >= 4, err  # periodic ones while the runs last, and the last one
    assert lines[-1].startswith("hazards run #1 ") and "4/4 runs (clean 4," in lines[-1]
    assert lines[-1].endswith("; complete")
    assert main(["run", "-n", "1", "--progress-interval", "0", "--store", str(tmp_path / "r.db"), "--", *prog]) == 0
    assert capsys.readouterr().err == ""
    assert main(["run", "--progress-interval", "soon", "--", *prog]) == 2
    assert "--progress-interval" in capsys.readouterr().err


def test_run_error_loop_stops_after_ten_errors_in_a_row_with_the_reason(tmp_path, capsys):
    argv = [sys.executable, "-c", "import module_that_does_not_exist"]
    rc = main(["run", "--until-fail", "-n", "40", "--store", str(tmp_path / "r.db"), "--json", "--", *argv])
    out = capsys.readouterr()
    import json

    summary = json.loads(out.out)
    assert rc == 3 and summary["n"] == 10 and summary["counts"]["error"] == 10 and summary["status"] == "stopped"
    assert summary["stop_reason"].startswith("10 runs in a row ended in `error`")
    assert "module_that_does_not_exist" in summary["stop_reason"]
    assert _status_lines(out.err)[-1].endswith(summary["stop_reason"])
    rc = main(["run", "-n", "40", "--max-errors-in-a-row", "3", "--progress-interval", "0",
               "--store", str(tmp_path / "r.db"), "--json", "--", *argv])
    assert rc == 3 and json.loads(capsys.readouterr().out)["n"] == 3


def test_runs_that_are_not_all_errors_never_stop_for_errors(tmp_path, capsys):
    # every other run fails to import: never ten errors *in a row*
    prog = (f"import os, sys; p = {str(tmp_path / 'n')!r}; n = int(open(p).read()) if os.path.exists(p) else 0; "
            "open(p, 'w').write(str(n + 1)); n % 2 and __import__('module_that_does_not_exist')")
    rc = main(["run", "-n", "24", "--progress-interval", "0", "--store", str(tmp_path / "r.db"), "--json",
               "--", sys.executable, "-c", prog])
    import json

    summary = json.loads(capsys.readouterr().out)
    assert rc == 3 and summary["n"] == 24 and summary["counts"] == {**empty_counts(), "clean": 12, "error": 12}


def test_soak_shows_progress_in_a_ci_log_for_its_whole_budget(fake_gpus, tmp_path, capsys, monkeypatch):
    from test_soak import TOML

    f = tmp_path / "targets.toml"
    f.write_text(TOML)
    monkeypatch.setenv("HZ_PROGRESS_INTERVAL", "0.5")  # the environment sets it as well as the flag
    rc = main(["soak", "--budget", "3s", "--targets", str(f), "--no-families", "--store", str(tmp_path / "r.db"),
               "--report", str(tmp_path / "soak.html")])
    err = capsys.readouterr().err
    lines = _status_lines(err)
    assert rc == 0 and len(lines) >= 4, err
    assert all(line.startswith("hazards soak #1 2 items: ") for line in lines)
    assert any(" on GPU 0" in line and " on GPU 1" in line for line in lines[:-1])  # what runs where
    assert any("ETA " in line for line in lines[:-1]) and "failure rate " in lines[-1]
    assert lines[-1].endswith("; complete")


def test_check_shows_canaries_detected_and_the_clean_rate(fake_gpus, tmp_path, capsys, monkeypatch):
    import hazards.families as families

    monkeypatch.setattr(checkrun, "run_static", lambda paths, families=None, skip_tools=(), observer=None: ([], "stubbed"))
    monkeypatch.setattr(families, "all_families", lambda: [make_family()])
    monkeypatch.setattr(checkrun, "default_items_for", fake_items_for)
    rc = main(["check", "--budget", "4s", "--store", str(tmp_path / "r.db"), "--families", "fakefam",
               "--progress-interval", "1h"])
    err = capsys.readouterr().err
    last = _status_lines(err)[-1]
    assert rc == 0 and last.startswith("hazards check #1 3 items: ")
    assert "canaries detected 1/1" in last and "failure rate ≤ " in last and "(variants expected clean)" in last


def test_soak_without_a_gpu_says_so_before_building_any_family(monkeypatch, tmp_path, capsys):
    import hazards.families as families
    import hazards.stress_family as stress_family

    built = []

    def build(fam, *args, **kw):  # what building a family's server costs (44 s of nvcc on the CPU machine)
        built.append(fam.name)
        return fake_items_for(fam, list(fam.variants))[0]

    monkeypatch.setenv("HZ_FAKE_GPUS", "")
    monkeypatch.setenv("HZ_LEASE_DIR", str(tmp_path / "leases"))
    monkeypatch.setattr(families, "all_families", lambda: [make_family()])
    monkeypatch.setattr(stress_family, "family_item", build)
    rc = main(["soak", "--budget", "2s", "--store", str(tmp_path / "r.db")])
    err = capsys.readouterr().err
    assert rc == 3 and err.startswith("hazards: error: hazards soak needs a free GPU: no usable GPU")
    assert built == [] and not (tmp_path / "r.db").exists()


def test_stress_and_repro_use_the_same_progress(tmp_path, capsys):
    rc = main(["repro", "--keep-going", "-n", "3", "--progress-interval", "1h", "--no-forensics",
               "--store", str(tmp_path / "r.db"), "--", sys.executable, "-c", "pass"])
    err = capsys.readouterr().err
    assert rc == 0 and _status_lines(err)[-1].startswith("hazards repro #1 ")
    assert "3/3 runs (clean 3," in _status_lines(err)[-1]


def test_the_no_gpu_pseudo_lease_is_named_as_such():
    from hazards.cli.progress import lease_label

    assert lease_label(no_gpu_lease("t")) == "no GPU"
    assert lease_label(FakeLease("2")) == "GPU 2"
