"""The profiler's sub-spans in the layered megakernel (MKL_PROF_SUBSPANS in a -DHZ_PROFILER
build): the time points inside a task instance, recorded as sub-span records beside the task's.

On the CPU: the ring the binary writes decodes its sub-span records apart from the task spans
(the faithful rows, which the perf gate judges, are the same with or without them); the profile
bench prints each sub-span's mean over instances and its slowest instance, per layer and task,
under the header's names; the header's names match its point counts; the switch's build compiles
with its stamps (globaltimer reads) in the tasks' functions, while the switch without the
profiler leaves production's machine code as it is.
"""
from __future__ import annotations

import importlib.util
import re

import pytest

from hazards.engine import profiler
from hazards.megakernel_layers import faithful as FA

from .test_faithful import HEADER, NAMES, measure_from_ring, ring, write
from .test_merge_spread import ROOT

SUB_NAMES = re.search(r'#define MKL_SUBSPAN_NAMES\s*\\\n((?:\s*"[^"]*"\s*\\?\n)+)', HEADER.read_text())
SUB_NAMES = "".join(re.findall(r'"([^"]*)"', SUB_NAMES.group(1))) if SUB_NAMES else ""


def sub(parent: int, point: int) -> int:
    return profiler.SUB_FLAG | point << 8 | parent


# one launch: two QKV tiles (layer 0), one chunk (layer 1), each with its sub-spans
SPANS = [(2, 0, 100, 160, 0), (sub(2, 1), 0, 90, 100, 0), (sub(2, 3), 0, 100, 150, 0), (sub(2, 4), 0, 150, 160, 0),
         (2, 1, 110, 200, 0), (sub(2, 3), 1, 110, 190, 0), (sub(2, 4), 1, 190, 200, 0),
         (3, 4, 300, 700, 1), (sub(3, 1), 4, 250, 300, 1), (sub(3, 2), 4, 300, 320, 1), (sub(3, 6), 4, 320, 700, 1)]


def _bench():
    spec = importlib.util.spec_from_file_location("mkl_profile_bench", ROOT / "bench" / "megakernel_layers_profile.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_names_header_names_every_sub_span_of_every_task_with_points():
    names = FA.subspan_names(SUB_NAMES)
    text = HEADER.read_text()
    points = {t: int(re.search(rf"#define MKL_SUB_POINTS_{t.upper()} (\d+)", text).group(1))
              for t in ("qkv", "attn_chunk", "attn_merge", "oproj", "router_topk", "moe_w13", "moe_w2")}
    tasks = FA.task_names(NAMES)
    assert {tasks[t]: len(n) - 1 for t, n in names.items()} == points
    assert names[3] == ["wait", "q_copy", "loop_w0", "loop_all", "combine_w0", "arrive"]
    assert names[6] == ["fence", "partials", "hn", "topk", "publish"]
    # the W13 tile's emit split three ways: outputs stored, the arrival read back, the last arriver's release
    assert names[7] == ["wait", "hn_copy", "gemv", "emit", "arrive", "release"]
    # SUB_GEMV (gemv_block's stamp) is the third point of every GEMV task
    assert all(names[t][2] == "gemv" for t in (2, 5, 7, 8))


def test_sub_span_records_decode_apart_and_the_faithful_rows_stay_the_tasks(tmp_path, monkeypatch):
    path = write(tmp_path / "r.bin", ring(len(SPANS), 16, SPANS))
    [p] = FA.read_rings(path, 1, FA.task_names(NAMES))
    assert p.complete and p.task_ids() == [2, 3] and len(p.subspans) == 8
    assert [(s.task, s.point, s.block) for s in p.subspans[:3]] == [(2, 1, 0), (2, 3, 0), (2, 4, 0)]
    plain = [s for s in SPANS if s[0] < profiler.SUB_FLAG]
    plain_path = write(tmp_path / "p.bin", ring(len(plain), 16, plain))
    assert profiler.summarize([p]) == profiler.summarize(FA.read_rings(plain_path, 1, FA.task_names(NAMES)))
    # what the gate receives (Faithful.measure's rows) names the task kinds only
    reply = {"status": "ok", "cos": 0.9999, "rel_err": 8e-3, "grid": 132, "layers": 2, "seq": 4096, "chunks": 33,
             "qkv_tiles": 80, "w13_tiles": 33, "bytes_per_step": 1.04e9, "capacity": 16, "kernel_us": [400],
             "build": "megakernel_layers-sm_90a-0123", "task_names": NAMES, "subspan_names": SUB_NAMES}
    res = measure_from_ring(path, reply, 1, monkeypatch)
    assert [r["task"] for r in res["rows"]] == ["qkv", "attn_chunk"]


def test_the_bench_prints_each_sub_span_mean_and_slowest_per_layer_and_task(tmp_path, capsys):
    bench = _bench()
    path = write(tmp_path / "r.bin", ring(len(SPANS), 16, SPANS), ring(len(SPANS), 16, SPANS))
    profiles = FA.read_rings(path, 2, FA.task_names(NAMES))
    reply = {"layers": 2, "subspan_names": SUB_NAMES}
    out = bench.report_subspans(reply, profiles, 0, FA.task_names(NAMES))
    text = capsys.readouterr().out
    # layer 0: qkv's wait on one tile, gemv 50 and 80 ns (mean 65, slowest 80), emit 10 on both
    assert "   layer 0:\n    qkv          wait 0.0/0.0  gemv 0.1/0.1 x2  emit 0.0/0.0 x2\n" in text
    assert "   layer 1:\n    attn_chunk   wait 0.1/0.1  q_copy 0.0/0.0  arrive 0.4/0.4\n" in text
    assert "every layer of all 2 launches" in text
    st = out["median_launch"]["0"]["qkv"]["3"]
    assert st["mean_us"] == pytest.approx(0.065) and st["max_us"] == pytest.approx(0.080) and st["slow_block"] == 1
    assert out["all"]["qkv"]["3"]["n"] == 4 and out["names"]["3"][5] == "arrive"


def test_the_bench_builds_with_the_switch_only_when_asked():
    text = (ROOT / "bench" / "megakernel_layers_profile.py").read_text()
    assert '"--subspans"' in text and '("MKL_PROF_SUBSPANS", 1)' in text
    # no gate candidate carries the switch: the gate's builds record no sub-span
    assert not any("MKL_PROF_SUBSPANS" in dict(c.defines) for c in FA.CANDIDATES.values())


@pytest.fixture(scope="module")
def sub_listing() -> str:
    from .test_merge_spread import family_cubin, listing_of

    return listing_of(family_cubin({"HZ_PROFILER": 1, "MKL_PROF_SUBSPANS": 1}, "test-mkl-prof-subspans"))


@pytest.fixture(scope="module")
def prof_listing() -> str:
    from .test_merge_spread import family_cubin, listing_of

    return listing_of(family_cubin({"HZ_PROFILER": 1}, "test-mkl-prof"))


def _timer_reads(sass: str) -> int:
    return len(re.findall(r"SR_GLOBALTIMER", sass))


def test_the_switch_build_stamps_the_clock_inside_the_tasks_functions(sub_listing, prof_listing):
    from .sass_text import function_instances

    assert _timer_reads(sub_listing) > _timer_reads(prof_listing)
    # the plain profiled build reads no clock inside these functions; the switch build does at each point
    for name, points in (("attend_chunk", 4), ("router_from_partials", 3)):
        plain, subs = function_instances(prof_listing, name), function_instances(sub_listing, name)
        assert plain and subs, name
        assert all(_timer_reads(f) == 0 for f in plain), name
        assert all(_timer_reads(f) >= points for f in subs), (name, [_timer_reads(f) for f in subs])
    # one recorder of a task and its sub-spans: one claim, called from both kernel instances
    assert function_instances(sub_listing, "mkl_prof_record_points")
    assert not function_instances(prof_listing, "mkl_prof_record_points")


def test_the_switch_without_the_profiler_is_production_line_for_line():
    from .test_production_step22 import _sass_lines

    prod = _sass_lines(None, "test-mkl-step-default")
    assert len(prod) > 10_000
    assert _sass_lines({"MKL_PROF_SUBSPANS": 1}, "test-mkl-subspans-unprofiled") == prod


def test_the_profile_bench_refuses_an_unknown_candidate_in_one_line_without_a_traceback():
    import os
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(ROOT / "bench" / "megakernel_layers_profile.py"), "--candidate", "nosuch"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert r.stderr.startswith("megakernel_layers_profile: unknown layered-megakernel candidate 'nosuch'")


def test_the_profile_bench_takes_integer_defines_and_refuses_anything_else_in_one_line():
    from hazards.engine.errors import UserError

    bench = _bench()
    assert bench.build_defines(["MKL_PREFETCH_W2_KB=0", "MKL_PREFETCH_W13_KB=-1"]) == (
        ("MKL_PREFETCH_W2_KB", 0), ("MKL_PREFETCH_W13_KB", -1))
    for bad in ("MKL_PREFETCH_W2_KB", "MKL_X=fast", "=3", "1X=2", "MKL_X=--5", "MKL_X=-"):
        with pytest.raises(UserError, match="expected NAME=INTEGER"):
            bench.build_defines([bad])


def test_the_w13_arrival_is_stamped_between_the_outputs_and_the_release_in_both_fence_forms():
    """Both arrival forms (production's block_arrive, step (r)'s acq_rel one) stamp SUB_COMBINE right after
    the atomic's read-back, and SUB_AFTER right after the tile's GEMV (its outputs stored)."""
    src = (ROOT / "standalone" / "megakernel_layers" / "mkl_kernel.cuh").read_text()
    w13 = src[src.index("// ---- expert W13 tiles"):src.index("// ---- expert W2 rows")]
    assert w13.count("MKL_SUB_POINT(SUB_AFTER);") == 1
    assert w13.index("gemv_block(") < w13.index("MKL_SUB_POINT(SUB_AFTER);") < w13.index("block_arrive")
    for arrive in ("w13_block_arrive_acq_rel(ctr, tid, &hd->word);", "block_arrive(ctr, true, tid, &hd->word);"):
        after = w13[w13.index(arrive) + len(arrive):]
        assert after.lstrip().startswith("MKL_SUB_POINT(SUB_COMBINE);"), arrive
