"""A command target: any program, one process per run, judged by how it ended.

The program gets its run parameters as JSON in the environment variable `HZ_PARAMS`
(plus `HZ_LAUNCHES` when a launch count is given, and `HZ_ARTIFACT_DIR` when the run has
an artifact folder). No shell is ever involved: argv goes to exec as given.
"""
from __future__ import annotations

import copy
import json
import re
import time
from pathlib import Path
from typing import Any

from ..classify import DEFAULT_FAITHFUL_COS_MIN, NOTABLE_RE, classify_exit
from ..errors import UserError
from ..forensics.collector import hang_reason
from ..outcome import Outcome, RunResult
from ..progress import Progress, RunProgress, stall_reason
from ..targets.base import (Target, check_argv, check_cwd, check_env, check_grace,
                                 check_launches, check_params, check_stall, check_timeout, cut_short,
                                 default_name, prepare_artifact_dir)
from ..watchdog import Supervised

EVIDENCE_TAIL_CHARS = 4000  # of each stream, kept in the evidence of non-clean runs


def tail_text(data: bytes, chars: int = EVIDENCE_TAIL_CHARS) -> str:
    """The last `chars` characters of a byte stream, decoded leniently."""
    text = data.decode("utf-8", "replace")
    return text[-chars:]


class CommandTarget(Target):
    """Run `argv` once per `run()`; classify by exit status, signal, output and result line.

    `env` is laid over this process's environment. `result_regex`, if given, is searched
    in every byte of stdout and stderr as they stream (like result lines: a match that
    scrolled out of the kept tail still counts; within one line): a match marks the run a
    `mismatch` (its named groups are kept as evidence), e.g.
    ``r"MISMATCH|max_err=(?P<max_err>\\S+) FAIL"``.
    `grace_s` is the time between SIGTERM and SIGKILL when a run must be killed.
    `faithful_cos_min`: a FAITHFUL_RESULT line whose cos is below it makes the run a mismatch.
    Bad input (missing program, bad cwd, bad regex) raises UserError here, before any run.
    """

    def __init__(self, argv: list[str], *, env: dict[str, str] | None = None,
                 cwd: str | Path | None = None, name: str | None = None,
                 result_regex: str | re.Pattern[str] | None = None,
                 grace_s: float = 2.0, faithful_cos_min: float = DEFAULT_FAITHFUL_COS_MIN) -> None:
        self.cwd = check_cwd(cwd)
        self.env = check_env(env)
        self.argv = check_argv(argv, self.cwd, self.env)
        self.name = name or default_name(self.argv)
        self.grace_s = check_grace(grace_s)
        if not -1.0 <= faithful_cos_min <= 1.0:
            raise UserError(f"the FAITHFUL_RESULT cos threshold must be in [-1, 1], got {faithful_cos_min!r}")
        self.faithful_cos_min = float(faithful_cos_min)
        try:
            self.result_regex = (re.compile(result_regex, re.MULTILINE)
                                 if isinstance(result_regex, str) else result_regex)
        except re.error as exc:
            raise UserError(f"bad result regex {result_regex!r}: {exc}") from None
        # The drains look for the regex's matches in every byte, like for result lines.
        self._notable = NOTABLE_RE.with_pattern(self.result_regex) if self.result_regex else NOTABLE_RE

    def with_prefix(self, prefix: list[str], *, name: str | None = None) -> "CommandTarget":
        """This command run through another program (a sanitizer, a profiler): the same
        environment, working directory and result rules, with argv `prefix + argv`."""
        other = copy.copy(self)
        other.argv = check_argv(list(prefix) + self.argv, self.cwd, self.env)
        other.name = name or self.name
        return other

    def run(self, params: dict[str, Any] | None = None, *, timeout: float,
            launches: int | None = None, artifact_dir: Path | None = None,
            stall: float | None = None, cutoff: float | None = None) -> RunResult:
        """Start the program, wait up to `timeout` s, kill its whole tree, judge the run.

        With `stall`, a run that showed progress (docs/stall.md) and then none for `stall`
        seconds is a hang at once (reason "no progress for ..."), the timeout the backstop.
        At `cutoff` (time.monotonic(), the campaign's budget end) a run still going is
        killed unjudged (`cut_short`)."""
        timeout = check_timeout(timeout)
        stall = check_stall(stall)
        params = check_params(params)
        launches = check_launches(launches)
        artifacts = prepare_artifact_dir(artifact_dir)
        env = dict(self.env)
        try:
            env["HZ_PARAMS"] = json.dumps(params)
        except (TypeError, ValueError) as exc:
            raise UserError(f"params are not JSON-serialisable: {exc}") from None
        if launches is not None:
            env["HZ_LAUNCHES"] = str(launches)
        if artifacts is not None:
            env["HZ_ARTIFACT_DIR"] = str(artifacts.resolve())

        with RunProgress(env) as watched:
            started_at = time.time()
            t0 = time.monotonic()
            try:
                child = Supervised(self.argv, env=env, cwd=self.cwd, target=self.name,
                                   log_dir=artifacts, grace_s=self.grace_s,
                                   notable_re=self._notable, progress=watched.progress)
            except OSError as exc:
                raise UserError(f"cannot start {self.argv[0]}: {exc.strerror or exc}") from None
            try:
                clipped = cutoff is not None and cutoff < t0 + timeout
                state = child.watch(min(t0 + timeout, cutoff) if clipped else t0 + timeout, stall)
                exited = state == "exited"
                duration = time.monotonic() - t0
                if state == "timeout" and clipped:
                    child.kill()
                    return cut_short(self.name, params, started_at, duration)
                if exited:
                    watched.progress.finish()
                    kill_evidence = child.kill()  # leftovers the program left behind
                else:
                    stalled = stall_reason(watched.progress.stalled_for() or 0.0, watched.progress.last_label()) \
                        if state == "stall" else None
                    kill_evidence = child.hang(artifacts)
            finally:
                child.kill()  # idempotent; also runs if a collector or wait raised
        outcome, reason, evidence = classify_exit(
            child.proc.returncode if exited else None, child.stdout_text(), child.stderr_text(),
            timed_out=not exited, timeout=timeout, result_regex=self.result_regex,
            faithful_cos_min=self.faithful_cos_min)
        unstartable = child.exec_failure() if exited else None
        if unstartable:  # as if exec had failed in Popen: the program never ran
            outcome, reason = Outcome.ERROR, f"cannot start {self.argv[0]}: {unstartable}"
            evidence["error_kind"] = "target_start"
        evidence.update(kill_evidence)
        if watched.progress.events:
            evidence["progress"] = watched.progress.summary()
        if not exited and stalled:
            reason, evidence["error_kind"] = stalled, "stall"
            evidence["stall_s"] = stall
        if outcome is Outcome.HANG:
            reason = hang_reason(reason, evidence)  # where it is stuck, when a collector saw it
        evidence["pid"] = child.pid
        if kill_evidence.get("killed") and exited:
            evidence["leftovers"] = kill_evidence["killed"]
        log_errors = [d.log_error for d in (child.stdout_drain, child.stderr_drain)
                      if d.log_error]
        if log_errors:
            evidence["log_errors"] = log_errors
        if outcome is not Outcome.CLEAN:
            evidence["stdout_tail"] = tail_text(child.stdout_drain.tail())
            evidence["stderr_tail"] = tail_text(child.stderr_drain.tail())
        metrics = dict(evidence["result"]["payload"]) if "result" in evidence else {}
        return RunResult(
            outcome=outcome, reason=reason, target=self.name,
            variant=str(params.get("variant", "")), params=params, evidence=evidence,
            metrics=metrics, started_at=started_at, duration_s=duration,
            artifact_dir=str(artifacts) if artifacts else None,
            error_kind=evidence.get("error_kind"))
