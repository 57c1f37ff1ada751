"""Tripwire: decode the breadcrumbs a kernel leaves in a /dev/shm file, and diagnose hangs.

- `layout`: the file format (mirrors standalone/include/hz_tripwire.h; docs/tripwire.md).
- `names`: phase/barrier names from JSON or a C header.
- `analysis`: snapshots → `Diagnosis` (grouping, stragglers, causes, sentinels).
- `session`: the private file and the watchdog's on-hang collector (the target wrapper is
  `hazards.engine.targets.tripwire.TripwireTarget`).
"""
from ..tripwire.analysis import Diagnosis, Group, analyze
from ..tripwire.layout import Header, Slot, Snapshot, decode, read_snapshot, tag_of
from ..tripwire.names import Names, load_names, parse_c_names
from ..tripwire.session import (
    ENV_PATH,
    TripwireFile,
    diagnosis_evidence,
    collect_on_hang,
    find_tripwire_evidence,
    install_hang_collector,
    register_names,
    uninstall_hang_collector,
    write_artifacts,
)

__all__ = [
    "Diagnosis", "Group", "analyze", "Header", "Slot", "Snapshot", "decode", "read_snapshot", "tag_of",
    "Names", "load_names", "parse_c_names", "ENV_PATH", "TripwireFile", "collect_on_hang", "diagnosis_evidence",
    "find_tripwire_evidence", "install_hang_collector", "register_names", "uninstall_hang_collector",
    "write_artifacts",
]
