"""Every mode of ci/gpu/layers-campaign.sh ends once its tools end.

The script sends its output through `exec > >(tee console.log)`; a bare `wait` then waits for
that tee as well (bash 5.2), which ends only when the script does: the mode hangs until the
device call's outer timeout and copies nothing to $OUT. Round 9's stepe-quick had one after its
builds. Here each mode runs on the CPU with stand-ins for python3, nvidia-smi, nvcc and
compute-sanitizer that exit at once (every build then fails, every step is skipped or fails
fast): the mode must reach its last line ("done") within seconds."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hazards.engine.proctree import run_in_group

SCRIPT = Path(__file__).resolve().parents[2] / "ci" / "gpu" / "layers-campaign.sh"
MODES = sorted(set(re.findall(r'"\$WHAT" = ([a-z][a-z-]*) \]', SCRIPT.read_text())) | {"gate", "rest"})


def test_the_modes_read_from_the_script_include_the_rounds_since_round_8():
    assert {"promote", "stepe-quick", "stepd-quick", "ringsmem"} <= set(MODES), MODES


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="no bash/timeout")
@pytest.mark.parametrize("mode", MODES)
def test_the_mode_ends_when_its_tools_end(mode, tmp_path):
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for tool in ("python3", "nvidia-smi", "nvcc", "compute-sanitizer"):
        (stubs / tool).write_text("#!/bin/sh\nexit 0\n")
        (stubs / tool).chmod(0o755)
    env = dict(os.environ, PATH=f"{stubs}{os.pathsep}{os.environ['PATH']}", OUT=str(tmp_path / "out"),
               TMPDIR=str(tmp_path), BUDGET="60")
    try:  # the whole group (the script, its tee, its background jobs) is killed on the timeout
        run = run_in_group(["bash", str(SCRIPT), mode], 45, env=env, text=True, errors="replace")
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"{mode}: still running after 45 s with every tool ended; last output: {out[-600:]}")
    assert re.search(r"^== \[\d+s\] done$", run.stdout, re.M), run.stdout[-800:]
