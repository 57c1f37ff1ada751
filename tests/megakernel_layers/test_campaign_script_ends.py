"""ci/gpu/layers-campaign.sh on the CPU: every mode ends once its tools end, and the modes that
compare two builds' dumps compare the kernels' outputs.

The script sends its output through `exec > >(tee console.log)`; a bare `wait` then waits for
that tee as well (bash 5.2), which ends only when the script does: the mode hangs until the
device call's outer timeout and copies nothing to $OUT. Round 9's stepe-quick had one after its
builds. Here each mode runs on the CPU with stand-ins for python3, nvidia-smi, nvcc and
compute-sanitizer that exit at once (every build then fails, every step is skipped or fails
fast): the mode must reach its last line ("done") within seconds.

A `--dump` file holds the kernel's output (D floats) and then the binary's reference (D floats,
the same for every build). Compared whole, the identical reference half dilutes the cosine the
mode prints for two builds whose outputs differ (about halves 1 - cos)."""
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


def _compare_snippets() -> list[str]:
    """The inline Python of each `python3 - ... <<'EOF'` block that compares dumps."""
    blocks = re.findall(r"<<'EOF'[^\n]*\n(.*?)\nEOF\n", SCRIPT.read_text(), re.S)
    return [b for b in blocks if "array(" in b and "cos" in b]


SNIPPETS = _compare_snippets()


def test_the_script_has_the_two_dump_comparisons():
    assert len(SNIPPETS) >= 2, len(SNIPPETS)  # stepc / stepd-quick's and stepe-quick's


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[f"comparison-{i}" for i in range(len(SNIPPETS))])
def test_the_dump_comparisons_print_the_outputs_cosine_not_the_whole_dumps(snippet, tmp_path):
    """Two dumps whose outputs differ and whose references are the same: the printed cosine is
    the outputs' one. A snippet reads either two dump paths (argv 1, 2) or a folder of
    dump_NAME.f32 (its candidate: `X = dump("NAME")`, compared with every other build first)."""
    import math
    import sys
    from array import array

    d = 2880
    ref = [math.sin(i) for i in range(d)]
    out_a = [math.cos(i) for i in range(d)]
    out_b = [x + (0.01 if i % 7 == 0 else 0.0) for i, x in enumerate(out_a)]
    dot = sum(x * y for x, y in zip(out_a, out_b))
    want = dot / (math.fsum(x * x for x in out_a) ** 0.5 * math.fsum(y * y for y in out_b) ** 0.5)

    def write(name: str, out: list[float]) -> Path:
        path = tmp_path / f"dump_{name}.f32"
        path.write_bytes(array("f", out + ref).tobytes())
        return path

    if "sys.argv[1:3]" in snippet:
        argv = [str(write("a", out_a)), str(write("b", out_b)), "the candidate"]
    else:
        [candidate] = re.findall(r'= dump\("(\w+)"\)', snippet)
        for name in set(re.findall(r'"(\w+)"', snippet)) - {candidate}:
            write(name, out_a)
        write(candidate, out_b)
        argv = [str(tmp_path)]
    run = subprocess.run([sys.executable, "-", *argv], input=snippet, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    line = run.stdout.splitlines()[0]
    cos = float(re.search(r"cos ([0-9.]+)", line).group(1))
    assert abs(cos - want) < 2e-9, (line, want)
    assert f"{d} / {d}" in line, line  # the output's floats, not the dump's 2 x D
