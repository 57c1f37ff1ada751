"""The logit gate on the synthetic-language model: every known-bad candidate, one table.

    python3 -m hazards.gates.synthlm.harness --out /tmp/lg        # GPU if there is one
    python3 -m hazards.gates.synthlm.harness --config tiny --device cpu --out /tmp/lg
More in docs/gates.md.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from hazards.gates import logits as lg

SCENARIOS: tuple[tuple[str, str, str, str], ...] = (
    ("clean", "reference", "clean", "pass"),
    ("accum23", "reference", "accum23", "fail"),
    ("bf16_logits", "reference", "bf16_logits", "fail"),
    ("quant_candidate_only", "reference", "quant_candidate_only", "fail"),
    ("quantized_matched", "reference_mxfp4", "quantized", "pass"),
    ("quantized_unmatched", "reference", "quantized", "refused"),
    ("sink_striped", "reference", "sink_striped", "fail"),
)
CEILING_MARGIN_NATS = 0.5
KNOWN_BAD = ("accum23", "bf16_logits", "quant_candidate_only")  # caught by the statistics, not the sink
CORRECT = ("clean", "quantized_matched")


def calibration(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The calibration form of this harness's scenarios (see `calibration_form`)."""
    rows = {r["scenario"]: r["fixed_prefix"] for r in result["scenarios"]}
    return calibration_form(rows, CORRECT, KNOWN_BAD, result["ratio"], result["max_kl"])


def calibration_form(fixed: dict[str, dict[str, Any]], correct: Sequence[str], known_bad: Sequence[str],
                     ratio: float, max_kl: float) -> list[dict[str, Any]]:
    """The ragged-decode contract's calibration form, per statistical gate, from each path's
    fixed-prefix statistics: the floor E (the largest value a correct path reached), the
    least detectable known-bad D, the limit, tol/E and D/tol."""
    out = []
    for gate, limit, value in (("ratio", ratio - 1.0, lambda f: max(f["ppl_ratio"], 1 / f["ppl_ratio"]) - 1),
                               ("max_kl", max_kl, lambda f: f["kl_mean"])):
        e = max(value(fixed[s]) for s in correct)
        ds = {s: value(fixed[s]) for s in known_bad}
        d_name = min(ds, key=ds.get)
        out.append({"gate": gate, "E": e, "D": ds[d_name], "D_from": d_name, "tol": limit,
                    "tol_over_E": limit / e if e > 0 else float("inf"),
                    "D_over_tol": ds[d_name] / limit if limit > 0 else float("inf")})  # (a limit of 0: --ratio 1)
    return out


def calibration_lines(form: list[dict[str, Any]]) -> list[str]:
    """The form as the lines both harnesses print."""
    return [f"calibration {c['gate']}: floor E {c['E']:.3g} (largest of a correct path), least detectable known-bad "
            f"D {c['D']:.3g} ({c['D_from']}), tol {c['tol']:.3g}: tol/E {c['tol_over_E']:.3g}, D/tol {c['D_over_tol']:.3g}"
            for c in form]


def run(config: str, device: str | None, out: Path, max_seconds: float | None, ratio: float, max_kl: float,
        force: bool = False, log: Any = None) -> dict[str, Any]:
    """Train/load, run every path, judge every scenario; the whole result as JSON."""
    import numpy as np
    import torch

    from hazards.gates.synthlm import language, model, train

    params, summary = train.load_or_train(config, device, max_seconds, force, log)
    device = summary["device"] if device is None else device
    params = {k: v.to(device) for k, v in params.items()}
    cfg = train.CONFIGS[config]
    tc = train.TINY_TRAIN if config == "tiny" else train.TrainConfig()
    toks = train.eval_tokens(cfg, tc)
    floor_pp = language.bayes_nll(train.language_for(cfg, tc), toks)[:, 1:]
    floor = float(floor_pp.mean())
    ceiling = math.exp(floor + CEILING_MARGIN_NATS)
    out.mkdir(parents=True, exist_ok=True)
    tokens = torch.from_numpy(toks).to(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    sets: dict[str, lg.LogitSet] = {}
    path_seconds = {}
    for name, path in model.PATHS.items():
        t0 = time.monotonic()
        data = model.run_path(params, tokens, cfg, path)
        path_seconds[name] = round(time.monotonic() - t0, 3)
        lg.save(out / f"{name}.npz", data)
        sets[name] = lg.LogitSet(data["logits"], data["targets"], data["vocab_size"], data["weight_format"],
                                 data["emitted"], name)
    rows = []
    for scen, ref_name, cand_name, expected in SCENARIOS:
        try:
            res = lg.judge(sets[ref_name], sets[cand_name], ceiling=ceiling, ratio=ratio, max_kl=max_kl)
            got = res["verdict"]
        except lg.NotMatched as exc:
            res = lg.judge(sets[ref_name], sets[cand_name], ceiling=ceiling, ratio=ratio, max_kl=max_kl,
                           allow_unmatched=True)
            res["refused"] = str(exc)
            got = "refused"
        res.update(scenario=scen, expected=expected, got=got, ok=got == expected)
        rows.append(res)
    return {"config": config, "training": summary, "floor_nats": floor,
            "entropy_rate": language.entropy_rate(train.language_for(cfg, tc)),
            "ceiling": ceiling, "ratio": ratio, "max_kl": max_kl,
            # the summation alone (weights and sinks aside): a correct reordering vs the hazard
            "gemm_rel_error": {n: model.gemm_rel_error(model.PATHS[n]) for n in ("clean", "accum23")},
            "path_seconds": path_seconds, "files": str(out), "scenarios": rows,
            "floor_positions": int(np.size(floor_pp))}


def finish(result: dict[str, Any]) -> dict[str, Any]:
    result["calibration"] = calibration(result)
    return result


def table(result: dict[str, Any]) -> str:
    """The markdown table of scenarios."""
    lines = ["| scenario | expected | got | ppl ratio (fixed prefix) | median Δnats [interval] | mean KL | "
             "argmax agreement | top-1 ref / cand | entropy ref / cand | sink mismatches | failed gates |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["scenarios"]:
        f = r["fixed_prefix"]
        m = f["median_dnats"]
        iv = f"{m['estimate']:.2e} [{m['lo']:.2e}, {m['hi']:.2e}]" if m["lo"] is not None else f"{m['estimate']:.2e}"
        s = r["sink"]
        lines.append(f"| {r['scenario']} | {r['expected']} | {r['got']} | {f['ppl_ratio']:.6f} | {iv} | "
                     f"{f['kl_mean']:.2e} | {f['argmax_agreement']:.4f} | {f['top1_ref']:.4f} / {f['top1_cand']:.4f} | "
                     f"{f['entropy_ref']:.4f} / {f['entropy_cand']:.4f} | "
                     f"{s.get('mismatches', 'n/a')} | {', '.join(r['failed']) or '-'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m hazards.gates.synthlm.harness", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="small", choices=("small", "tiny"))
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", type=Path, required=True, help="folder for the .npz sinks and result.json")
    ap.add_argument("--max-seconds", type=float, default=None, help="training time limit (if not cached)")
    ap.add_argument("--ratio", type=float, default=lg.DEFAULT_RATIO)
    ap.add_argument("--max-kl", type=float, default=lg.DEFAULT_MAX_KL)
    ap.add_argument("--force", action="store_true", help="retrain even if cached")
    args = ap.parse_args(argv)
    try:
        result = finish(run(args.config, args.device, args.out, args.max_seconds, args.ratio, args.max_kl, args.force,
                            log=lambda s: print(s, file=sys.stderr, flush=True)))
    except Exception as exc:  # noqa: BLE001
        print(f"logit harness: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    (args.out / "result.json").write_text(json.dumps(result, indent=1))
    t = result["training"]
    print(f"model: {t['params']} params, {t['steps']} steps in {t['train_seconds']}s on {t['device']}; "
          f"held-out loss {t['eval_loss']:.4f} nats vs exact floor {t['floor']:.4f} (gap {t['gap_nats']:.4f}); "
          f"entropy rate {result['entropy_rate']:.4f}; unigram {t['unigram_entropy']:.4f}")
    print("GEMM relative error of the summation: " + ", ".join(f"{k} {v:.2e}" for k, v in result["gemm_rel_error"].items()))
    print(table(result))
    for line in calibration_lines(result["calibration"]):
        print(line)
    for r in result["scenarios"]:
        print("LOGIT_GATE " + json.dumps({k: r[k] for k in ("scenario", "expected", "got", "ok", "failed")}
                                         | {"fixed_prefix": r["fixed_prefix"], "sink": r["sink"]}))
    return 0 if all(r["ok"] for r in result["scenarios"]) else 1


if __name__ == "__main__":
    sys.exit(main())
