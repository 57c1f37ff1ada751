"""Gates for candidates: is this kernel change better than the baseline, without trading
correctness?

`perf` is the faithful per-task performance gate (FAITHFUL_RESULT lines from the real
megakernel, baseline and candidate interleaved on one exclusively leased GPU, rank-based
intervals on the candidate/baseline ratios, five verdicts). `logits` is the logit /
perplexity gate (paired per-position statistics against a precision-matched reference).
`synthlm` is the model and language the logit gate is shown on. docs/gates.md has both.
"""
