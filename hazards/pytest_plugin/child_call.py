"""Child side of `hz_run_out_of_process`: `python -m hazards.pytest_plugin.child_call PAYLOAD OUT`.

PAYLOAD is a pickle of (the parent's sys.path, pickled (fn, args, kwargs)); the path comes
first so a test module's function unpickles here as it was imported there. The return
value is pickled to OUT. An exception propagates: Python prints the traceback and exits
1, which the engine's classifier reads (AssertionError -> mismatch, others by type).
"""
from __future__ import annotations

import pickle
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    payload, out = Path(argv[0]), Path(argv[1])
    parent_path, blob = pickle.loads(payload.read_bytes())
    sys.path[:] = list(parent_path) + [p for p in sys.path if p not in parent_path]
    fn, args, kwargs = pickle.loads(blob)
    value = fn(*args, **kwargs)
    out.write_bytes(pickle.dumps(value))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
