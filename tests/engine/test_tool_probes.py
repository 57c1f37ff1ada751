"""The toolchain's probes of installed tools (stress/toolchain.py, hazards/static/userbuild.py):
run as tools of their phase (killed when it ends), and an answer given while a probed tool was
killed is not kept (proctree.cache_unless_killed)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hazards.engine import toolchain
from hazards.engine.errors import ToolchainMissing
from hazards.engine.proctree import cache_unless_killed, run_in_group
from hazards.static import userbuild
from killed_phase import in_a_killed_phase


def hangs_once(tmp_path: Path, stray_sleep, answer: str = "") -> Path:
    """A tool that hangs on its first run (the stray sleep) and later prints `answer` (for
    `-print-targets`: an AMDGPU target line) and succeeds; `tmp_path/runs` counts its runs."""
    fake = tmp_path / "clang"
    fake.write_text(f"#!/bin/sh\necho run >> {tmp_path}/runs\n"
                    f"[ -e {tmp_path}/ran ] || {{ touch {tmp_path}/ran; {stray_sleep.command}; }}\n"
                    f'case "$*" in *-print-targets*) echo "  amdgcn - AMD GCN GPUs";; esac\n'
                    f"echo '{answer}'\nexit 0\n")
    fake.chmod(0o755)
    return fake


def runs(tmp_path: Path) -> int:
    return len((tmp_path / "runs").read_text().split())


def _version_or_missing(tool: str) -> str:
    try:
        return toolchain.tool_version.__wrapped__(tool)
    except ToolchainMissing as e:
        return str(e)


TOOLCHAIN_PROBES = {  # each runs the tool `tool` once
    "amdgpu backend": lambda tool: toolchain._has_amdgpu_backend(tool),
    "clang targets": lambda tool: toolchain._clang_targets.__wrapped__(tool, toolchain.GFX942),
    "version": _version_or_missing,
}


@pytest.mark.parametrize("probe", TOOLCHAIN_PROBES.values(), ids=TOOLCHAIN_PROBES.keys())
def test_ending_a_phase_kills_the_toolchains_probes(probe, tmp_path, stray_sleep):
    """find_tool's capability probes and tool_version run the tool as a tool of the phase that
    asked (run_in_group), as userbuild's probes do: abandoning the phase ends them."""
    fake = hangs_once(tmp_path, stray_sleep)
    in_a_killed_phase(lambda: probe(str(fake)), stray_sleep)


def test_a_version_whose_tool_was_killed_names_no_release(tmp_path, stray_sleep):
    """A killed `--version` printed nothing that names a release: tool_version says it failed
    (as on its time limit) instead of giving an empty version to a build's cache key."""
    fake = hangs_once(tmp_path, stray_sleep, answer="clang version 99.0")
    toolchain.tool_version.cache_clear()
    try:
        assert "killed" in in_a_killed_phase(lambda: _version_or_missing(str(fake)), stray_sleep)
        assert toolchain.tool_version(str(fake)) == "clang version 99.0"
    finally:
        toolchain.tool_version.cache_clear()


def test_a_clang_whose_probe_was_killed_is_probed_again_by_the_next_lookup(tmp_path, monkeypatch, stray_sleep):
    """A probe killed with its phase answers "cannot do the job"; find_tool kept that answer
    for the process's life (a soak's would never find clang again). The next lookup probes
    again and finds it; a lookup answered by tools that finished is kept (no third run)."""
    fake = hangs_once(tmp_path, stray_sleep)
    monkeypatch.setenv("HZ_CLANG", str(fake))
    toolchain.find_tool.cache_clear()
    toolchain._clang_targets.cache_clear()
    try:
        def lookup() -> str:
            try:
                return toolchain.find_tool("clang")
            except ToolchainMissing as e:
                return str(e)

        assert "cannot do the job" in in_a_killed_phase(lookup, stray_sleep)
        assert toolchain.find_tool("clang") == str(fake)
        ran = runs(tmp_path)
        assert toolchain.find_tool("clang") == str(fake)
        assert runs(tmp_path) == ran
    finally:
        toolchain.find_tool.cache_clear()
        toolchain._clang_targets.cache_clear()


def test_a_userbuild_probe_killed_with_its_phase_asks_again_next_time(tmp_path, stray_sleep):
    """userbuild's cached probes (here the wavefront-size macro) keep no fallback of a killed
    tool either: the static part of a later check asks clang again."""
    fake = hangs_once(tmp_path, stray_sleep)
    userbuild.wavefront_size_args.cache_clear()
    try:
        assert in_a_killed_phase(lambda: userbuild.wavefront_size_args(str(fake)), stray_sleep) == ()
        assert userbuild.wavefront_size_args(str(fake)) == ("-D__AMDGCN_WAVEFRONT_SIZE=64",)
    finally:
        userbuild.wavefront_size_args.cache_clear()


def test_a_probe_past_its_time_limit_is_asked_again_and_a_finished_one_is_kept(tmp_path, stray_sleep):
    """cache_unless_killed: the fallback of a tool killed at its time limit is returned but
    not kept, also by a probe that asked through another probe; a finished answer is kept."""
    fake = hangs_once(tmp_path, stray_sleep, answer="the answer")

    @cache_unless_killed
    def inner(tool: str) -> str:
        try:
            return run_in_group([tool], 1.0, text=True).stdout.strip()
        except Exception:
            return "fallback"

    @cache_unless_killed
    def outer(tool: str) -> str:
        return f"outer: {inner(tool)}"

    try:
        assert outer(str(fake)) == "outer: fallback"
        assert not stray_sleep.left(), "the timed-out tool was left running"
        assert outer(str(fake)) == "outer: the answer"
        assert outer(str(fake)) == "outer: the answer" and inner(str(fake)) == "the answer"
        assert runs(tmp_path) == 2
    finally:
        stray_sleep.left()


def test_a_tool_killed_at_its_time_limit_hands_over_what_it_printed(stray_sleep):
    """run_in_group's TimeoutExpired holds the text the tool printed before the kill, as
    subprocess.run's does (a GPU recording script keeps a timed-out cuda-gdb's output)."""
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        run_in_group(["sh", "-c", f"echo so far; echo err >&2; {stray_sleep.command}"], 1.0, text=True)
    assert not stray_sleep.left()
    assert (timed_out.value.stdout, timed_out.value.stderr) == ("so far\n", "err\n")
