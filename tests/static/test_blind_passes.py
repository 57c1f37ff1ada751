"""A static check that could not look never passes.

With clang-19, nvcc or the disassembler missing, `hazards static` and `hazards check` used to
print "0 static canaries detected" and exit 0, and the JUnit file showed one passing test.
Now every variant (and path) that could not be judged is named with the reason and how to
install what is missing, the command exits 3, and JUnit has an error case for each; only
`--skip TOOL` (or `--skip static`) turns them into skipped cases, and never into passed ones.

The tools are hidden the way a machine without them looks: PATH without them, and none in
the CUDA folders or the pip wheels the toolchain module also searches.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hazards.cli import main
from hazards.engine import toolchain

HIDDEN = {"clang": toolchain.TOOLS["clang"].programs, "nvcc": ("nvcc",), "nvdisasm": ("nvdisasm", "cuobjdump")}


@pytest.fixture
def hide(tmp_path, monkeypatch):
    """hide('clang', ...): PATH keeps every program but those tools (a folder of links to
    the rest), and the CUDA folders and NVIDIA wheels hold none."""
    def hide_tools(*names: str) -> None:
        gone = {prog for n in names for prog in HIDDEN[n]}
        shim = tmp_path / "bin"
        shim.mkdir(exist_ok=True)
        for folder in os.environ.get("PATH", "").split(os.pathsep):
            if not os.path.isdir(folder):
                continue
            for entry in os.scandir(folder):
                link = shim / entry.name
                if entry.name not in gone and not link.exists() and not link.is_symlink():
                    link.symlink_to(entry.path)
        monkeypatch.setenv("PATH", str(shim))
        for var in ("HZ_CLANG", "HZ_NVCC", "HZ_NVDISASM", "HZ_CUOBJDUMP", "CUDA_HOME", "CUDA_PATH"):
            monkeypatch.delenv(var, raising=False)
        if "nvcc" in names or "nvdisasm" in names:
            monkeypatch.setattr(toolchain, "_cuda_homes", lambda: [])
            monkeypatch.setattr(toolchain, "_nvidia_wheel_bins", lambda: [])
            monkeypatch.setitem(toolchain.TOOLS, "nvcc", dataclasses.replace(toolchain.TOOLS["nvcc"], folders=lambda: []))
        toolchain.find_tool.cache_clear()
        for n in names:
            with pytest.raises(toolchain.ToolchainMissing):
                toolchain.find_tool(n)
    yield hide_tools
    toolchain.find_tool.cache_clear()


def _cases(junit: Path) -> dict[str, str]:
    """{test case name: passed | failure | error | skipped} of a JUnit file."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kids = [k.tag for k in case if k.tag in ("failure", "error", "skipped")]
        out[case.get("name")] = kids[0] if kids else "passed"
    return out


AMD_FAMILIES = "earlyclobber,mfma_pipeline"
GFX942_VARIANTS = {"earlyclobber/reference", "earlyclobber/fixed", "earlyclobber/broken",
                   "earlyclobber/broken_shared_base", "mfma_pipeline/reference", "mfma_pipeline/fixed",
                   "mfma_pipeline/broken_war", "mfma_pipeline/broken_tail9", "mfma_pipeline/broken_single_tail"}
# every variant is judged again on the gfx950 listing (clang-22), named so
# (and the scaled f8f6f4 variants, gfx950 only)
AMD_VARIANTS = GFX942_VARIANTS | {f"{v}@gfx950" for v in GFX942_VARIANTS} | {
    f"mfma_pipeline/{v}@gfx950" for v in ("fixed_scaled", "broken_war_scaled", "broken_tail9_scaled")}


def test_static_without_clang_names_every_variant_it_could_not_judge_and_exits_3(hide, capsys):
    hide("clang")
    rc = main(["static", "--families", AMD_FAMILIES])
    out, err = capsys.readouterr()
    assert rc == 3, out + err
    lines = [ln for ln in out.splitlines() if "[toolchain-missing]" in ln]
    assert {ln.rsplit("(", 1)[1].rstrip(")") for ln in lines} == AMD_VARIANTS
    assert all("--skip clang" in ln for ln in lines)
    assert all("apt-get install clang-" in ln for ln in lines)
    assert all("apt-get install clang-22" in ln for ln in lines if "mfma_pipeline/" in ln and "@gfx950" in ln)
    assert "0 canaries detected, 21 check(s) could not run, 0 skipped" in err


def test_static_skip_clang_reports_them_skipped_and_judged_nothing(hide, capsys):
    hide("clang")
    rc = main(["static", "--families", AMD_FAMILIES, "--skip", "clang", "-v"])
    out, err = capsys.readouterr()
    assert rc == 3, out + err  # every check skipped by name: nothing judged, never a pass
    assert "judged nothing" in err
    skipped = [ln for ln in out.splitlines() if "[check-skipped]" in ln]
    assert len(skipped) == 21 and all("skipped: clang" in ln and "--skip clang" in ln for ln in skipped)
    assert "21 skipped" in err


def test_check_junit_without_clang_has_an_error_per_variant_and_no_pass(hide, tmp_path, capsys):
    hide("clang")
    junit = tmp_path / "check.xml"
    rc = main(["check", "--static", "--families", AMD_FAMILIES, "--junit", str(junit)])
    out = capsys.readouterr().out
    assert rc == 3 and "check COULD NOT JUDGE 21 item(s)" in out
    assert sum("static NOT JUDGED" in ln for ln in out.splitlines()) == 21
    cases = _cases(junit)
    assert sorted(cases.values()) == ["error"] * 21
    assert {name.split(" ", 1)[1] for name in cases} == AMD_VARIANTS
    rc = main(["check", "--static", "--families", AMD_FAMILIES, "--junit", str(junit), "--skip", "clang"])
    assert rc == 3 and sorted(_cases(junit).values()) == ["skipped"] * 21  # skipped, and nothing judged


def test_static_without_nvcc_cannot_judge_the_sass_family(hide, capsys, monkeypatch):
    from hazards.families import mma_pingpong

    mma_pingpong._compiled.cache_clear()  # an earlier test of this process may have built it
    hide("nvcc")
    rc = main(["static", "--families", "mma_pingpong"])
    out, err = capsys.readouterr()
    mma_pingpong._compiled.cache_clear()
    assert rc == 3, out + err
    missing = [ln for ln in out.splitlines() if "[toolchain-missing]" in ln]
    assert missing and all("nvcc not found" in ln and "install the CUDA toolkit" in ln for ln in missing)
    assert {ln.rsplit("(", 1)[1].rstrip(")") for ln in missing} == {
        f"mma_pingpong/{v.name}" for v in mma_pingpong.FAMILY.variants}
    assert "canaries detected" in err and " 0 canaries detected" in err


def test_a_cubin_without_a_disassembler_is_not_judged(hide, tmp_path, capsys):
    hide("nvdisasm")
    cubin = tmp_path / "kernel.cubin"
    cubin.write_bytes(b"\x7fELF not really")
    rc = main(["static", "--no-catalog", str(cubin)])
    out = capsys.readouterr().out
    assert rc == 3 and f"{cubin}: error: [toolchain-missing] SASS checks could not run: nvdisasm not found" in out
    assert main(["static", "--no-catalog", "--skip", "nvdisasm", str(cubin)]) == 3  # skipped: judged nothing


def test_a_cubin_whose_disassembler_was_killed_is_a_tool_killed_finding_not_the_end_of_the_run(
        tmp_path, capsys, monkeypatch):
    """A user's cubin whose nvdisasm the OOM killer (or a kill) ends: that path could not be
    judged (tool-killed, exit 3) and the run still reports its findings, instead of the whole
    static part ending on the first such path (in a check: after the GPU part, empty --json)."""
    killed = tmp_path / "nvdisasm"
    killed.write_text("#!/bin/sh\nkill -KILL $$\n")
    killed.chmod(0o755)
    monkeypatch.setenv("HZ_NVDISASM", str(killed))
    monkeypatch.setenv("HZ_BUILD_DIR", str(tmp_path / "cache"))
    toolchain.find_tool.cache_clear()
    cubin = tmp_path / "kernel.cubin"
    cubin.write_bytes(b"\x7fELF not really")
    try:
        rc = main(["static", "--no-catalog", str(cubin)])
    finally:
        toolchain.find_tool.cache_clear()
    out = capsys.readouterr().out
    assert rc == 3, out
    assert f"{cubin}: error: [tool-killed] SASS checks could not run: nvdisasm was ended by SIGKILL" in out


def test_a_family_name_that_matches_nothing_is_exit_2_with_the_valid_names(capsys):
    """`hazards static` with a name that matches nothing (before: exit 0, "0 canaries detected")."""
    assert main(["static", "--families", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hazards: error: 'nosuch' is not a family (families with static checks: ")
    assert "earlyclobber" in err and "mma_pingpong" in err
    assert main(["static", "--families", "pipeline"]) == 2
    assert "'pipeline' has no static checks" in capsys.readouterr().err


MACRO_BUILT_BLOCK = '''#define LOAD(reg, off) "global_load_dwordx4 %" #reg ", %2, off offset:" #off "\\n\\t"
__global__ void k(const float4* p, float4* o) {
  float4 a, b;
  asm volatile(LOAD(0, 0) LOAD(1, 16) "s_waitcnt vmcnt(0)" : "=v"(a), "=v"(b) : "v"(p));
  o[0] = a; o[1] = b;
}
'''


def test_the_lint_without_clang_cannot_judge_a_macro_built_block_and_exits_3(hide, tmp_path, capsys):
    src = tmp_path / "k.hip"
    src.write_text(MACRO_BUILT_BLOCK)
    hide("clang")
    rc = main(["lint", str(src)])
    out, err = capsys.readouterr()
    assert rc == 3, out + err
    assert f"{src}: error: [toolchain-missing] the lint of 1 asm block(s) built from macros" in out
    assert "[asm-unchecked]" in out and "1 skipped (1 macro)" in err and "could not be fully checked" in err
    assert main(["lint", "--no-expand", str(src)]) == 0  # the user's choice: reported skipped


def test_the_compiled_mode_without_clang_is_not_judged_unless_skipped(hide, tmp_path, capsys):
    src = tmp_path / "k.hip"
    src.write_text(MACRO_BUILT_BLOCK)
    hide("clang")
    rc = main(["static", "--compile", str(src)])
    out, err = capsys.readouterr()
    assert rc == 3 and f"{src}: error: [toolchain-missing] gfx942 checks could not run" in out, out + err
    assert main(["static", "--compile", str(src), "--skip", "clang", "-v"]) == 3  # skipped: judged nothing
    assert "[check-skipped] gfx942 checks skipped" in capsys.readouterr().out


def test_a_folder_with_nothing_to_check_is_exit_2_not_a_pass(tmp_path):
    """`hazards lint DIR` / `hazards static DIR` over a folder with no source, listing or
    layout looked at nothing: a one-line error, exit 2 (it was '0 findings', exit 0)."""
    (tmp_path / "notes.txt").write_text("no sources here\n")
    for args in (["lint", str(tmp_path)], ["static", "--no-catalog", str(tmp_path)]):
        proc = subprocess.run([sys.executable, "-m", "hazards", *args], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "nothing to" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "a.c").write_text("int main(void) { return 0; }\n")  # a source without asm: looked at, clean
    proc = subprocess.run([sys.executable, "-m", "hazards", "lint", str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("command", [["check", "--static"], ["static"]])
def test_a_check_whose_every_check_was_skipped_by_name_judged_nothing_and_exits_3(command, capsys):
    """`--skip clang,nvcc,nvdisasm` leaves no static check that can run: it is reported as
    skipped, and the command says it judged nothing and exits 3, never "check passed"."""
    rc = main([*command, "--skip", "clang,nvcc,nvdisasm"])
    out, err = capsys.readouterr()
    assert rc == 3, out + err
    assert "judged nothing" in (out + err).lower() and "check passed" not in out


def test_a_check_that_judged_something_still_passes(capsys):
    """A family skipped by name beside a path that was judged (a barrier layout needs no
    tool): something was judged, so a clean result passes."""
    layout = Path(__file__).parent / "data" / "moe_barrier_after.toml"
    rc = main(["static", "--families", "earlyclobber", "--skip", "clang", str(layout)])
    out, err = capsys.readouterr()
    assert rc == 0 and "judged nothing" not in err, out + err


def test_a_cached_sass_build_does_not_judge_what_skip_names(monkeypatch):
    """mma_pingpong keeps its compiled SASS in memory: an earlier check in the same process
    must not let `--skip nvcc` (or nvdisasm) judge from that cache (the skipped check then
    passed in a full run and was skipped alone)."""
    from hazards.engine import toolchain
    from hazards.engine.errors import ToolchainMissing
    from hazards.families import mma_pingpong

    def cached(*args, **kwargs):  # what a cache hit returns: no tool is asked for
        raise AssertionError("judged from the in-memory build although its tools were skipped")

    monkeypatch.setattr(mma_pingpong, "_compiled", cached)
    for tool in ("nvcc", "nvdisasm"):
        with toolchain.skipping([tool]), pytest.raises(ToolchainMissing) as missing:
            mma_pingpong.static_check({"variant": "broken_tail"})
        assert missing.value.skipped
