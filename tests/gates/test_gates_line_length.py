"""The gates' Python keeps to the project's 120-character lines (a long signature wrapped)."""
from __future__ import annotations

from pathlib import Path

GATES = Path(__file__).resolve().parents[2] / "hazards" / "gates"


def test_no_line_of_the_gates_python_is_over_120_characters():
    long = [f"{p.name}:{n}: {len(line)} characters"
            for p in sorted(GATES.glob("*.py")) for n, line in enumerate(p.read_text().splitlines(), 1)
            if len(line) > 120]
    assert not long, long
