"""Train the small MoE transformer on the hidden-Markov language; cache the weights.

    python3 -m hazards.gates.synthlm.train                    # GPU if there is one
    python3 -m hazards.gates.synthlm.train --max-seconds 30 --force
    python3 -m hazards.gates.synthlm.train --config tiny --device cpu   # the CPU tests' model
More in docs/gates.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from hazards.gates.synthlm import language
from hazards.gates.synthlm.model import LAYERS, TINY, ModelConfig

CONFIGS = {"small": ModelConfig(), "tiny": TINY, "layers": LAYERS}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 3000
    batch: int = 64
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.01
    train_sequences: int = 65536
    seed: int = 0
    hmm_seed: int = 0
    eval_sequences: int = 256
    eval_seed: int = 7


TINY_TRAIN = TrainConfig(steps=40, batch=16, lr=1e-2, warmup=5, train_sequences=1024, eval_sequences=32)


def language_params(cfg: ModelConfig, tc: TrainConfig) -> dict[str, Any]:
    """The hidden-Markov source a model config is trained on. Emissions are peaked
    (Dirichlet 0.3 over 6 tokens per state): about 1 nat per token, so the best guess is
    right often enough (top-1 ~60 %) that argmax agreement means something."""
    big = cfg.vocab >= 64
    return {"seed": tc.hmm_seed, "states": 32 if big else 6, "vocab": cfg.vocab, "emit_support": 6 if big else 3,
            "trans_support": 3, "alpha": 0.3}


def language_for(cfg: ModelConfig, tc: TrainConfig) -> language.Hmm:
    """The source a model config is trained on (see `language_params`)."""
    return language.make_hmm(**language_params(cfg, tc))


def eval_tokens(cfg: ModelConfig, tc: TrainConfig) -> np.ndarray:
    """The held-out corpus: (eval_sequences, context + 1) tokens."""
    return language.sample(language_for(cfg, tc), tc.eval_sequences, cfg.context + 1, tc.eval_seed)


def cache_dir() -> Path:
    """Per-user cache folder for trained weights (outside any checkout)."""
    env = os.environ.get("HZ_CACHE_DIR")
    if env:
        return Path(env) / "synthlm"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "hazards" / "synthlm"


def cache_key(cfg: ModelConfig, tc: TrainConfig, max_seconds: float | None) -> str:
    blob = json.dumps({"model": dataclasses.asdict(cfg), "train": dataclasses.asdict(tc),
                       "language": language_params(cfg, tc), "max_seconds": max_seconds, "format": 1}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _loss(params: dict, tokens: Any, cfg: ModelConfig) -> Any:
    import torch.nn.functional as F

    from hazards.gates.synthlm.model import forward

    logits = forward(params, tokens[:, :-1], cfg)[..., :cfg.vocab]  # the pad is never trained
    return F.cross_entropy(logits.reshape(-1, cfg.vocab), tokens[:, 1:].reshape(-1))


def evaluate_loss(params: dict, cfg: ModelConfig, tc: TrainConfig, device: str) -> tuple[float, float]:
    """(model loss, exact Bayes floor) in nats/token on the held-out corpus, in f32 without TF32."""
    import torch

    toks = eval_tokens(cfg, tc)
    # the model predicts tokens 1..T from their prefixes: the floor over the same positions
    floor = float(language.bayes_nll(language_for(cfg, tc), toks)[:, 1:].mean())
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            t = torch.from_numpy(toks).to(device)
            losses = [float(_loss(params, t[s:s + 64], cfg)) * min(64, len(t) - s) for s in range(0, len(t), 64)]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return sum(losses) / len(t), floor


def train(cfg: ModelConfig, tc: TrainConfig, device: str, max_seconds: float | None = None,
          log: Any = None) -> tuple[dict, dict[str, Any]]:
    """Train from scratch; (params, summary). Stops at `tc.steps` or after `max_seconds`."""
    import torch

    from hazards.gates.synthlm.model import init_params

    torch.manual_seed(tc.seed)
    hmm = language_for(cfg, tc)
    data = torch.from_numpy(language.sample(hmm, tc.train_sequences, cfg.context + 1, tc.seed + 1)).to(device)
    params = init_params(cfg, tc.seed, device)
    for p in params.values():
        p.requires_grad_(True)
    decay = [p for k, p in params.items() if p.dim() == 2 and k != "embed"]
    rest = [p for k, p in params.items() if not (p.dim() == 2 and k != "embed")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=tc.lr, betas=(0.9, 0.95),
                            fused=str(device).startswith("cuda"))
    gen = torch.Generator(device=device).manual_seed(tc.seed + 2)
    t0 = time.monotonic()
    step, loss_ema = 0, None
    torch.backends.cuda.matmul.allow_tf32 = True  # training only; evaluation is strict f32
    try:
        while step < tc.steps:
            if max_seconds is not None and time.monotonic() - t0 > max_seconds:
                break
            frac = step / max(1, tc.steps)
            lr = tc.lr * min(1.0, (step + 1) / tc.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
            for group in opt.param_groups:
                group["lr"] = lr
            idx = torch.randint(0, data.shape[0], (tc.batch,), device=device, generator=gen)
            loss = _loss(params, data[idx], cfg)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
            opt.step()
            step += 1
            if step % 100 == 0 or step == tc.steps:
                loss_ema = float(loss.detach())
                if log:
                    log(f"step {step} loss {loss_ema:.4f} lr {lr:.2e} {time.monotonic() - t0:.1f}s")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
    seconds = time.monotonic() - t0
    params = {k: v.detach() for k, v in params.items()}
    eval_loss, floor = evaluate_loss(params, cfg, tc, device)
    summary = {"steps": step, "train_seconds": round(seconds, 2), "train_loss": loss_ema,
               "eval_loss": eval_loss, "floor": floor, "gap_nats": eval_loss - floor,
               "eval_positions": tc.eval_sequences * cfg.context, "device": str(device),
               "params": sum(v.numel() for v in params.values()),
               "unigram_entropy": _unigram_entropy(hmm)}
    return params, summary


def _unigram_entropy(hmm: language.Hmm) -> float:
    p = hmm.start @ hmm.emit
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def load_or_train(config: str = "small", device: str | None = None, max_seconds: float | None = None,
                  force: bool = False, log: Any = None, tc: TrainConfig | None = None) -> tuple[dict, dict[str, Any]]:
    """The cached model for `config` (trained now if absent or `force`); (params, summary)."""
    import torch

    if config not in CONFIGS:
        raise ValueError(f"unknown config {config!r} (known: {', '.join(CONFIGS)})")
    cfg = CONFIGS[config]
    tc = tc or (TINY_TRAIN if config == "tiny" else TrainConfig())
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    path = cache_dir() / f"{config}-{cache_key(cfg, tc, max_seconds)}.pt"
    if path.exists() and not force:
        blob = torch.load(path, map_location=device, weights_only=True)
        summary = json.loads(blob["summary"])
        summary.update(cached=True, cache=str(path))
        return blob["params"], summary
    params, summary = train(cfg, tc, device, max_seconds, log)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save({"params": {k: v.cpu() for k, v in params.items()}, "summary": json.dumps(summary)}, tmp)
    os.replace(tmp, path)
    summary.update(cached=False, cache=str(path))
    return params, summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m hazards.gates.synthlm.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="small", choices=sorted(CONFIGS))
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    ap.add_argument("--max-seconds", type=float, default=None, help="stop training after this long")
    ap.add_argument("--force", action="store_true", help="retrain even if cached")
    args = ap.parse_args(argv)
    try:
        _, summary = load_or_train(args.config, args.device, args.max_seconds, args.force,
                                   log=lambda s: print(s, file=sys.stderr, flush=True))
    except Exception as exc:  # noqa: BLE001 - one line and an exit code
        print(f"synthlm train: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print("SYNTHLM " + json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
