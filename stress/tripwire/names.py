"""Names for phase and barrier ids, so a diagnosis says ATTN_RELEASE rather than 7.

Two sources, one format once loaded:
- JSON: `{"phases": {"3": "MOE_W13_W2"}, "barriers": {"7": "ATTN_RELEASE"}}`;
- a C/C++ header, so the kernel's own constants are the single source of truth: lines
  such as `#define HZ_PHASE_QKV 1`, `#define BARRIER_ATTN_RELEASE 7`, or enumerators
  `PHASE_MOE = 3,` / `BAR_CHUNK = 2,` (prefix PHASE_ or BAR_/BARRIER_, optional HZ_ or
  HZ_TW_ in front; decimal or hex values).
"""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from ..errors import UserError

_C_NAME = re.compile(
    r"(?:#\s*define\s+|^\s*|,\s*)(?:HZ_(?:TW_)?)?(PHASE|BARRIER|BAR)_([A-Za-z0-9_]+)\s*=?\s*(0[xX][0-9a-fA-F]+|\d+)\b",
    re.MULTILINE,
)


@dataclasses.dataclass
class Names:
    phases: dict[int, str] = dataclasses.field(default_factory=dict)
    barriers: dict[int, str] = dataclasses.field(default_factory=dict)

    def phase(self, pid: int) -> str:
        if pid == 0x000 and pid not in self.phases:
            return "START"
        if pid == 0xFFF and pid not in self.phases:
            return "DONE"
        return self.phases.get(pid, f"phase {pid}")

    def barrier(self, bid: int) -> str:
        return self.barriers.get(bid, f"#{bid}")

    def to_json(self) -> dict[str, dict[str, str]]:
        return {"phases": {str(k): v for k, v in self.phases.items()},
                "barriers": {str(k): v for k, v in self.barriers.items()}}


def parse_c_names(text: str) -> Names:
    """Phase and barrier constants from C source text."""
    names = Names()
    for kind, name, value in _C_NAME.findall(text):
        (names.phases if kind == "PHASE" else names.barriers)[int(value, 0)] = name
    return names


def load_names(path: str | Path | None) -> Names:
    """Names from a JSON file or a C header; empty Names for None. UserError on bad input."""
    if path is None:
        return Names()
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise UserError(f"cannot read names file {p}: {e.strerror or e}") from None
    if p.suffix.lower() == ".json":
        try:
            data = json.loads(text)
            return Names(
                phases={int(k, 0): str(v) for k, v in data.get("phases", {}).items()},
                barriers={int(k, 0): str(v) for k, v in data.get("barriers", {}).items()},
            )
        except (ValueError, AttributeError, TypeError) as e:
            raise UserError(f"names file {p} is not {{'phases': {{id: name}}, 'barriers': {{...}}}}: {e}") from None
    names = parse_c_names(text)
    if not names.phases and not names.barriers:
        raise UserError(f"names file {p} defines no PHASE_* or BARRIER_*/BAR_* constants")
    return names
