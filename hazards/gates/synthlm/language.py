"""A synthetic language whose best possible predictor is known exactly: a hidden Markov source.

Tokens are emitted by a hidden Markov chain with sparse transitions and overlapping sparse
emissions, so the next token depends on the whole past through the posterior over hidden
states. Because the source is known, the Bayes-optimal next-token loss at every position
of a corpus is computed exactly by the forward algorithm (`bayes_nll`): no model can beat
it in expectation, so a trained model's loss is read against an exact floor, and the
entropy rate of the source is the limit of that floor along a sequence. More in docs/gates.md.
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Hmm:
    """start (S,), trans (S, S) rows sum to 1, emit (S, V) rows sum to 1."""

    start: np.ndarray
    trans: np.ndarray
    emit: np.ndarray

    @property
    def states(self) -> int:
        return self.trans.shape[0]

    @property
    def vocab(self) -> int:
        return self.emit.shape[1]


def _sparse_rows(rng: np.random.Generator, rows: int, cols: int, support: int, alpha: float) -> np.ndarray:
    out = np.zeros((rows, cols))
    for r in range(rows):
        idx = rng.choice(cols, size=support, replace=False)
        out[r, idx] = rng.dirichlet(np.full(support, alpha))
    return out


def make_hmm(seed: int = 0, states: int = 32, vocab: int = 96, emit_support: int = 6,
             trans_support: int = 3, alpha: float = 1.0) -> Hmm:
    """A random sparse HMM: each state moves to `trans_support` states and emits one of
    `emit_support` tokens (Dirichlet(alpha) weights); tokens are shared between states."""
    rng = np.random.default_rng(seed)
    trans = _sparse_rows(rng, states, states, trans_support, alpha)
    emit = _sparse_rows(rng, states, vocab, emit_support, alpha)
    # start from the chain's stationary distribution (power iteration)
    pi = np.full(states, 1.0 / states)
    for _ in range(2000):
        pi = pi @ trans
    pi /= pi.sum()
    return Hmm(pi, trans, emit)


def _support(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the columns with nonzero probability (padded) and their cumulative sums."""
    width = int((probs > 0).sum(axis=1).max())
    cols = np.zeros((probs.shape[0], width), dtype=np.int64)
    cdf = np.ones((probs.shape[0], width))
    for r in range(probs.shape[0]):
        nz = np.flatnonzero(probs[r])
        cols[r, :len(nz)] = nz
        cols[r, len(nz):] = nz[-1]
        cdf[r, :len(nz)] = np.cumsum(probs[r, nz])
    cdf[:, -1] = np.maximum(cdf[:, -1], 1.0)
    return cols, cdf


def _draw(rng: np.random.Generator, rows: np.ndarray, table: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """One categorical draw for each entry of `rows` from that row of a sparse table."""
    cols, cdf = table
    u = rng.random((rows.shape[0], 1))
    k = np.minimum((u > cdf[rows]).sum(axis=1), cols.shape[1] - 1)
    return cols[rows, k]


def sample(hmm: Hmm, n_seq: int, length: int, seed: int) -> np.ndarray:
    """(n_seq, length) int64 token sequences drawn from the source."""
    rng = np.random.default_rng(seed)
    start = _support(hmm.start[None, :])
    emit, trans = _support(hmm.emit), _support(hmm.trans)
    state = _draw(rng, np.zeros(n_seq, dtype=np.int64), start)
    out = np.empty((n_seq, length), dtype=np.int64)
    for t in range(length):
        out[:, t] = _draw(rng, state, emit)
        state = _draw(rng, state, trans)
    return out


def bayes_nll(hmm: Hmm, tokens: np.ndarray) -> np.ndarray:
    """Exact -log p(x_t | x_<t) under the source, per position (nats, float64).

    The forward algorithm with normalisation: belief b_t = P(s_t | x_<t); the predictive
    p(x_t | x_<t) = b_t . emit[:, x_t]; then b_{t+1} ∝ (b_t * emit[:, x_t]) @ trans.
    """
    tokens = np.asarray(tokens)
    n, length = tokens.shape
    belief = np.broadcast_to(hmm.start, (n, hmm.states)).copy()
    out = np.empty((n, length))
    for t in range(length):
        e = hmm.emit[:, tokens[:, t]].T  # (n, S): emission prob of the observed token per state
        joint = belief * e
        p = joint.sum(axis=1)
        out[:, t] = -np.log(p)
        belief = (joint / p[:, None]) @ hmm.trans
    return out


def entropy_rate(hmm: Hmm, length: int = 512, n_seq: int = 2048, seed: int = 12345, burn_in: int = 256) -> float:
    """The source's entropy rate (nats/token), estimated as the mean exact conditional loss
    past `burn_in` positions of a long sample (the limit of the per-position floor)."""
    toks = sample(hmm, n_seq, length, seed)
    return float(bayes_nll(hmm, toks)[:, burn_in:].mean())
