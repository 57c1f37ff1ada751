"""The README's build line of the ragged-decode megakernel names the folder the build writes to."""
from __future__ import annotations

import re
from pathlib import Path

from hazards.engine import toolchain
from hazards.ragged_decode import build

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_names_the_cache_folder_the_library_is_built_into(monkeypatch, tmp_path):
    monkeypatch.setenv("HZ_BUILD_DIR", str(tmp_path))
    monkeypatch.setattr(toolchain, "tool_version", lambda tool: "nvcc 0.0 (test)")
    built = build.library_path("nvcc")
    line = next(ln for ln in README.read_text().splitlines() if "python3 -m hazards.ragged_decode.build" in ln)
    said = re.search(r"~/\.cache/gpu-hazards/(\S+)/ragged_decode-<hash>\.so", line)
    assert said, line
    assert said.group(1) == built.parent.relative_to(tmp_path).as_posix(), (line, built)
