"""The progress display of every command that runs campaigns (run, repro, stress, check, soak).

`CampaignProgress` is the loop's `RunObserver` (`hazards.engine.campaign`): the frame tells
it when a campaign's loop begins (what it plans, what is stored already), when each run
starts on a GPU, when each run is committed, and how the campaign ended. It shows the
counts per outcome, the failure rate with its interval in the one rate format
(`hazards.engine.stats.format_rate`) over the runs expected clean, the canaries detected so
far, runs per second, the time left (ETA for a number of runs, the budget for a soak or
a check) and what runs now on which GPU. More in docs/cli.md.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import threading
import time
from typing import Any, Callable, TextIO

from hazards.engine.campaign import LoopStart
from hazards.engine.leases import GpuLease
from hazards.engine.outcome import OUTCOMES, Outcome, RunResult
from hazards.engine.stats import format_rate
from hazards.engine.store import empty_counts, storable_text
from hazards.engine.loop import WorkItem
from hazards.engine.verdict import Expect

DEFAULT_INTERVAL_S = 30.0
OUTCOME_STYLE = {"clean": "green", "hang": "magenta", "fault": "red", "mismatch": "yellow", "error": "cyan"}


def format_duration(seconds: float) -> str:
    """'42s', '5m07s', '2h03m' (whole seconds; '∞' for no limit)."""
    if not math.isfinite(seconds):
        return "∞"
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def lease_label(lease: GpuLease) -> str:
    """'GPU 0' (the CUDA_VISIBLE_DEVICES entry the run got), or 'no GPU'."""
    return f"GPU {lease.gpu}" if lease.is_gpu else "no GPU"


@dataclasses.dataclass
class _Campaign:
    """Where one campaign stands, as the progress display sees it."""

    start: LoopStart
    began: float
    counts: dict[str, int]
    expect: dict[str, Expect | None]
    proofs: dict[str, Any]
    ran_now: int = 0
    launches: int = 0
    mismatched: int = 0      # launches the device's validation flagged (family servers report them)
    clean_failures: int = 0  # failures of runs of items expected clean (or with no expectation)
    clean_judged: int = 0
    detected: set[str] = dataclasses.field(default_factory=set)
    now: dict[str, str] = dataclasses.field(default_factory=dict)  # lease label -> item key
    status: str | None = None
    stop_reason: str | None = None
    ended: float | None = None

    @property
    def n(self) -> int:
        return sum(self.counts.values())

    @property
    def canaries(self) -> list[str]:
        return [k for k, e in self.expect.items() if e is Expect.DETECT]


@dataclasses.dataclass
class _Steps:
    """Where a phase of steps (the static checks' subjects) stands."""

    what: str
    total: int
    workers: int
    doing: str
    began: float
    done: int = 0
    now: list[str] = dataclasses.field(default_factory=list)  # in the order they started
    ended: float | None = None


class StepPhase:
    """One phase's StepObserver on a `CampaignProgress` (`CampaignProgress.phase()`)."""

    def __init__(self, progress: "CampaignProgress") -> None:
        self.progress = progress
        self._steps: _Steps | None = None

    def steps_begin(self, what: str, total: int, workers: int, doing: str = "compiling and checking") -> None:
        self._steps = self.progress._open_steps(what, total, workers, doing)

    def step_started(self, label: str) -> None:
        self.progress._step_started(self._steps, label)

    def step_finished(self, label: str) -> None:
        self.progress._step_finished(self._steps, label)

    def steps_end(self) -> None:
        self.progress._end_steps(self._steps)


class CampaignProgress:
    """Live progress of the campaigns run inside it (a `RunObserver`; a context manager).

    `stream` defaults to sys.stderr; `terminal` to whether that stream is a terminal.
    `clock` is the monotonic clock (tests pass a fake one).
    """

    def __init__(self, *, interval_s: float = DEFAULT_INTERVAL_S, stream: TextIO | None = None,
                 terminal: bool | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if interval_s < 0 or not math.isfinite(interval_s):
            raise ValueError(f"interval_s must be >= 0 and finite, got {interval_s!r}")
        self.interval_s = interval_s
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = interval_s > 0
        self.terminal = bool(self.stream.isatty()) if terminal is None else terminal
        self.clock = clock
        self._mu = threading.RLock()
        self._campaign: _Campaign | None = None
        self._steps: list[_Steps] = []  # the phases open now (check's static part beside its builds)
        self._default: _Steps | None = None  # the phase this object's own steps_* calls drive
        self._live: Any = None
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> "CampaignProgress":
        if not self.enabled:
            return self
        if self.terminal:
            from rich.console import Console
            from rich.live import Live

            console = Console(file=self.stream, force_terminal=True, stderr=self.stream is sys.stderr)
            # stderr written during the display goes above it; stdout is never moved to stderr
            self._live = Live(get_renderable=self._render, console=console, refresh_per_second=4,
                              transient=False, redirect_stdout=False)
            self._live.start()
        else:
            self._ticker = threading.Thread(target=self._tick, name="hz-progress", daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
            self._ticker = None
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _tick(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._mu:
                for st in self._steps:
                    self._write(self._steps_line(st))
                c = self._campaign
                if c is not None and c.status is None:
                    self._write(self.status_line())

    def _write(self, line: str) -> None:
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stderr must not stop a campaign
            pass

    # -- the observer ----------------------------------------------------------------------
    def begin(self, start: LoopStart) -> None:
        with self._mu:
            previous = self._campaign
            if previous is not None and self._live is not None:
                self._live.console.print(self._render_campaign())  # the finished campaign stays on screen
            self._campaign = _Campaign(start, self.clock(), dict(start.counts) or empty_counts(),
                                       {i.key: i.expectation for i in start.items},
                                       {i.key: i.proof for i in start.items})
            if self.enabled and not self.terminal:
                self._write(self._begin_line())

    def started(self, lease: GpuLease, item: WorkItem) -> None:
        with self._mu:
            if self._campaign is not None:
                self._campaign.now[lease_label(lease)] = item.key

    def finished(self, seq: int, item: WorkItem, result: RunResult) -> None:
        outcome = Outcome(result.outcome)
        with self._mu:
            c = self._campaign
            if c is None:
                return
            c.counts[outcome.value] = c.counts.get(outcome.value, 0) + 1
            c.ran_now += 1
            metrics = result.metrics or {}
            for name in ("launches", "mismatched"):
                value = metrics.get(name)
                if isinstance(value, int) and value > 0:
                    setattr(c, name, getattr(c, name) + value)
            expect = c.expect.get(item.key, item.expectation)
            if expect is Expect.DETECT:
                if outcome is not Outcome.ERROR and item.proof.proves(result):
                    c.detected.add(item.key)
            elif outcome is not Outcome.ERROR:
                c.clean_judged += 1
                c.clean_failures += int(outcome.is_failure)

    def end(self, status: str, stop_reason: str | None) -> None:
        with self._mu:
            c = self._campaign
            if c is None:
                return
            c.status, c.stop_reason, c.ended = status, stop_reason, self.clock()
            for key in list(c.now):
                c.now.pop(key)
            if self.enabled and not self.terminal:
                self._write(self.status_line())

    # -- the static phase (hazards.static.runner.StepObserver) -----------------------------------
    def steps_begin(self, what: str, total: int, workers: int, doing: str = "compiling and checking") -> None:
        self._default = self._open_steps(what, total, workers, doing)

    def step_started(self, label: str) -> None:
        self._step_started(self._default, label)

    def step_finished(self, label: str) -> None:
        self._step_finished(self._default, label)

    def steps_end(self) -> None:
        self._end_steps(self._default)

    def phase(self) -> "StepPhase":
        """A StepObserver of its own, for a phase that runs beside this object's other work
        (`hazards check`'s static part beside its family builds and GPU campaign): each
        open phase gets its line, and the campaign keeps its own."""
        return StepPhase(self)

    def _open_steps(self, what: str, total: int, workers: int, doing: str) -> _Steps:
        with self._mu:
            st = _Steps(what, total, workers, doing, self.clock())
            self._steps.append(st)
            if self.enabled and not self.terminal:
                self._write(f"hazards {what}: started: {total} to do, {workers} at a time")
            return st

    def _step_started(self, st: _Steps | None, label: str) -> None:
        with self._mu:
            if st is not None:
                st.now.append(label)

    def _step_finished(self, st: _Steps | None, label: str) -> None:
        with self._mu:
            if st is not None:
                st.done += 1
                if label in st.now:
                    st.now.remove(label)

    def _end_steps(self, st: _Steps | None) -> None:
        with self._mu:
            if st is None or st.ended is not None:
                return
            st.ended = self.clock()
            if self.enabled and not self.terminal:
                self._write(self._steps_line(st))
            if self._live is not None:
                self._live.console.print(self._render_steps(st))  # the finished phase stays on screen
            if st in self._steps:
                self._steps.remove(st)

    def _steps_parts(self, st: _Steps) -> dict[str, str]:
        elapsed = (st.ended if st.ended is not None else self.clock()) - st.began
        out = {"n": f"{st.done}/{st.total} done"}
        if st.ended is not None:
            out["left"] = f"finished in {format_duration(elapsed)}"
            return out
        if st.done:
            out["left"] = f"ETA {format_duration((st.total - st.done) * elapsed / st.done)}"
        else:
            out["left"] = f"ETA after the first one ({format_duration(elapsed)} so far)"
        if st.now:
            shown = st.now[:4] + ([f"{len(st.now) - 4} more"] if len(st.now) > 4 else [])
            out["now"] = f"{st.doing} " + ", ".join(shown)
        return out

    def _steps_line(self, st: _Steps) -> str:
        p = self._steps_parts(st)
        return f"hazards {st.what}: " + "; ".join([p.pop("n"), *p.values()])

    # -- what is shown -----------------------------------------------------------------------
    def _name(self, c: _Campaign) -> str:
        s = c.start
        what = storable_text(s.items[0].key) if len(s.items) == 1 else f"{len(s.items)} items"
        return f"hazards {s.kind} #{s.campaign_id} {what}"  # non-UTF-8 bytes as the store shows them

    def _begin_line(self) -> str:
        c = self._campaign
        assert c is not None
        s = c.start
        gpus = [lease_label(lease) for lease in s.leases]
        plan = [f"{s.total} runs" if s.total is not None else "",
                f"budget {format_duration(s.budget_s)}" if math.isfinite(s.budget_s) else "",
                f"{c.n} stored before" if c.n else ""]
        return f"{self._name(c)}: started on {', '.join(gpus)}" + "".join(f"; {p}" for p in plan if p)

    def _parts(self, c: _Campaign) -> dict[str, str]:
        """The pieces of the status, each a complete phrase."""
        s = c.start
        elapsed = (c.ended if c.ended is not None else self.clock()) - c.began
        n = c.n
        out: dict[str, str] = {}
        out["runs"] = f"{n}/{s.total} runs" if s.total is not None else f"{n} runs"
        out["counts"] = ", ".join(f"{o.value} {c.counts.get(o.value, 0)}" for o in OUTCOMES)
        if c.clean_judged or not c.canaries:
            out["rate"] = "failure rate " + format_rate(c.clean_failures, c.clean_judged)
            if c.canaries:
                out["rate"] += " (variants expected clean)"
        if c.canaries:
            out["canaries"] = f"canaries detected {len(c.detected)}/{len(c.canaries)}"
        speed = c.ran_now / elapsed if elapsed > 0 else 0.0
        if speed >= 1 or speed == 0:
            out["speed"] = f"{speed:.1f} runs/s over {format_duration(elapsed)}"
        else:
            out["speed"] = f"{1 / speed:.1f} s/run over {format_duration(elapsed)}"
        if c.launches:
            per_s = c.launches / max(elapsed, 1e-9)
            out["speed"] += f", {c.launches:,} launches ({per_s:,.0f}/s)" if per_s >= 10 else \
                f", {c.launches:,} launches ({per_s:.2g}/s)"
            if c.mismatched:
                out["speed"] += f", {c.mismatched:,} mismatched"
        if c.status is not None:
            out["left"] = c.status + (f": {c.stop_reason}" if c.stop_reason else "")
        else:
            left = []
            if s.total is not None and c.ran_now:
                left.append(max(0, s.total - n) * elapsed / c.ran_now)
            if math.isfinite(s.budget_s):
                left.append(max(0.0, s.budget_s - elapsed))
            if left:
                out["left"] = f"ETA {format_duration(min(left))}"
            if c.now and len(s.items) == 1:
                out["now"] = "running on " + ", ".join(sorted(c.now))
            elif c.now:
                out["now"] = "now " + ", ".join(f"{key} on {gpu}" for gpu, key in sorted(c.now.items()))
        return out

    def status_line(self) -> str:
        """The campaign's state as one complete line (what a CI log gets)."""
        with self._mu:
            c = self._campaign
            if c is None:
                return "hazards: no campaign started yet"
            p = self._parts(c)
            head = f"{self._name(c)}: {p.pop('runs')} ({p.pop('counts')})"
            return "; ".join([head, *p.values()])

    def _render_steps(self, st: _Steps) -> Any:
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        p = self._steps_parts(st)
        head = Table.grid(padding=(0, 1))
        head.add_row(Text(f"hazards {st.what}", style="bold"),
                     ProgressBar(total=max(st.total, 1), completed=st.done, width=20), Text(p.pop("n")),
                     Text(p.pop("left"), style="bold" if st.ended is None else ""))
        grid = Table.grid()
        grid.add_row(head)
        grid.add_row(Text(p.get("now", ""), overflow="fold"))
        return grid

    def _render(self) -> Any:
        """The terminal display: each open phase, then the campaign: a bar, the counts in
        colour, the rate, ETA and what runs now."""
        from rich.console import Group

        with self._mu:
            shown = [self._render_steps(st) for st in self._steps]
            if self._campaign is not None:
                shown.append(self._render_campaign())
            return Group(*shown)

    def _render_campaign(self) -> Any:
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        with self._mu:
            c = self._campaign
            if c is None:
                return Text("")
            s = c.start
            p = self._parts(c)
            elapsed = (c.ended if c.ended is not None else self.clock()) - c.began
            if s.total is not None:
                bar = ProgressBar(total=s.total, completed=c.n, width=20)
            elif math.isfinite(s.budget_s):
                bar = ProgressBar(total=s.budget_s, completed=min(elapsed, s.budget_s), width=20)
            else:
                bar = ProgressBar(total=None, width=20)
            head = Table.grid(padding=(0, 1))
            head.add_row(Text(self._name(c), style="bold"), bar, Text(p.pop("runs")),
                         Text(p.pop("left", ""), style="bold" if c.status is None else ""))
            counts = Text("  ").join(Text(f"{o.value} {c.counts.get(o.value, 0)}", style=OUTCOME_STYLE[o.value])
                                     for o in OUTCOMES)
            p.pop("counts")
            grid = Table.grid()
            grid.add_row(head)
            grid.add_row(counts)
            grid.add_row(Text("; ".join(p.values())))
            return grid
