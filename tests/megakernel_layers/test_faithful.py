"""The faithful per-task check of the layered megakernel on the CPU: the ring file the
profiled binary writes is decoded span for span (overflow reported, never truncated), the
server's replies carry FAITHFUL_RESULT rows the classifier accepts, and the perf gate finds
the layered catalog beside the ragged-decode one."""
from __future__ import annotations

import array
from pathlib import Path

import pytest

from hazards.engine import profiler
from hazards.engine.classify import faithful_problem
from hazards.engine.errors import UserError
from hazards.gates import perf
from hazards.megakernel_layers import faithful as FA

NAMES = "2=qkv,3=attn_chunk,4=attn_merge,5=oproj,6=router_topk,7=moe_w13,8=moe_w2,11=worker"
HEADER = Path(__file__).resolve().parents[2] / "standalone" / "megakernel_layers" / "megakernel_layers_names.h"


def ring(claimed: int, capacity: int, spans: list[tuple[int, int, int, int, int]]) -> list[int]:
    """One launch as the binary writes it: claimed, capacity, then capacity records
    (begin, end, task:16|sm:16|block:32, aux), unwritten slots zero."""
    words = [claimed, capacity]
    for slot in range(capacity):
        if slot < len(spans):
            task, block, begin, end, layer = spans[slot]
            words += [begin, end, (task << 48) | (7 << 32) | block, layer << 32]
        else:
            words += [0, 0, 0, 0]
    return words


def write(path: Path, *launches: list[int]) -> Path:
    path.write_bytes(array.array("Q", [w for launch in launches for w in launch]).tobytes())
    return path


def measure_from_ring(path: Path, reply: dict, launches: int, monkeypatch) -> dict:
    """Faithful.measure of production, its binary's reply and rings standing in (`path`)."""
    f = FA.Faithful()
    try:
        monkeypatch.setattr(f, "profile", lambda cand, workers, launches, revision=None: (reply, FA.read_rings(
            path, launches, FA.task_names(NAMES))))
        return f.measure(FA.candidate("production"), None, launches, 0.99)
    finally:
        f.close()


def test_task_names_come_from_the_names_header_string():
    assert FA.task_names(NAMES) == {2: "qkv", 3: "attn_chunk", 4: "attn_merge", 5: "oproj", 6: "router_topk",
                                    7: "moe_w13", 8: "moe_w2", 11: "worker"}
    assert f'#define MKL_TASK_NAMES "{NAMES}"' in HEADER.read_text()


def test_rings_decode_into_the_faithful_metrics_per_task(tmp_path):
    spans = [(2, 0, 100, 160, 0), (2, 1, 110, 200, 0), (7, 0, 300, 700, 0), (7, 1, 320, 640, 1)]
    path = write(tmp_path / "r.bin", ring(4, 6, spans), ring(4, 6, spans))
    profiles = FA.read_rings(path, 2, FA.task_names(NAMES))
    assert [p.complete for p in profiles] == [True, True]
    rows = {r["task"]: r for r in profiler.summarize(profiles)}
    assert rows["qkv"]["slowCTA_us"] == pytest.approx(0.090) and rows["qkv"]["wall_us"] == pytest.approx(0.100)
    assert rows["moe_w13"]["sumCTA_us"] == pytest.approx(0.720) and rows["moe_w13"]["instances"] == 2


def test_an_overflowing_ring_is_reported_not_truncated(tmp_path):
    spans = [(2, b, 100, 150, 0) for b in range(3)]
    path = write(tmp_path / "r.bin", ring(5, 3, spans))
    [p] = FA.read_rings(path, 1, {})
    assert p.dropped == 2 and not p.complete
    with pytest.raises(ValueError, match="incomplete"):
        profiler.summarize([p])


@pytest.mark.parametrize("launches, why", [(2, "ends before launch 1"), (0, "more than 0 launches")])
def test_a_ring_file_of_the_wrong_length_is_refused(tmp_path, launches, why):
    path = write(tmp_path / "r.bin", ring(1, 2, [(2, 0, 1, 2, 0)]))
    with pytest.raises(ValueError, match=why):
        FA.read_rings(path, launches, {})


def test_measure_gives_one_well_formed_faithful_row_per_task(tmp_path, monkeypatch):
    spans = [(2, 0, 100, 160, 0), (7, 0, 300, 700, 0), (11, 0, 50, 900, 0)]
    path = write(tmp_path / "r.bin", ring(3, 4, spans), ring(3, 4, spans), ring(3, 4, spans))
    reply = {"status": "ok", "cos": 0.99991, "rel_err": 8e-3, "grid": 132, "layers": 4, "seq": 4096, "chunks": 33,
             "qkv_tiles": 80, "w13_tiles": 33, "bytes_per_step": 1.04e9, "capacity": 4, "kernel_us": [410, 400, 405],
             "build": "megakernel_layers-sm_90a-0123", "task_names": NAMES}
    res = measure_from_ring(path, reply, 3, monkeypatch)
    assert [r["task"] for r in res["rows"]] == ["qkv", "moe_w13", "worker"]
    for row in res["rows"]:
        assert faithful_problem(row) is None, row
        assert row["workers"] == 132 and row["kernel_us"] == 405 and row["candidate"] == "production"
    assert res["mismatched"] == 0


class FakeFaithful:
    """Stands in for the warm profiled binary: rows of two tasks, a given cosine."""

    def __init__(self, cos: float) -> None:
        self.cos, self.asked = cos, []

    def measure(self, cand, workers, launches, cos_min, revision=None, plain_launches=0):
        self.asked.append((cand.name, workers, launches) + ((revision,) if revision else ()))
        rows = [{"task_id": t, "task": n, "slowCTA_us": 10.0, "wall_us": 20.0, "sumCTA_us": 500.0, "cos": self.cos,
                 "workers": workers or 132, "shape": {"layers": 4}, "build": "megakernel_layers-x"}
                for t, n in ((2, "qkv"), (7, "moe_w13"))]
        return {"rows": rows, "cos": self.cos, "rel_err": 1e-3, "mismatched": int(not self.cos >= cos_min),
                "kernel_us": 400.0}


def test_server_replies_count_the_one_checked_launch_and_carry_the_rows():
    fake = FakeFaithful(0.9999)
    reply = FA.handle(fake, {"id": 3, "launches": 4, "params": {"candidate": "depth1", "workers": 64}})
    assert reply["status"] == "ok" and reply["launches"] == 1 and reply["mismatched"] == 0
    assert [r["task"] for r in reply["metrics"]["faithful"]] == ["qkv", "moe_w13"]
    assert fake.asked == [("depth1", 64, 4)]
    bad = FA.handle(FakeFaithful(0.5), {"id": 4, "launches": 1, "params": {"candidate": "stale_descriptor"}})
    assert bad["mismatched"] == 1


@pytest.mark.parametrize("params, fragment", [
    ({"candidate": "no_such"}, "unknown layered-megakernel candidate"),
    ({"workers": 0}, "positive integer"),
    ({"grid": 64}, "unknown params"),
])
def test_bad_server_requests_are_bad_requests(params, fragment):
    reply = FA.handle(FakeFaithful(1.0), {"id": 1, "launches": 1, "params": params})
    assert reply["status"] == "bad_request" and fragment in reply["message"]


def test_candidates_name_request_fields_and_builds_the_family_accepts():
    from hazards.families import get_family

    fam = get_family("megakernel_layers")
    for cand in FA.CANDIDATES.values():
        fam.resolve(dict(cand.params))  # raises on a field the family does not have
        assert cand.expected in perf.VERDICTS
    with pytest.raises(UserError):
        FA.candidate("nope")


def test_the_perf_gate_finds_both_catalogs():
    assert perf.catalog_of("megakernel_layers:depth1") == "megakernel_layers:"
    assert perf.catalog_of("megakernel:improved") == "megakernel:"
    assert perf.catalog_of("python3 -m x") is None
    assert perf.CATALOGS["megakernel_layers:"] == "hazards.megakernel_layers.faithful"
