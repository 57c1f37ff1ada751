"""ordering's oracle and stress as the mutation round needs them. The litmus check counts every
instance once: hz::grid_stride_count (what a block of a grid-stride loop visits) matches the
loop it stands for, on a CPU (a host program built by nvcc through the build cache), and the
outcome counts that must sum to it are a harness anomaly named in the family table (a lost
count is the rig, never a weak outcome). pc_fixed_skewed is pc_fixed plus a producer skew
only (timing), so a mismatch in it can only come from a missing producer barrier;
pc_fixed_late_readers likewise plus a consumer skew only (a missing consumer barrier)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hazards.kernel_sources import standalone_dir
from tests.static.static_helpers import requires_nvcc

DATA = Path(__file__).resolve().parent / "data" / "grid_stride"


@requires_nvcc
def test_grid_stride_count_is_what_the_loop_visits():
    from hazards.engine.build import build

    exe = build(DATA, "grid_stride", shared_dirs=(standalone_dir() / "common",))
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("ok ") and int(proc.stdout.split()[1]) > 1000


def test_uncounted_litmus_outcomes_are_a_harness_anomaly():
    from hazards.families import get_family

    fam = get_family("ordering")
    assert fam.counters[-1] == "uncounted"  # index 7: the kernel's UNCOUNTED
    assert "uncounted" in fam.harness_anomalies
    source = (standalone_dir() / "ordering" / "ordering.cu").read_text()
    assert "UNCOUNTED = 7" in source and "hz::grid_stride_count(" in source


@pytest.mark.parametrize("variant,skew", [("pc_fixed_skewed", "producer_skew"), ("pc_fixed_late_readers", "consumer_skew")])
def test_a_skewed_pc_variant_is_pc_fixed_with_only_its_timing_skew_added(variant: str, skew: str):
    from hazards.families import get_family
    from hazards.families.ordering import allowed

    from variant_pairs import differing_params

    fam = get_family("ordering")
    assert differing_params("ordering", variant, "pc_fixed") == {skew: (16, 0)}
    assert fam.variant(variant).role == "fixed"
    assert allowed({"variant": variant})[0] is False  # the model: synchronized like pc_fixed
    source = (standalone_dir() / "ordering" / "ordering.cu").read_text()
    assert f'a.{skew} = (int)p.i("{skew}")' in source


def test_the_consumer_skew_delays_the_reads_after_the_flag_barrier():
    source = (standalone_dir() / "ordering" / "ordering.cu").read_text()
    consumer = source[source.index("stale_block = 0;"):source.index("atomicAdd(&stale_block, stale)")]
    assert consumer.index("__syncthreads()") < consumer.index("a.consumer_skew") < consumer.index("data[k] !=")


def test_the_late_readers_gpu_step_names_the_consumer_barrier_after_the_reads():
    """ci/gpu/ordering-late-readers.sh names its mutant by line (ROWS=ordering@A-B): those lines
    must hold exactly one mutant, the consumer's barrier after its data reads, and the script's
    false-stall item must be the variant made for it. A line shift makes this fail, not the run."""
    import re

    from hazards.families import get_family
    from hazards.mutate.catalog import build_defines
    from hazards.mutate.mutants import mutants_of_text

    script = (Path(__file__).resolve().parents[2] / "ci" / "gpu" / "ordering-late-readers.sh").read_text()
    first, last = map(int, re.search(r"^sub mutate-\S+ .* ROWS=ordering@(\d+)-(\d+) ", script, re.M).groups())
    item = re.search(r"^sub falsestall .* ci/gpu/falsestall-h200\.sh \S+ (\S+)$", script, re.M).group(1)
    assert item == "ordering/pc_fixed_late_readers" and get_family("ordering").variant(item.split("/")[1])
    path = standalone_dir() / "ordering" / "ordering.cu"
    text = path.read_text()
    mutants = mutants_of_text(text, str(path), lines=(first, last), defines=build_defines("ordering"))
    assert [m.id for m in mutants] == [f"remove-barrier@{first}"]
    lines = text.splitlines()
    assert "atomicAdd(&stale_block, stale)" in lines[first - 2] and lines[first - 1].strip() == "__syncthreads();"
    assert "hz_st_release_gpu(ack" in "\n".join(lines[first:first + 10])
