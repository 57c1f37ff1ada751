"""The tripwire's cost candidate MKL_TW_FASTPATH on a GPU: its waits poll inline until the poll at which the
watch would first store (HZ_TW_SPIN_STRIDE), then call the watched wait with that count, so a hang's slot words
are the default build's. Each seeded hang is named as on the default build (the same leading barrier, layer and
cause for the certain ones), and the clean variants stay clean. Its SASS: tests/megakernel_layers/test_tripwire_watch.py."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from hazards.engine.gpus import gpu_available
from hazards.engine.outcome import Outcome

from .test_gpu import FAM, HANGS, hang_launches, run

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no usable NVIDIA GPU (NVML/nvidia-smi found none)")]
FASTPATH = {"MKL_TW_FASTPATH": 1}


def _named(sentence: str) -> tuple[tuple[str, ...] | None, list[str]]:
    """The barrier and layer a hang's family clause leads with ("86 of 132 workers wait at W13_W2 in layer 0")
    and the cause it ends with ("(lost release, shared line)"). Not the stragglers elsewhere: they vary run to
    run (shared_line reverts one expert's release or two; the others' workers go on to the next layer)."""
    head = re.search(r"\d+ of \d+ workers wait at ([A-Z][A-Z_0-9]+) in layer (\d+)", sentence)
    return (head.groups() if head else None), re.findall(r"\(([^()]*)\)\s*$", sentence)


@pytest.mark.parametrize("variant", HANGS)
def test_the_fastpath_build_names_each_seeded_hang_as_the_default_build(tmp_path: Path, variant: str):
    from hazards.stress_family import family_binary

    n, certain = hang_launches(variant)
    got = {}
    for name, defines in (("default", None), ("fastpath", FASTPATH)):
        (tmp_path / name).mkdir()
        r = run(family_binary(FAM, defines=defines), {"variant": variant, "launches": n}, 6 + n * 0.1,
                tmp_path / name)
        assert r.outcome is Outcome.HANG, (name, r.reason, r.metrics)
        got[name] = r.evidence["tripwire"]["sentence"]
    sentence = got["fastpath"]
    assert "in layer" in sentence and "not the signature" not in sentence, sentence
    assert any(word in sentence for word in ("never arrived", "reverted")), sentence
    if certain:
        assert _named(sentence)[0] is not None and _named(sentence) == _named(got["default"]), got


@pytest.mark.parametrize("variant", [v.name for v in FAM.clean_variants])
def test_the_fastpath_build_keeps_the_clean_variants_clean(tmp_path: Path, variant: str):
    from hazards.stress_family import family_binary

    r = run(family_binary(FAM, defines=FASTPATH), {"variant": variant, "launches": 300}, 120, tmp_path)
    assert r.outcome is Outcome.CLEAN, (r.reason, r.metrics)
    assert r.metrics.get("launches") == 300 and r.metrics.get("mismatched") == 0
