"""The Python statement of the megakernel's model (hash, schedule, sync layout) is the C one.

`mkl_model.h` is plain C++ on the host; a small driver compiled with the host compiler
prints the values the kernel computes, and the Python mirror must print the same."""
from __future__ import annotations

import shutil
import struct
import subprocess

import pytest

from hazards.kernel_sources import family_dir
from hazards.megakernel_layers import model as M

DRIVER = r"""
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include "mkl_model.h"
using namespace mkl;
int main() {
  for (unsigned x : {0u, 1u, 2u, 12345u, 0xFFFFFFFFu, 0x80000000u}) std::printf("h %u %u\n", x, hash32(x));
  for (unsigned k : {1u, 7u, 10u})
    for (unsigned l : {0u, 3u}) std::printf("k %u %u %u\n", k, l, tensor_key(1u, k, l, 5u));
  const unsigned key = tensor_key(3u, T_W13, 2u, 17u);
  for (unsigned i : {0u, 1u, 999u, 16588799u}) {
    const float v = uniform_pm(key, i, SCALE_W);
    unsigned bits; std::memcpy(&bits, &v, 4);
    std::printf("u %u %u\n", i, bits);
  }
  std::printf("q %d %d %d %d\n", qkv_rows(SHAPE_DEFAULT), qkv_tiles(SHAPE_DEFAULT), qkv_tiles(SHAPE_SMALL),
              w13_tiles(132, 4));
  for (int c : {0, 1, 16, 64}) std::printf("c %d %d %d\n", c, chunk_begin(c, 129, 16385), row_begin(c, 132, 2880));
  for (int s : {1, 257, 4097, 16385, 100000}) std::printf("a %d %d\n", s, auto_chunks(s, 128, 132));
  for (int st : {0, 3}) for (int l : {0, 5}) std::printf("e %d %d %u\n", st, l, epoch_of(st, 8, l));
  for (int g : {1, 3, 16, 132})
    std::printf("m %d %d %d\n", g, merge_workers(SHAPE_DEFAULT.NQ, qkv_tiles(SHAPE_DEFAULT), g),
                merge_workers(SHAPE_SMALL.NQ, qkv_tiles(SHAPE_SMALL), g));
  return 0;
}
"""


@pytest.fixture(scope="module")
def c_values(tmp_path_factory) -> list[list[str]]:
    cxx = shutil.which("g++") or shutil.which("clang++") or shutil.which("clang++-19")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    d = tmp_path_factory.mktemp("mkl_model")
    src = d / "driver.cpp"
    src.write_text(DRIVER)
    exe = d / "driver"
    subprocess.run([cxx, "-std=c++17", "-O1", f"-I{family_dir('megakernel_layers')}", str(src), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return [line.split() for line in out.splitlines()]


def f32_bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def test_weight_hash_and_values_match_the_c_header(c_values):
    rows = {r[0]: [] for r in c_values}
    for r in c_values:
        rows[r[0]].append(r[1:])
    for x, h in rows["h"]:
        assert M.hash32(int(x)) == int(h)
    for k, l, key in rows["k"]:
        assert M.tensor_key(1, int(k), int(l), 5) == int(key)
    key = M.tensor_key(3, M.T_W13, 2, 17)
    for i, bits in rows["u"]:
        assert f32_bits(M.uniform_pm(key, int(i), M.SCALE_W)) == int(bits)


def test_schedule_functions_match_the_c_header(c_values):
    rows = {r[0]: [] for r in c_values}
    for r in c_values:
        rows[r[0]].append([int(x) for x in r[1:]])
    assert rows["q"][0] == [M.qkv_rows(M.SHAPES["default"]), M.qkv_tiles(M.SHAPES["default"]),
                            M.qkv_tiles(M.SHAPES["small"]), M.w13_tiles(132, 4)]
    for c, cb, rb in rows["c"]:
        assert (M.chunk_begin(c, 129, 16385), M.row_begin(c, 132, 2880)) == (cb, rb)
    for s, n in rows["a"]:
        assert M.auto_chunks(s, 128, 132) == n
    for st, l, e in rows["e"]:
        assert M.epoch_of(st, 8, l) == e
    for g, default, small in rows["m"]:  # the default build's merge workers (step 22: one head a worker)
        assert [M.schedule(M.SHAPES[m], seq=4096, workers=g).merge_workers() for m in ("default", "small")] == \
            [default, small]


def test_default_shape_is_gpt_oss_20b_layers_with_an_amax_tail():
    s = M.SHAPES["default"]
    assert (s.D, s.NQ, s.NKV, s.E, s.K, s.I) == (2880, 64, 8, 32, 4, 2880)
    assert (s.I // M.SUB_BLOCK) % 4 != 0          # 90 sub-blocks: the MI355 megakernel PR's W2 tail
    assert (M.SHAPES["small"].I // M.SUB_BLOCK) % 4 == 0
    assert M.qkv_tiles(s) == 80


def test_one_step_reads_at_least_256_mb():
    assert M.step_bytes(M.SHAPES["default"], 4, 4096) >= 256e6
    assert M.step_bytes(M.SHAPES["default"], 1, 4096) >= 256e6


@pytest.mark.parametrize("seq, workers, chunk_tokens, chunks", [
    (4096, 132, 256, 0), (16384, 132, 256, 0), (100, 64, 256, 64), (1, 16, 128, 0), (16384, 64, 512, 48)])
def test_schedule_covers_every_unit_of_work_exactly_once(seq, workers, chunk_tokens, chunks):
    s = M.SHAPES["default"]
    sc = M.schedule(s, seq=seq, workers=workers, chunk_tokens=chunk_tokens, chunks=chunks)
    # QKV rows: tiles of 128 rows, every row once
    rows = [r for t in range(sc.qkv_tiles) for r in range(t * M.QKV_TILE_ROWS,
                                                          min((t + 1) * M.QKV_TILE_ROWS, M.qkv_rows(s)))]
    assert rows == list(range(M.qkv_rows(s)))
    # tokens: the chunks partition [0, S) (some chunks may be empty)
    toks = [t for c in range(sc.chunks) for t in range(*sc.chunk_tokens(c))]
    assert toks == list(range(seq + 1))
    assert sc.chunk_servers() == list(range(min(sc.chunks, workers)))
    # O-projection / W2 rows: every row of D once, over the row workers
    d_rows = [r for w in range(sc.row_workers) for r in range(M.row_begin(w, sc.row_workers, s.D),
                                                              M.row_begin(w + 1, sc.row_workers, s.D))]
    assert d_rows == list(range(s.D))
    # W13: per expert slot, the channels of its T13 tiles partition [0, I)
    ch = [c for t in range(sc.w13_tiles) for c in range(M.row_begin(t, sc.w13_tiles, s.I),
                                                        M.row_begin(t + 1, sc.w13_tiles, s.I))]
    assert ch == list(range(s.I))
    assert s.K * sc.w13_tiles <= max(workers, s.K)


def test_nesting_the_chunk_phase_in_the_qkv_guard_drops_chunk_ranks_above_the_tiles():
    s = M.SHAPES["default"]
    sc = M.schedule(s, seq=16384, workers=132, hazard="participant_set")
    assert sc.chunks == 129 and sc.qkv_tiles == 80
    assert sc.chunk_servers() == list(range(80))


def test_only_the_shared_line_layout_puts_releases_in_the_counter_line():
    assert M.releases_sharing_counter_line(M.SHARED_LINE_STRIDE) == list(range(8))
    assert M.releases_sharing_counter_line(M.OWN_LINE_STRIDE) == []
    assert M.releases_sharing_counter_line(64) == []
