"""Gates for candidates: is this kernel change better than the baseline, without trading correctness?

`perf` is the faithful per-task performance gate (FAITHFUL_RESULT lines from the real
megakernel, baseline and candidate interleaved on one exclusively leased GPU, rank-based
intervals on the candidate/baseline ratios, five verdicts). `logits` is the logit /
perplexity gate (paired per-position statistics against a precision-matched reference).
`synthlm` is the model and language the logit gate is shown on. docs/gates.md has both.
"""

# Defaults of the logit gate's limits, here so the CLI can show them without importing numpy.
# Calibrated on the synthetic-language model (docs/gates.md): a correct reordering sits
# near 1e-12 nats of KL, the mildest known-bad candidate (bf16 logits) near 3e-5.
LOGIT_DEFAULT_RATIO = 1.0001
LOGIT_DEFAULT_MAX_KL = 1e-6
