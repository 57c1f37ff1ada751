"""A test suite started with Ctrl-C ignored still gives the tests' children Ctrl-C
(tests/conftest.py): the tests that interrupt a `hazards` child would otherwise wait out
their deadlines, minutes in all."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_a_child_of_a_test_takes_ctrl_c():
    code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_session_started_with_ctrl_c_ignored_still_passes_it_to_the_tests_children():
    if os.environ.get("HZ_INNER_SIGINT_SESSION"):
        return  # the inner session runs only the test above
    env = {**os.environ, "HZ_INNER_SIGINT_SESSION": "1", "PYTHONPATH": str(REPO)}
    for k in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           f"{Path(__file__).relative_to(REPO)}::test_a_child_of_a_test_takes_ctrl_c"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
