"""The parsers and the wait classification, on real output recorded on the H200 (round 1,
tests/forensics/data/h200-round1: cuda-gdb 13.0 batch attaches to hung_kernels.cu built
with and without -lineinfo, and py-spy 0.4.3 on the PyTorch hang)."""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from hazards.engine.forensics.device import (classify_wait, group_by_pc, parse_insns, parse_kernels,
                                             parse_line_info, parse_threads)
from hazards.engine.forensics.host import host_report, parse_gdb_backtraces, parse_py_spy_json

ROUND1 = Path(__file__).resolve().parent / "data" / "h200-round1"


def batch(name: str) -> str:
    return gzip.open(ROUND1 / f"{name}.cuda-gdb-batch.txt.gz").read().decode()


def section(text: str, start: str, end: str) -> str:
    """The part of a batch transcript from the line holding `start` to the one holding `end`."""
    a = text.index(start)
    return text[a:text.index(end, a)]


def threads_of(name: str) -> str:
    text = batch(name)
    return section(text, "BlockIdx ThreadIdx To BlockIdx", "  SM  Active Warps Mask")


def disassembly(name: str) -> str:
    return section(batch(name), "Dump of assembler code", "End of assembler dump")


# -- kernels and threads ------------------------------------------------------------------
def test_kernels_table_gives_grid_block_and_name():
    (k,) = parse_kernels(section(batch("gridbar-li"), "  Kernel Parent", "  BlockIdx To BlockIdx"))
    assert (k.id, k.device, k.status, k.grid, k.block, k.function) == (0, 0, "Active", (133, 1, 1), (64, 1, 1),
                                                                        "grid_barrier")


@pytest.mark.parametrize("name", ["spin-li", "spin-noli"])
def test_every_resident_thread_is_in_the_thread_listing(name):
    rows = parse_threads(threads_of(name))
    assert len(rows) == 3 * 132  # lane 0, lanes 1-31, warp 1: per block
    assert sum(r.count for r in rows) == 132 * 64
    assert {r.kernel for r in rows} == {0}
    if name.endswith("-li"):
        assert all(r.file.endswith("hung_kernels.cu") and r.line in (22, 23, 26, 27) for r in rows)
    else:  # without -lineinfo: no file, line 0
        assert all(r.file is None and r.line is None for r in rows)


def test_rows_group_by_pc_into_threads_warps_and_blocks():
    kernels = parse_kernels(section(batch("spin-li"), "  Kernel Parent", "  BlockIdx To BlockIdx"))
    groups = {g.pc & 0xFFF: g for g in group_by_pc(parse_threads(threads_of("spin-li")), kernels)}
    warpsync, after_bar = groups[0x0C0], groups[0x0E0]
    assert (warpsync.threads, len(warpsync.warps), len(warpsync.blocks)) == (132 * 31, 132, 132)
    assert {w for _, w in warpsync.warps} == {0}
    assert (after_bar.threads, len(after_bar.warps)) == (132 * 32, 132) and {w for _, w in after_bar.warps} == {1}
    lane0 = [g for pc, g in groups.items() if pc not in (0x0C0, 0x0E0)]
    assert sum(g.threads for g in lane0) == 132  # thread 0 of every block, spread over the loop's PCs
    assert len(lane0) > 1


# -- the wait kind, from the SASS cuda-gdb disassembled ------------------------------------
def _thread0_pcs(name: str) -> set[int]:
    return {r.pc for r in parse_threads(threads_of(name)) if r.thread_from == (0, 0, 0)}


@pytest.mark.parametrize("name, kind, anchor_op", [
    ("spin-li", "spin", "BRA"), ("spin-noli", "spin", "BRA"), ("gridbar-li", "sleep_spin", "BRA"),
    ("gridbar-noli", "sleep_spin", "BRA"), ("mbar-li", "mbarrier", "BRA"), ("hoisted-li", "loop_no_load", "BRA"),
])
def test_the_waiting_lane_is_named_by_its_loop_wherever_it_was_stopped(name, kind, anchor_op):
    insns = parse_insns(disassembly(name))
    start = insns[0].addr
    pcs = _thread0_pcs(name)
    results = {classify_wait(insns, pc, start) for pc in pcs}
    assert len(results) == 1, results  # every PC inside the loop names the same wait
    (got_kind, anchor), = results
    assert got_kind == kind
    at = next(i for i in insns if i.addr == anchor)
    assert at.base == anchor_op and at.branch_target(start) <= min(pcs)  # the loop's backward branch


@pytest.mark.parametrize("name", ["spin-li", "gridbar-li", "mbar-li", "hoisted-li"])
def test_a_warp_blocked_at_bar_sync_reports_the_next_pc_and_is_named_by_the_bar(name):
    insns = parse_insns(disassembly(name))
    rows = parse_threads(threads_of(name))
    warp1_pc = next(r.pc for r in rows if r.thread_from == (32, 0, 0))
    at = next(i for i in insns if i.addr == warp1_pc)
    assert at.base == "EXIT"  # what the H200 showed: the PC past the barrier
    kind, anchor = classify_wait(insns, warp1_pc, insns[0].addr)
    assert kind == "barrier" and next(i for i in insns if i.addr == anchor).opcode.startswith("BAR.SYNC")
    lanes_pc = next(r.pc for r in rows if r.thread_from == (1, 0, 0))
    assert classify_wait(insns, lanes_pc, insns[0].addr) == ("warpsync", lanes_pc)


def test_an_unreadable_pc_is_unknown_not_a_guess():
    insns = parse_insns(disassembly("spin-li"))
    assert classify_wait(insns, 0xDEAD, insns[0].addr) == ("unknown", 0xDEAD)


# -- lines and instructions ------------------------------------------------------------------
def test_info_line_with_and_without_lineinfo():
    li = re.search(r"Line 23 of .*", batch("spin-li")).group(0)
    assert parse_line_info(li) == {"line": 23, "file": "/work/main/.gpu/g-forensics/tests/forensics/programs/"
                                   "hung_kernels.cu", "function": "_Z12spin_on_flagPVi", "offset": 112}
    noli = re.search(r"No line number information available.*", batch("spin-noli")).group(0)
    assert parse_line_info(noli) == {"function": "_Z12spin_on_flagPVi", "offset": 160}


def test_x_i_output_marks_the_pc_and_skips_unreadable_bytes():
    text = section(batch("spin-li"), "=> 0x7fc36b7a0070 <_Z12spin_on_flagPVi+112>", "Line 23 of")
    insns = parse_insns(text)
    assert [i.at_pc for i in insns][:2] == [True, False]
    assert [i.opcode for i in insns[:4]] == ["R2UR", "R2UR", "LDG.E.STRONG.SYS", "ISETP.NE.AND"]
    assert all(i.text for i in insns)  # the 16 empty lines of memory before the function are dropped
    bra = parse_insns("   0x7fc36b7a00b0 <_Z12spin_on_flagPVi+176>:\t@!P0 BRA 0x7fc36b7a0060")[0]
    assert (bra.opcode, bra.branch_target(0x7FC36B7A0000)) == ("BRA", 0x7FC36B7A0060)


# -- host stacks ------------------------------------------------------------------------------
def test_py_spy_native_dump_of_the_torch_hang_names_the_python_line_and_the_driver_call():
    raw = (ROUND1 / "torch.py-spy-native-json.txt").read_text().split("--- stderr ---")[0]
    rep = host_report(598, parse_py_spy_json(raw), "py-spy --native")
    assert rep["sentence"] == ("MainThread waits in synchronize (torch/cuda/__init__.py:1162) called from "
                               "wait_for_step (hung_torch.py:27), native: cuCtxSynchronize_v2 "
                               "(libcuda.so.580.159.04)")
    assert rep["stuck_at"] == "hung_torch.py:27"


def test_cuda_gdb_host_backtraces_of_a_native_program():
    bt = section(batch("spin-li"), "Thread 5 (Thread", "CUDA focus unchanged")
    threads = parse_gdb_backtraces(bt)
    assert sorted(t.tid for t in threads) == [599, 600, 605, 650]
    rep = host_report(599, threads, "cuda-gdb")
    assert rep["sentence"] == "main thread waits in cuCtxSynchronize_v2 (libcuda.so.1) called from main"


def test_session_transcript_of_round1_detached_cleanly():
    """The pipe-driven session (DebuggerSession) on the H200: every command answered, then detach."""
    for name in ("spin-li", "gridbar-li", "torch"):
        d = json.loads(gzip.open(ROUND1 / f"{name}.session.json.gz").read())
        assert d["error"] is None and all(c["complete"] for c in d["commands"])
        assert "detached" in d["commands"][-1]["text"]
