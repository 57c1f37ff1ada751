"""Run a probe as the tool of a phase that is ended while the probe's tool hangs (the tests of
toolchain and userbuild probes: abandoning a phase must end them)."""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

from hazards.engine.proctree import ToolGroups


def in_a_killed_phase(probe: Callable[[], Any], stray_sleep) -> Any:
    """`probe()` in a phase of its own (a thread), ended (`ToolGroups.kill`, what abandoning
    the static part does) once the probe's tool runs `stray_sleep`; what the probe answered.
    Fails when the tool was left running or the probe did not return."""
    phase = ToolGroups()
    answers: list[Any] = []

    def work() -> None:
        with phase.current():
            answers.append(probe())

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    deadline = time.monotonic() + 20
    while not stray_sleep.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stray_sleep.running(), "the probe never ran its tool"
    phase.kill()
    worker.join(10)
    left = stray_sleep.left()
    worker.join(10)
    assert not left, "ending the phase left the probe's tool running"
    assert not worker.is_alive() and answers, "the probe did not return once its tool was killed"
    return answers[0]
