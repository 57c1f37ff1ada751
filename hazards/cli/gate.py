"""`hazards gate perf` and `hazards gate logits`: is a candidate better than the baseline?

Better without trading correctness (docs/gates.md)."""
from __future__ import annotations

import json
import sys
from typing import List, Optional

import typer

from hazards.cli.app import app
from hazards.cli.options import JsonOption, LeaseFlags, lease_options, split_names
from hazards.engine.errors import check_seconds
from hazards.engine.classify import DEFAULT_FAITHFUL_COS_MIN
from hazards.gates import LOGIT_DEFAULT_MAX_KL, LOGIT_DEFAULT_RATIO
from hazards.gates.perf import (DEFAULT_CONF, DEFAULT_MIN_EFFECT, DEFAULT_MIN_US, DEFAULT_PLAIN_LAUNCHES,
                                DEFAULT_REPEATS, DEFAULT_WORKERS)

gate_app = typer.Typer(name="gate", help="Gates for candidates: the faithful per-task perf gate and the logit gate.",
                       no_args_is_help=True)
app.add_typer(gate_app, name="gate")

_PERF_HELP = """The faithful per-task performance gate: baseline vs candidate(s) on one
exclusively leased GPU, interleaved A B A B, across a worker sweep.

BASELINE and CANDIDATE are commands (one string each, split like a shell would, no shell
run) that print FAITHFUL_RESULT lines (docs/protocol.md); `{workers}` in a command and
$HZ_NUM_WORKERS give it the grid size, $HZ_GATE_SEED the pair's input seed. Or
`megakernel:NAME`, a candidate of the ragged-decode megakernel run in one warm server
(NAME: baseline, improved, noop, slower, sloughing, incorrect, production), or
`megakernel_layers:NAME`, one of the layered MoE decode megakernel (NAME: production, noop,
depth1, chunks64, chunks32, round3, step_a, step_b, step_c, step_d, step_d_chunks64, ring_smem,
stale_descriptor). `megakernel_layers:NAME@REV` builds NAME from the kernel sources as they
are at git revision REV of the checkout (extracted into the build cache; the JSON and the
table name it by its full commit); the faithful server driving it is today's Python, so a
revision whose binary answers in another format stops the gate with one line (exit 2).
Every megakernel_layers sample also times its plain build (no profiler, tripwire compiled
out: what users run; --plain-launches launches): the row `launch` (task id 65536), one time
per launch in all three metrics, one interval; `--task launch` judges it alone.

Per worker count and task it prints the candidate/baseline ratios of slowCTA, wall and
sumCTA with rank-based intervals, cos, and a verdict: faster, no-change, slower,
sloughing (slowCTA down but sumCTA up) or incorrect (cos below --cos-min, or a crashed
run). Exit 0 for faster/no-change, 1 otherwise, 2 bad input or a baseline that fails (a
--task that names no task of the baseline's first run stops the gate after that run).
Every run is stored (--store) as one campaign of kind gate-perf, its verdicts in its spec.

Example:\n
  hazards gate perf --baseline megakernel:baseline --candidate megakernel:improved --workers 66,132
"""


@gate_app.command("perf", help=_PERF_HELP)
@lease_options
def perf_command(
    baseline: str = typer.Option(..., "--baseline", help="Baseline command (a string), megakernel:NAME or megakernel_layers:NAME[@REV]."),
    candidate: List[str] = typer.Option(..., "--candidate", help="A candidate to judge (repeatable): for perf a command, megakernel:NAME or megakernel_layers:NAME[@REV], for logits an .npz sink."),
    workers: str = typer.Option(",".join(map(str, DEFAULT_WORKERS)), "--workers",
                                help="Worker counts (grid sizes) to sweep, comma-separated."),
    repeats: int = typer.Option(DEFAULT_REPEATS, "--repeats", help="Interleaved pairs per worker count (12 gives exact intervals "
                                "for up to 20 judged cells and resolves a 5% change at <=3% run noise)."),
    task: Optional[List[str]] = typer.Option(None, "--task", help="Judge only these task ids or names.",
                                             show_default="every task both sides report"),
    cos_min: float = typer.Option(DEFAULT_FAITHFUL_COS_MIN, "--cos-min", help="A run with cos below this is incorrect."),
    conf: float = typer.Option(DEFAULT_CONF, "--conf", help="Confidence level of the intervals."),
    min_effect: float = typer.Option(DEFAULT_MIN_EFFECT, "--min-effect",
                                     help="Smallest relative change called faster/slower."),
    min_us: float = typer.Option(DEFAULT_MIN_US, "--min-us", help="Tasks whose baseline slowCTA is shorter are not judged."),
    profiled_launches: int = typer.Option(5, "--profiled-launches",
                                          help="Profiled launches per megakernel:NAME sample (medians over them)."),
    plain_launches: int = typer.Option(DEFAULT_PLAIN_LAUNCHES, "--plain-launches",
                                       help="Plain-build launches per megakernel_layers:NAME sample: the row "
                                            "'launch' (the machine code users run: no profiler, tripwire compiled "
                                            "out), the median CUDA-event time per launch; 0: no such row."),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds a run may take before it is a hang."),
    lease: LeaseFlags = LeaseFlags(wait="1h", exclusive=True),  # --store, --lease-dir, --wait, --exclusive
    json_out: JsonOption = False,
) -> None:
    from hazards.gates import perf

    check_seconds(timeout, "--timeout")
    result = perf.run_gate(baseline, candidate, workers=perf.parse_workers(workers), repeats=repeats,
                           conf=conf, min_effect=min_effect, min_us=min_us, cos_min=cos_min,
                           tasks=split_names(task) or None, timeout=timeout, launches=profiled_launches,
                           plain_launches=plain_launches,
                           wait_s=lease.wait_s, store_path=lease.store_path, lock_dir=lease.lock_dir,
                           exclusive=lease.exclusive, progress=lambda s: print(s, file=sys.stderr, flush=True))
    if json_out:
        print(json.dumps(result))
    else:
        print(perf.format_report(result))
    sys.exit(perf.exit_code(result))


_LOGITS_HELP = """The logit / perplexity gate: a candidate path's per-position logits against a
precision-matched reference over the same corpus positions (teacher-forced).

REFERENCE and CANDIDATE are .npz files: logits (S, T, V_padded) float32, targets (S, T),
vocab_size, weight_format, and for the candidate `emitted` (the tokens the path chose
itself, for the sink self-check). The vocabulary padding is sliced out of every softmax.

Prints paired per-position statistics (median Δnats with its interval, mean KL, entropy
of both, argmax agreement and top-1 accuracy of each against the corpus, perplexity over a
fixed prefix and overall) and applies the gates: --ceiling on the candidate's fixed-prefix
perplexity, --ratio on the two-sided perplexity ratio, --max-kl on the mean KL. Exit 0 pass,
1 fail, 2 bad input or a reference that is not precision-matched (declared weight formats differ).

Example:\n
  hazards gate logits --reference ref.npz --candidate cand.npz --prefix 64 --ceiling 12.5
"""


@gate_app.command("logits", help=_LOGITS_HELP)
def logits_command(
    reference: str = typer.Option(..., "--reference", help="The precision-matched reference's .npz."),
    candidate: List[str] = typer.Option(..., "--candidate", help="A candidate to judge (repeatable): for perf a command, megakernel:NAME or megakernel_layers:NAME[@REV], for logits an .npz sink."),
    prefix: Optional[int] = typer.Option(None, "--prefix", help="Fixed-prefix positions per sequence.",
                                         show_default="all"),
    ceiling: Optional[float] = typer.Option(None, "--ceiling", help="Max fixed-prefix perplexity of the candidate.",
                                            show_default="none"),
    ratio: float = typer.Option(LOGIT_DEFAULT_RATIO, "--ratio", help="Max two-sided fixed-prefix perplexity ratio (>= 1)."),
    max_kl: float = typer.Option(LOGIT_DEFAULT_MAX_KL, "--max-kl", help="Max mean KL(reference || candidate) in nats."),
    conf: float = typer.Option(0.95, "--conf", help="Confidence level of the intervals."),
    allow_unmatched: bool = typer.Option(False, "--allow-unmatched",
                                         help="Compare even if the declared weight formats differ (never passes)."),
    no_sink_check: bool = typer.Option(False, "--no-sink-check",
                                       help="Do not fail a candidate without `emitted` tokens."),
    json_out: JsonOption = False,
) -> None:
    from hazards.engine.errors import UserError
    from hazards.gates import logits as lg

    if not 0 < conf < 1:
        raise UserError(f"--conf must be between 0 and 1, got {conf:g}")
    ref = lg.load(reference)
    results = []
    for path in candidate:
        res = lg.judge(ref, lg.load(path), prefix=prefix, ceiling=ceiling, ratio=ratio, max_kl=max_kl, conf=conf,
                       allow_unmatched=allow_unmatched, require_sink=not no_sink_check)
        results.append(res)
        print(json.dumps(res) if json_out else lg.format_report(res), flush=True)
    sys.exit(lg.verdicts_exit(results))
