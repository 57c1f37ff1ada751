"""Progress during static work: `hazards static` and `hazards check --static` show what is
being compiled, n of m and the time left (as lines when stderr is not a terminal), and the
subjects are judged in parallel up to the machine's cores, their findings kept in order."""
from __future__ import annotations

import io
import threading
import time

import pytest

from hazards import static_catalog
from hazards.cli import main
from hazards.cli.progress import CampaignProgress
from hazards.engine.errors import UserError
from hazards.static.findings import Finding
from hazards.static.runner import Subject, machine_cores, run_subjects
from static_helpers import DATA


class Overlap:
    """Subjects that take `seconds` each and record how many ran at once."""

    def __init__(self, seconds: float = 0.3) -> None:
        self.seconds, self.running, self.most, self.mu = seconds, 0, 0, threading.Lock()

    def subject(self, label: str, *, fail: bool = False) -> Subject:
        def check() -> list[Finding]:
            with self.mu:
                self.running += 1
                self.most = max(self.most, self.running)
            time.sleep(self.seconds)
            with self.mu:
                self.running -= 1
            if fail:
                raise UserError(f"{label} cannot be judged")
            return [Finding("demo", "info", label, 1, label)]
        return Subject(label, check)


def test_subjects_run_in_parallel_up_to_the_jobs_and_keep_their_order():
    overlap = Overlap()
    subjects = [overlap.subject(f"fam/v{i}") for i in range(6)]
    t0 = time.monotonic()
    found = list(run_subjects(subjects, jobs=3))
    assert [f[0].path for f in found] == [s.label for s in subjects]
    assert overlap.most == 3 and time.monotonic() - t0 < 6 * overlap.seconds
    assert machine_cores() >= 1


def test_the_first_failing_subject_in_order_is_raised_and_the_rest_not_started():
    overlap = Overlap(0.05)
    started = []
    subjects = [overlap.subject("a"), overlap.subject("b", fail=True)] + [
        Subject(f"late{i}", lambda i=i: started.append(i) or time.sleep(0.05) or []) for i in range(50)]
    with pytest.raises(UserError, match="b cannot be judged"):
        list(run_subjects(subjects, jobs=2))
    assert len(started) < 10  # a build that cannot be judged stops the phase: no point building the rest


def test_a_failure_or_an_interrupt_kills_the_compilers_still_running_instead_of_waiting_for_them(tmp_path):
    from hazards.engine.proctree import start_in_group

    pids = tmp_path / "pids"

    def slow_compiler() -> list[Finding]:  # a compiler as the static checks start one (run_tool)
        proc = start_in_group(["sleep", "60"])
        pids.write_text(str(proc.pid))
        proc.communicate()
        return []

    def interrupted() -> list[Finding]:
        while not pids.exists():
            time.sleep(0.01)
        raise KeyboardInterrupt  # what a stop signal raises in the waiting thread

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        list(run_subjects([Subject("stopped", interrupted), Subject("slow", slow_compiler)], jobs=2))
    assert time.monotonic() - t0 < 20
    import psutil
    assert not psutil.pid_exists(int(pids.read_text())) or \
        psutil.Process(int(pids.read_text())).status() == psutil.STATUS_ZOMBIE


def test_a_non_tty_static_phase_writes_begin_interval_and_end_lines():
    stream = io.StringIO()  # not a terminal: lines, as a CI log gets them
    overlap = Overlap(0.4)
    with CampaignProgress(interval_s=0.3, stream=stream, terminal=False) as progress:
        list(run_subjects([overlap.subject(f"fam/v{i}") for i in range(4)], jobs=2, observer=progress))
    lines = stream.getvalue().splitlines()
    assert lines[0] == "hazards static checks: started: 4 to do, 2 at a time"
    middle = [line for line in lines[1:-1] if "compiling and checking fam/v" in line]
    assert middle and any(" done; ETA " in line for line in middle), lines
    assert lines[-1].startswith("hazards static checks: 4/4 done; finished in ")


def test_a_terminal_gets_a_live_bar_with_what_is_compiling_and_the_end_stays_on_screen():
    stream = io.StringIO()
    overlap = Overlap(0.5)
    with CampaignProgress(interval_s=30, stream=stream, terminal=True) as progress:
        list(run_subjects([overlap.subject(f"fam/v{i}") for i in range(3)], jobs=3, observer=progress))
    shown = stream.getvalue()
    assert "hazards static checks" in shown and "compiling and checking fam/v" in shown
    assert "3/3 done" in shown and "finished in" in shown


def test_hazards_static_shows_progress_lines_on_a_non_tty_stderr(capsys, tmp_path):
    main(["static", "--no-catalog", str(DATA / "moe_barrier_before.toml"), str(DATA / "moe_barrier_after.toml"),
          "--progress-interval", "5s"])
    err = capsys.readouterr().err
    assert "hazards static checks: started: 2 to do" in err
    assert "hazards static checks: 2/2 done; finished in " in err
    assert main(["static", "--no-catalog", str(DATA / "moe_barrier_after.toml"), "--progress-interval", "0"]) == 0
    assert "hazards static checks" not in capsys.readouterr().err


def test_hazards_check_static_shows_the_catalog_being_compiled(capsys, monkeypatch, tmp_path):
    overlap = Overlap(0.4)
    monkeypatch.setattr(static_catalog, "_catalog_subjects",
                        lambda families: iter([overlap.subject(f"fakefam/v{i}") for i in range(4)]))
    main(["check", "--static", "--progress-interval", "0.3s", "--store", str(tmp_path / "r.db")])
    err = capsys.readouterr().err
    assert "hazards static checks: started: 4 to do" in err
    assert "compiling and checking fakefam/v" in err and "hazards static checks: 4/4 done; finished in" in err
    assert overlap.most >= min(2, machine_cores())


def family(name: str):
    """A family with a launch server and two variants (nothing is built: `items_for` is faked)."""
    from hazards.family import Family, StaticVerdict, Variant

    return Family(name=name, summary="fake", binary=name, strategy=lambda: None,
                  static_model=lambda p: StaticVerdict(p.get("variant") == "broken", "fake"),
                  variants=(Variant("fixed", "fixed", "the fix"),
                            Variant("broken", "broken", "seeded", detected_by=("stress",))))


def fake_items_for(fam, variants):
    from hazards.engine.loop import WorkItem

    return [WorkItem(target=fam.name, variant=v.name, params={"variant": v.name}) for v in variants]


def test_family_launch_servers_are_built_in_parallel_with_progress_and_a_failed_build_is_that_familys(tmp_path):
    from hazards.checkrun import family_builds

    overlap = Overlap(0.4)

    def slow_items_for(fam, variants):
        overlap.subject(fam.name).check()  # a build's time
        if fam.name == "badfam":
            raise UserError("nvcc failed: badfam.cu:1: error")
        return fake_items_for(fam, variants)

    fams = [family("fam1"), family("badfam"), family("fam2")]
    stream = io.StringIO()
    with CampaignProgress(interval_s=0.3, stream=stream, terminal=False) as progress:
        built = family_builds(fams, lambda f: list(f.variants), slow_items_for, progress)
    assert [f.name for f, _ in built] == ["fam1", "badfam", "fam2"]
    assert [len(b) for f, b in built if f.name != "badfam"] == [2, 2]
    assert isinstance(built[1][1], UserError) and "nvcc failed" in str(built[1][1])
    assert overlap.most == min(3, machine_cores())
    lines = stream.getvalue().splitlines()
    assert lines[0] == f"hazards family builds: started: 3 to do, {min(3, machine_cores())} at a time"
    assert any("compiling fam" in line or "compiling badfam" in line for line in lines[1:-1]), lines
    assert lines[-1].startswith("hazards family builds: 3/3 done; finished in ")


def test_soak_shows_its_family_builds_and_stops_at_one_that_fails(tmp_path, capsys, monkeypatch):
    import hazards.families as families
    import hazards.stress_family as stress_family

    def build(fam, *args, **kw):
        time.sleep(0.5)
        raise UserError(f"cannot build {fam.name}: nvcc failed")

    monkeypatch.setenv("HZ_FAKE_GPUS", "0")
    monkeypatch.setenv("HZ_LEASE_DIR", str(tmp_path / "leases"))
    monkeypatch.setattr(families, "all_families", lambda: [family("fakefam")])
    monkeypatch.setattr(stress_family, "family_item", build)
    rc = main(["soak", "--budget", "2s", "--progress-interval", "0.2s", "--store", str(tmp_path / "r.db")])
    err = capsys.readouterr().err
    assert rc == 2 and "hazards: error: cannot build fakefam: nvcc failed" in err
    assert "hazards family builds: started: 1 to do" in err and "compiling fakefam launch server" in err
