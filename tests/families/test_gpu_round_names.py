"""The NAME,... lists of a GPU round (ci/gpu/round.sh's build_cuda_families, stall_measure.py's
false-stall round) are read by one parser, `hazards.families.named_items`: a name that matches
no family, FAMILY/VARIANT or extra item stops with one line, before anything is built or run."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hazards.engine.errors import UserError
from hazards.families import cuda_binary_families, named_items

REPO = Path(__file__).resolve().parents[2]
VARIANTS = {"ordering": ["pc_fixed", "pc_broken"], "pipeline": ["fixed"]}


def test_a_list_names_the_variants_of_its_families_and_its_family_variants_and_extra_items():
    # the matched (family, variant) pairs: callers select with them instead of matching names again
    assert named_items("ordering,pipeline/fixed,,ragged_decode", VARIANTS, also=("ragged_decode",)) == \
        {("ordering", "pc_fixed"), ("ordering", "pc_broken"), ("pipeline", "fixed"), ("ragged_decode", None)}
    assert named_items("ordering/pc_fixed,ordering", VARIANTS) == {("ordering", "pc_fixed"), ("ordering", "pc_broken")}
    assert named_items("", VARIANTS) == set()


@pytest.mark.parametrize("spec, also, said", [
    ("ordering,barrier_layot", ("ragged_decode",), "barrier_layot: no such family, FAMILY/VARIANT or ragged_decode"),
    ("ordering/pc_fixd,pipeline/fixed", (), "ordering/pc_fixd: no such family or FAMILY/VARIANT"),
    ("ragged_decode,zz,aa", (), "aa, ragged_decode, zz: no such family or FAMILY/VARIANT"),
])
def test_a_name_that_matches_nothing_is_one_line_naming_it(spec, also, said):
    with pytest.raises(UserError) as stop:
        named_items(spec, VARIANTS, also=also)
    assert str(stop.value) == said


def test_the_cuda_binary_families_are_those_a_gpu_round_builds():
    names = [f.name for f in cuda_binary_families()]
    assert "ordering" in names and names == sorted(names)
    assert all(f.binary and "cuda" in f.platforms for f in cuda_binary_families())


def test_build_cuda_families_stops_the_round_on_a_name_that_matches_nothing(tmp_path):
    # it built the families it knew and said nothing of the typo, so the round then ran
    # (and reported) without the family it was asked for
    script = ". ci/gpu/round.sh names-round 60; build_cuda_families ordering/pc_fixed,barrier_layot; echo GO ON"
    res = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO), "OUT": str(tmp_path)})
    said = "build_cuda_families: barrier_layot: no such family, FAMILY/VARIANT or ragged_decode"
    assert res.returncode == 2 and "GO ON" not in res.stdout, res.stdout + res.stderr
    assert res.stdout.count(said) == 1, res.stdout
    assert not [line for line in res.stdout.splitlines() if line.startswith("ordering ")]  # nothing built
