"""The logit gate: a candidate's teacher-forced logits on a corpus against a matched reference.

Inputs are two `.npz` files (`save` writes them): `logits` (S, T, V_padded) float32 --
what the path's logit sink holds --, `targets` (S, T) the corpus tokens each position
predicts, `vocab_size` V (the columns past V are padding and never enter a softmax),
`weight_format` (the weight precision the path declares), and for the candidate
`emitted` (S, T): the token the path itself chose from its own logits (the sink
self-check compares it with the argmax of the sink). More in docs/gates.md.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from hazards.engine.errors import EXIT_HAZARD, EXIT_OK, UserError
from hazards.engine.stats import median_ci
from hazards.gates import LOGIT_DEFAULT_MAX_KL, LOGIT_DEFAULT_RATIO

DEFAULT_RATIO = LOGIT_DEFAULT_RATIO
DEFAULT_MAX_KL = LOGIT_DEFAULT_MAX_KL
DEFAULT_CONF = 0.95
_CHUNK = 8192


class NotMatched(UserError):
    """The reference does not run the candidate's weight precision."""


@dataclasses.dataclass
class LogitSet:
    """One path's sink over a corpus."""

    logits: np.ndarray
    targets: np.ndarray
    vocab_size: int
    weight_format: str
    emitted: np.ndarray | None = None
    name: str = ""


def save(path: str | Path, data: dict[str, Any]) -> None:
    """Write a path's output (logits, targets, vocab_size, weight_format, emitted, path)."""
    arrays = {"logits": np.asarray(data["logits"], dtype=np.float32), "targets": np.asarray(data["targets"]),
              "vocab_size": np.int64(data["vocab_size"]), "weight_format": np.str_(data["weight_format"]),
              "name": np.str_(data.get("path", ""))}
    if data.get("emitted") is not None:
        arrays["emitted"] = np.asarray(data["emitted"])
    np.savez(path, **arrays)


def load(path: str | Path) -> LogitSet:
    """Read and validate one file; UserError naming what is wrong."""
    try:
        with np.load(path, allow_pickle=False) as f:
            files = set(f.files)
            missing = {"logits", "targets", "vocab_size", "weight_format"} - files
            if missing:
                raise UserError(f"{path}: missing {', '.join(sorted(missing))}")
            ls = LogitSet(f["logits"], f["targets"], int(f["vocab_size"]), str(f["weight_format"]),
                          f["emitted"] if "emitted" in files else None,
                          str(f["name"]) if "name" in files else Path(path).stem)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read logits file {path}: {exc}") from None
    return check(ls, str(path))


def check(ls: LogitSet, where: str = "logits") -> LogitSet:
    """Validate shapes and dtypes of a LogitSet (UserError)."""
    if ls.logits.dtype != np.float32:
        raise UserError(f"{where}: logits must be float32, got {ls.logits.dtype} (the gate reads f32 logits)")
    if ls.logits.ndim != 3 or ls.targets.shape != ls.logits.shape[:2]:
        raise UserError(f"{where}: logits must be (S, T, V_padded) with targets (S, T); got "
                        f"{ls.logits.shape} and {ls.targets.shape}")
    if not 1 <= ls.vocab_size <= ls.logits.shape[2]:
        raise UserError(f"{where}: vocab_size {ls.vocab_size} outside 1..{ls.logits.shape[2]}")
    if ls.targets.min() < 0 or ls.targets.max() >= ls.vocab_size:
        raise UserError(f"{where}: targets outside 0..{ls.vocab_size - 1}")
    if not np.isfinite(ls.logits[..., :ls.vocab_size]).all():
        raise UserError(f"{where}: non-finite logits inside the vocabulary")
    if ls.emitted is not None and ls.emitted.shape != ls.targets.shape:
        raise UserError(f"{where}: emitted must have the targets' shape {ls.targets.shape}")
    return ls


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def per_position(ref: LogitSet, cand: LogitSet) -> dict[str, np.ndarray]:
    """Flattened per-position arrays: nll_ref, nll_cand, entropy_ref, entropy_cand, kl,
    argmax_ref, argmax_cand, target, pos (index within its sequence). Softmax over [:V]."""
    v = ref.vocab_size
    s, t, _ = ref.logits.shape
    r2 = ref.logits.reshape(s * t, -1)
    c2 = cand.logits.reshape(s * t, -1)
    y = ref.targets.reshape(-1).astype(np.int64)
    out = {k: np.empty(s * t) for k in ("nll_ref", "nll_cand", "entropy_ref", "entropy_cand", "kl")}
    out["argmax_ref"] = np.empty(s * t, dtype=np.int64)
    out["argmax_cand"] = np.empty(s * t, dtype=np.int64)
    for a in range(0, s * t, _CHUNK):
        b = min(a + _CHUNK, s * t)
        lr = _log_softmax(r2[a:b, :v].astype(np.float64))
        lc = _log_softmax(c2[a:b, :v].astype(np.float64))
        pr, pc = np.exp(lr), np.exp(lc)
        idx = np.arange(b - a)
        out["nll_ref"][a:b] = -lr[idx, y[a:b]]
        out["nll_cand"][a:b] = -lc[idx, y[a:b]]
        out["entropy_ref"][a:b] = -(pr * lr).sum(axis=1)
        out["entropy_cand"][a:b] = -(pc * lc).sum(axis=1)
        out["kl"][a:b] = np.maximum((pr * (lr - lc)).sum(axis=1), 0.0)
        out["argmax_ref"][a:b] = lr.argmax(axis=1)
        out["argmax_cand"][a:b] = lc.argmax(axis=1)
    out["target"] = y
    out["pos"] = np.tile(np.arange(t), s)
    return out


def summarize(pp: dict[str, np.ndarray], mask: np.ndarray, conf: float) -> dict[str, Any]:
    """The paired statistics over the positions in `mask`."""
    d = pp["nll_cand"][mask] - pp["nll_ref"][mask]
    med = median_ci(d.tolist(), conf)
    mean_r, mean_c = float(pp["nll_ref"][mask].mean()), float(pp["nll_cand"][mask].mean())
    return {"positions": int(mask.sum()), "nats_ref": mean_r, "nats_cand": mean_c,
            "ppl_ref": math.exp(mean_r), "ppl_cand": math.exp(mean_c), "ppl_ratio": math.exp(mean_c - mean_r),
            "mean_dnats": float(d.mean()), "median_dnats": med.to_json(),
            "kl_mean": float(pp["kl"][mask].mean()),
            "entropy_ref": float(pp["entropy_ref"][mask].mean()),
            "entropy_cand": float(pp["entropy_cand"][mask].mean()),
            "argmax_agreement": float((pp["argmax_ref"][mask] == pp["argmax_cand"][mask]).mean()),
            "top1_ref": float((pp["argmax_ref"][mask] == pp["target"][mask]).mean()),
            "top1_cand": float((pp["argmax_cand"][mask] == pp["target"][mask]).mean())}


def sink_check(cand: LogitSet) -> dict[str, Any]:
    """Does the sink hold the logits the path used? Its argmax over [:V] must equal the
    token the path emitted at every position."""
    if cand.emitted is None:
        return {"checked": False, "why": "the candidate file has no `emitted` tokens to check the sink against"}
    sink = cand.logits[..., :cand.vocab_size].argmax(axis=-1)
    bad = np.argwhere(sink != cand.emitted)
    out: dict[str, Any] = {"checked": True, "positions": int(sink.size), "mismatches": int(len(bad))}
    if len(bad):
        out["first"] = [int(x) for x in bad[0]]
    return out


def gate_values(fixed: dict[str, Any]) -> dict[str, float]:
    """What each gate compares with its limit."""
    r = fixed["ppl_ratio"]
    return {"ceiling": fixed["ppl_cand"], "ratio": max(r, 1.0 / r), "max_kl": fixed["kl_mean"]}


def check_limits(*, ceiling: float | None = None, ratio: float | None = None, max_kl: float | None = None) -> None:
    """A UserError for a limit no gate can use (None: that gate is off): finite, >= 0, a ratio >= 1."""
    for label, limit in (("ceiling", ceiling), ("ratio", ratio), ("max_kl", max_kl)):
        if limit is not None and (not math.isfinite(limit) or limit < 0 or (label == "ratio" and limit < 1)):
            raise UserError(f"bad {label} limit {limit!r}")


def judge(ref: LogitSet, cand: LogitSet, *, prefix: int | None = None, ceiling: float | None = None,
          ratio: float | None = DEFAULT_RATIO, max_kl: float | None = DEFAULT_MAX_KL, conf: float = DEFAULT_CONF,
          allow_unmatched: bool = False, require_sink: bool = True) -> dict[str, Any]:
    """Compare a candidate with a reference and apply the gates; the JSON-ready verdict."""
    for name, x in (("reference", ref), ("candidate", cand)):
        check(x, name)
    if ref.logits.shape != cand.logits.shape or not np.array_equal(ref.targets, cand.targets):
        raise UserError(f"reference and candidate do not cover the same corpus positions "
                        f"({ref.logits.shape} vs {cand.logits.shape}, or different targets)")
    if ref.vocab_size != cand.vocab_size:
        raise UserError(f"vocab_size differs: reference {ref.vocab_size}, candidate {cand.vocab_size}")
    matched = ref.weight_format == cand.weight_format
    if not matched and not allow_unmatched:
        raise NotMatched(f"the reference is not precision-matched: it runs {ref.weight_format} weights, the "
                         f"candidate declares {cand.weight_format}; quantize the reference's weights the same way "
                         "(or pass --allow-unmatched to see the numbers, which then charge the format to the kernel)")
    t = ref.logits.shape[1]
    prefix = t if prefix is None else prefix
    if not 1 <= prefix <= t:
        raise UserError(f"prefix must be in 1..{t}, got {prefix}")
    check_limits(ceiling=ceiling, ratio=ratio, max_kl=max_kl)
    pp = per_position(ref, cand)
    fixed = summarize(pp, pp["pos"] < prefix, conf)
    full = summarize(pp, np.ones_like(pp["pos"], dtype=bool), conf)
    values = gate_values(fixed)
    gates = []
    for label, limit in (("ceiling", ceiling), ("ratio", ratio), ("max_kl", max_kl)):
        if limit is None:
            gates.append({"gate": label, "value": values[label], "limit": None, "passed": None})
        else:
            gates.append({"gate": label, "value": values[label], "limit": limit, "passed": values[label] <= limit})
    sink = sink_check(cand)
    failed = [g["gate"] for g in gates if g["passed"] is False]
    if sink.get("checked") and sink["mismatches"]:
        failed.append("sink")
    elif not sink.get("checked") and require_sink:
        failed.append("sink")
    if not matched:
        failed.append("unmatched")
    if not any(g["passed"] is not None for g in gates):
        failed.append("no_gate")  # nothing was checked: never a pass
    return {"verdict": "fail" if failed else "pass", "failed": failed, "reference": ref.name,
            "candidate": cand.name, "weight_format": {"reference": ref.weight_format, "candidate": cand.weight_format},
            "matched": matched, "prefix": prefix, "fixed_prefix": fixed, "full": full, "gates": gates, "sink": sink,
            "conf": conf}


def format_report(res: dict[str, Any]) -> str:
    """Human lines for one judgement."""
    f, full = res["fixed_prefix"], res["full"]
    m = f["median_dnats"]
    iv = f"[{m['lo']:.3g}, {m['hi']:.3g}]" if m["lo"] is not None else "[unresolved]"
    lines = [f"{res['candidate']} vs {res['reference']}: {res['verdict'].upper()}"
             + (f" ({', '.join(res['failed'])})" if res["failed"] else ""),
             f"  fixed prefix ({res['prefix']} positions per sequence, {f['positions']} in all): "
             f"ppl ref {f['ppl_ref']:.4f} cand {f['ppl_cand']:.4f} (ratio {f['ppl_ratio']:.6f}); "
             f"median dnats {m['estimate']:.3g} {iv}; mean dnats {f['mean_dnats']:.3g}; KL {f['kl_mean']:.3g}",
             f"  entropy ref {f['entropy_ref']:.4f} cand {f['entropy_cand']:.4f}; argmax agreement "
             f"{f['argmax_agreement']:.4f}; top-1 vs corpus: ref {f['top1_ref']:.4f} cand {f['top1_cand']:.4f}",
             f"  full slice: ppl ref {full['ppl_ref']:.4f} cand {full['ppl_cand']:.4f}"]
    for g in res["gates"]:
        state = "not set" if g["passed"] is None else ("pass" if g["passed"] else "FAIL")
        lim = "" if g["limit"] is None else f" <= {g['limit']:.6g}"
        lines.append(f"  gate {g['gate']:<8} {g['value']:.6g}{lim}: {state}")
    s = res["sink"]
    if s.get("checked"):
        lines.append(f"  sink self-check: {s['mismatches']} of {s['positions']} positions disagree with the "
                     f"path's own argmax" + ("" if not s["mismatches"] else f" (first at {s['first']})"))
    else:
        lines.append(f"  sink self-check: not possible: {s['why']}")
    if not res["matched"]:
        lines.append(f"  reference NOT precision-matched ({res['weight_format']['reference']} vs "
                     f"{res['weight_format']['candidate']}): these numbers charge the format to the kernel")
    return "\n".join(lines)


def verdicts_exit(results: Sequence[dict[str, Any]]) -> int:
    """0 when every judgement passed, else 1."""
    return EXIT_OK if all(r["verdict"] == "pass" for r in results) else EXIT_HAZARD
