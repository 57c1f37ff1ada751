"""Hang forensics for any program: where every resident warp and every host thread is stuck.

- `debugger`: a bounded, always-detaching session with cuda-gdb / rocgdb / gdb, and the
  ptrace permission checks;
- `device`: kernels and warps from cuda-gdb, grouped by stuck location, with a wait kind;
- `host`: Python stacks through py-spy, native stacks through gdb, in one sentence;
- `system`: NVML state and Xids since the run started;
- `collector`: the watchdog's on-hang collector that runs them within the hang budget and
  writes `hang.md`; `hang_reason` and `stuck_locations` for the run's reason and signature.
See docs/hang-forensics.md.
"""
from ..forensics.collector import (MARKER, collect, find_forensics_evidence, hang_forensics,
                                                hang_markdown, hang_reason, install_hang_collector,
                                                stuck_locations, uninstall_hang_collector)

__all__ = ["MARKER", "collect", "find_forensics_evidence", "hang_forensics", "hang_markdown", "hang_reason",
           "install_hang_collector", "stuck_locations", "uninstall_hang_collector"]
