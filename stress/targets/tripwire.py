"""`TripwireTarget`: a target whose program writes tripwire breadcrumbs, with diagnoses.

One file per target: every run truncates it first, and the program's `hz_tw_host_open`
sizes and re-initialises it, so no run can read another's breadcrumbs; the lifecycle is in
docs/tripwire.md."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..outcome import Outcome, RunResult
from ..targets.base import Target, WrapperTarget, run_kw, supported_kw
from ..tripwire.analysis import analyze
from ..tripwire.layout import Snapshot, decode
from ..tripwire.names import Names
from ..tripwire.session import (MARKER, TripwireFile, diagnosis_evidence, find_tripwire_evidence,
                                             install_hang_collector, register_names, write_artifacts)


def _with_explanation(found: dict[str, Any], explain: Callable[[Snapshot, dict], str | None], raw: bytes,
                      path: str, params: dict) -> dict[str, Any]:
    """Append the program's own reading of the final snapshot (what only it knows: which
    workers a barrier expects, which cause its configuration seeds) to the sentence."""
    try:
        clause = explain(decode(raw, path), params)
    except Exception as e:  # a broken explainer must not lose the engine's diagnosis
        clause = f"(the family's explanation failed: {type(e).__name__}: {e})"
    if not clause:
        return found
    return {**found, "sentence": f"{found.get('sentence', '')} | {clause}", "explanation": clause}


class TripwireTarget(WrapperTarget):
    """Wraps a target whose environment carries `tw.env()`.

    Before each run: truncate the file. After it: a hang already carries the collector's
    live diagnosis; a fault (or a hang the collector could not read) gets a post-mortem
    one from the file, which survives the process. The summary lands in
    `result.evidence["tripwire"]`; with `keep` the raw file is copied into the run's
    artifact folder ("failures": only for non-clean runs). `explain(snapshot, params)`, when
    given (a family's `explain_hang`), reads the final file after a hang or fault and its
    clause is appended to the sentence. `reset=False` for a server (the file is mapped by a
    process that serves many runs); `owns_file`: `close` removes the file too.
    """

    def __init__(self, inner: Target, tw: TripwireFile, names: Names | None = None, keep: str = "failures",
                 explain: Callable[[Snapshot, dict], str | None] | None = None, *, reset: bool = True,
                 owns_file: bool = False) -> None:
        if keep not in ("always", "failures", "never"):
            raise ValueError(f"keep must be always|failures|never, not {keep!r}")
        super().__init__(inner)
        self.tw = tw
        self.names = names or Names()
        self.keep_mode = keep
        self.explain = explain
        # A server maps the file once for many runs: truncating it under that mapping would
        # fault the kernel's next store, so a server's file is never reset (its launch
        # generation tells one run's breadcrumbs from another's).
        self.reset = reset
        self.owns_file = owns_file
        register_names(tw.path, self.names)
        install_hang_collector()

    def run(self, params: dict | None = None, *, timeout: float, launches: int | None = None,
            artifact_dir: Path | None = None, stall: float | None = None,
            cutoff: float | None = None) -> RunResult:
        if self.reset:
            self.tw.reset()
        r = self.inner.run(params, timeout=timeout, launches=launches, artifact_dir=artifact_dir,
                           **supported_kw(self.inner, run_kw(stall, cutoff)))
        art = Path(r.artifact_dir) if r.artifact_dir else artifact_dir
        found = find_tripwire_evidence(r.evidence)
        if found is None and r.outcome in (Outcome.FAULT, Outcome.HANG):
            raw = self.tw.read()
            snap = decode(raw, str(self.tw.path))
            diag = analyze(snap, None, self.names, live=False)
            found = diagnosis_evidence(diag, write_artifacts(art, "postmortem", diag, [(raw, snap)]), "post-mortem")
        if found is not None and self.explain is not None and r.outcome in (Outcome.FAULT, Outcome.HANG):
            found = _with_explanation(found, self.explain, self.tw.read(), str(self.tw.path), params or {})
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

    def close(self) -> None:
        """Close the inner target, then remove the file if this wrapper made it for it."""
        try:
            super().close()
        finally:
            if self.owns_file:
                self.tw.close()
