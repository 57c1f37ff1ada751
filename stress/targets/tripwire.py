"""`TripwireTarget`: a target whose program writes tripwire breadcrumbs, with diagnoses.

Lifecycle for one target (one file; every run truncates it first, and the program's
`hz_tw_host_open` sizes and re-initialises it, so no run can read another's breadcrumbs):

    with TripwireFile() as tw:                                   # /dev/shm/hz-tw-…, 0600
        target = TripwireTarget(CommandTarget(argv, env=tw.env()), tw, names=names)
        result = target.run(timeout=5)       # hang: collector snapshots twice, then the kill
    # file removed here; kept only as a copy in the run's artifact folder
"""
from __future__ import annotations

from pathlib import Path

from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.targets.base import Target, WrapperTarget
from hazards.engine.tripwire.analysis import analyze
from hazards.engine.tripwire.layout import decode
from hazards.engine.tripwire.names import Names
from hazards.engine.tripwire.session import (MARKER, TripwireFile, diagnosis_evidence, find_tripwire_evidence,
                                             install_hang_collector, register_names, write_artifacts)


class TripwireTarget(WrapperTarget):
    """Wraps a target whose environment carries `tw.env()`.

    Before each run: truncate the file. After it: a hang already carries the collector's
    live diagnosis; a fault (or a hang the collector could not read) gets a post-mortem
    one from the file, which survives the process. The summary lands in
    `result.evidence["tripwire"]`; with `keep` the raw file is copied into the run's
    artifact folder ("failures": only for non-clean runs).
    """

    def __init__(self, inner: Target, tw: TripwireFile, names: Names | None = None, keep: str = "failures") -> None:
        if keep not in ("always", "failures", "never"):
            raise ValueError(f"keep must be always|failures|never, not {keep!r}")
        super().__init__(inner)
        self.tw = tw
        self.names = names or Names()
        self.keep_mode = keep
        register_names(tw.path, self.names)
        install_hang_collector()

    def run(self, params: dict | None = None, *, timeout: float, launches: int | None = None,
            artifact_dir: Path | None = None) -> RunResult:
        self.tw.reset()
        r = self.inner.run(params, timeout=timeout, launches=launches, artifact_dir=artifact_dir)
        art = Path(r.artifact_dir) if r.artifact_dir else artifact_dir
        found = find_tripwire_evidence(r.evidence)
        if found is None and r.outcome in (Outcome.FAULT, Outcome.HANG):
            raw = self.tw.read()
            snap = decode(raw, str(self.tw.path))
            diag = analyze(snap, None, self.names, live=False)
            found = diagnosis_evidence(diag, write_artifacts(art, "postmortem", diag, [(raw, snap)]), "post-mortem")
        if found is not None:
            r.evidence["tripwire"] = {k: v for k, v in found.items() if k != MARKER}
        failed = Outcome(r.outcome) is not Outcome.CLEAN
        if art is not None and (self.keep_mode == "always" or (self.keep_mode == "failures" and failed)):
            kept = self.tw.keep(art, "tripwire-final.bin")
            if kept is not None:
                r.evidence.setdefault("tripwire", {})["raw"] = str(kept)
                if r.artifact_dir is None:
                    r.artifact_dir = str(art)
        return r
