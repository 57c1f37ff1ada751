"""The faithful per-task check of the layered MoE decode megakernel: FAITHFUL_RESULT lines.

    python3 -m hazards.megakernel_layers.faithful --candidate production --workers 132
    HZ_NUM_WORKERS=64 python3 -m hazards.megakernel_layers.faithful   # the perf gate's way
    python3 -m hazards.megakernel_layers.faithful --serve             # JSON-lines server
    hazards gate perf --baseline megakernel_layers:production --candidate megakernel_layers:depth1
    hazards gate perf --baseline megakernel_layers:production@HEAD~3 --candidate megakernel_layers:production
A request's `revision` and `sources` (the gate's NAME@REV: the full commit id and its tree,
extracted by the gate) build the binary from that tree; this Python side stays the
checkout's, so a binary answering in another format is a one-line `ProtocolMismatch`.
A request's `plain_launches` N (the gate sends it; `--plain-launches` here) also times N
launches of the plain build (no HZ_PROFILER, the tripwire compiled out: the machine code
users run) in the same request, as one more row, `launch` (task id LAUNCH_TASK_ID), whose
slowCTA, wall and sumCTA are all the median CUDA-event time per launch (docs/gates.md).
More in docs/megakernel-layers.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hazards.engine import profiler
from hazards.engine.classify import DEFAULT_FAITHFUL_COS_MIN, signal_name
from hazards.engine.errors import UserError
from hazards.engine.proctree import kill_and_reap
from hazards.kernel_sources import RevisionSources
from hazards.ragged_decode.faithful import faithful_parser, parse_request, workers_from_env

PROFILE_TAG = "MKL_PROFILE "
HEADER_WORDS = 2  # claimed, capacity
SHAPE_KEYS = ("layers", "seq", "chunks", "qkv_tiles", "w13_tiles", "bytes_per_step")
# What `measure` reads from an ok reply: a binary whose reply lacks one speaks another protocol.
REPLY_KEYS = ("cos", "rel_err", "grid", "capacity", "task_names", "kernel_us", *SHAPE_KEYS)
# What a plain build's reply to a `plain_launches` request must carry.
PLAIN_REPLY_KEYS = ("cos", "rel_err", "grid", "plain_us", *SHAPE_KEYS)
# The plain build's launch as a row: its id is outside the profiler's 16-bit task field (MklTask
# ids 2-11, sub-span ids below 2^16), so no profiled span can ever carry it.
LAUNCH_TASK_ID = 1 << 16
LAUNCH_TASK = "launch"
MAX_PLAIN_LAUNCHES = 1000  # the harness's bound
PLAIN_REQUEST_FIELD = 'req.get("plain_launches")'  # how the harness reads the field (megakernel_layers.cu)
BuildKey = tuple[tuple[tuple[str, int], ...], RevisionSources | None, bool]  # (defines, revision, profiled)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A named configuration of the layered megakernel: request fields and build defines.
    `expected` is the gate's verdict against `production`."""

    name: str
    what: str
    expected: str
    params: tuple[tuple[str, Any], ...] = ()
    defines: tuple[tuple[str, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "what": self.what, "expected": self.expected, "params": dict(self.params),
                "defines": dict(self.defines)}


CANDIDATES: dict[str, Candidate] = {c.name: c for c in (
    Candidate("production", "every switch off, the default configuration (MKL_CAMPAIGN_STEP 22: step 21 + step "
              "(t)'s split merge, step_t's code; step 21 = step 15 + step (p)'s router + step (r)'s W13 acq_rel "
              "fences, step_p_r's code. Promoted in the seventeenth session (promote22): two gates production "
              "(step 21) -> step_t on an H100, 2026-12-07, the rule decided before them, both faster: the plain "
              "launch 0.966 [0.960, 0.967] and 0.966 [0.964, 0.968], the profiled worker 0.974 [0.968, 0.980] and "
              "0.978 [0.974, 0.982]; step (t) sums the merge in another order: not step 21's bits, cos against "
              "the reference 0.99999988, step 21's 0.99998697)", "no-change"),
    Candidate("noop", "production from a separately compiled binary (an unused -D)", "no-change",
              defines=(("MKL_NOOP_CANDIDATE", 1),)),
    Candidate("depth1", "round 2's GEMV loop: one iteration's loads in flight (gemv_depth 1)", "slower",
              params=(("gemv_depth", 1),)),
    Candidate("chunks64", "64-token attention chunks (65 chunks for the same tokens): each chunk does half "
              "the work, the per-chunk overheads and the merge's inputs double", "sloughing",
              params=(("chunk_tokens", 64),)),
    # The optimisation campaign: each step's predecessor stays buildable
    # (MKL_CAMPAIGN_STEP in mkl_kernel.cuh), so each step is judged against the production
    # it replaced: step_a vs round3, step_b0 vs step_a, step_b, step_c and step_d vs step_b0 (the
    # production of their time), in round 8 production (step d) vs step_b0 and back,
    # step_e vs step (d), step_f vs step_e (what step (f) adds), step_g vs step_f (what step (g)
    # adds), step_h and step_g_on_e vs step_e (their base), step_i, step_j, step_k and step_l vs
    # step 10 (their base, production from round 14 until step 14; candidate step_10), step_m vs
    # step 14 (its base, production from round 18 until step 15; candidate step_14), step_o, step_p,
    # step_q and step_r vs step 15 (their base, production from round 20 until step 21; candidate step_15),
    # step_p_r vs step 15 too (step 21's code), step_s and step_t vs step 21 (their base, production from
    # promote21 until step 22; candidate step_21; step_t's code is production's since step 22).
    # Production is step 22 (step 21 + step (t), step_t's code): its promotion round gates step_21 (the
    # production it replaces) -> production. Steps (u) and (v) (step_u, step_u16, step_t_u, step_v, step_v_k,
    # step_u_v) are -D switches on the default build: written on step 21, on step 22 since promote22.
    # `expected` is each one's verdict against today's
    # production (step 22), but step_d_chunks64's (against step_d); step_i's, step_j's and step_k's
    # texts keep their verdicts against their base, step_10. step_k_half's and step_k_setaside's were
    # never measured: their `expected` is the hypothesis they were written for, and their texts say so.
    Candidate("round3", "round 3's kernel: the LSE merge and the router issue their loads one at a time "
              "(MKL_CAMPAIGN_STEP 0)", "slower", defines=(("MKL_CAMPAIGN_STEP", 0),)),
    Candidate("step_a", "campaign step (a) only: the merge's loads issued ahead, round 3's router "
              "(MKL_CAMPAIGN_STEP 1)", "slower", defines=(("MKL_CAMPAIGN_STEP", 1),)),
    Candidate("step_b0", "the production before round 8: steps (a) and (b0), the merge on the last chunk "
              "block and the router's loads issued ahead (MKL_CAMPAIGN_STEP 2; step (d)'s bits)", "slower",
              defines=(("MKL_CAMPAIGN_STEP", 2),)),
    Candidate("step_b", "campaign step (b): step_b0 with the router folded into partial logits the O-projection "
              "workers produce (MKL_CAMPAIGN_STEP 3; its logits' last bits differ; slower than step_b0 in round 4)",
              "slower", defines=(("MKL_CAMPAIGN_STEP", 3),)),
    Candidate("step_c", "campaign step (c): step_b0 with every matrix-vector phase's weights (QKV, O-projection, "
              "W13, W2) streamed through a shared-memory ring of bulk copies (MKL_CAMPAIGN_STEP 4; its sums run "
              "in another order: last bits differ; slower than step_b0 in round 5)", "slower",
              defines=(("MKL_CAMPAIGN_STEP", 4),)),
    Candidate("step_d", "campaign step (d), production from round 8 until step 10 (the previous production): the "
              "LSE merge spread over the QKV-tile workers, one head per warp, the last merge arrival releasing the "
              "attention (MKL_CAMPAIGN_STEP 5; step_b0's bits)", "slower", defines=(("MKL_CAMPAIGN_STEP", 5),)),
    Candidate("step_e", "campaign step (e) (round 9; production's base since step 10): step (d) with step (b)'s router "
              "folded into partial logits of the O-projection workers (a warp's experts' weights loaded in one "
              "pass) and the top-k by one warp's butterfly instead of one thread's scan (MKL_CAMPAIGN_STEP 6; step (b)'s logits and routing: last bits differ "
              "from step (d)'s; step 10's and step 14's bits)", "slower", defines=(("MKL_CAMPAIGN_STEP", 6),)),
    Candidate("step_f", "campaign step (f), a candidate (round 10): step (e) with each attention block's V rows "
              "copied to shared memory by cp.async as the block starts, beside its whole K row, instead of loaded "
              "into registers after the scores (one dependent L2 round trip a block, not three; 64 KB more "
              "shared memory; MKL_CAMPAIGN_STEP 7; step (e)'s bits)", "slower", defines=(("MKL_CAMPAIGN_STEP", 7),)),
    Candidate("step_g", "campaign step (g), a candidate (round 11): step (f) with W2's FP8 quantization on 8 warps "
              "instead of 4, every load of a warp's rounds issued before its first amax (one dependent L2 round "
              "trip a warp; step (f)'s: ~7 a round, a spilled load ahead of each next, 3 rounds a warp; "
              "MKL_CAMPAIGN_STEP 8; step (f)'s bits; step 10 with step (f)'s copies, no-change against step 10 in "
              "round 13's launch gate, so against step 14 (step 10 + step (l)), step 15 (step 14 + step (m)) and production slower)", "slower",
              defines=(("MKL_CAMPAIGN_STEP", 8),)),
    Candidate("step_g_on_e", "step (g)'s W2 quantization on step (e), without step (f)'s attention copies "
              "(MKL_CAMPAIGN_STEP 8, MKL_ATTN_AHEAD 0): what step (g) gains where step (f) is not promoted; "
              "step (e)'s bits; step 10's code (the same SASS), production's from round 14 until step 14", "slower",
              defines=(("MKL_CAMPAIGN_STEP", 8), ("MKL_ATTN_AHEAD", 0))),
    Candidate("step_h", "campaign step (h), a candidate: step (e) with the layer head's loads issued ahead: the QKV "
              "tile's and the O-projection's weights before their activations are filled (the RMSNorm, the copy "
              "of attn_out), a warp's items in passes of up to 24 loads a lane (QKV 2 passes a warp, not 4; the "
              "O-projection 1, not 3), the attention's first K row before its q copy and a block's whole K row "
              "before its first FMA (MKL_CAMPAIGN_STEP 9; step (e)'s bits; slower than step_e in round 13)", "slower",
              defines=(("MKL_CAMPAIGN_STEP", 9),)),
    Candidate("step_10", "campaign step 10, the production from round 14 until step 14: "
              "step (e) + step (g), step_g_on_e's code, without step (l)'s copies (MKL_CAMPAIGN_STEP 10; "
              "step 14's bits; slower than step 14 by the launch's gate in round 17, step_l's worker 0.954, so "
              "slower than production)",
              "slower", defines=(("MKL_CAMPAIGN_STEP", 10),)),
    Candidate("step_14", "campaign step 14, the production from round 18 until step 15: "
              "step 10 + step (l), step_l's code, without step (m)'s tensor-core attention (MKL_CAMPAIGN_STEP 14; "
              "step 10's bits, not production's; slower than production by both gates in round 19, step_m's "
              "worker 0.901, the launch 0.907)",
              "slower", defines=(("MKL_CAMPAIGN_STEP", 14),)),
    Candidate("step_15", "campaign step 15, the production from round 20 until step 21 (the production before step 21): "
              "step 14 + step (m), step_m's code, without step (p)'s short router chain and step (r)'s acq_rel "
              "fences (step 18's promotion over it in round 23 was undone by its confirming gate; MKL_CAMPAIGN_STEP 15; "
              "step 21's bits: steps (p) and (r) keep them; not production's since step 22, whose merge sums in "
              "another order; 'slower' read from three gates of step_p_r, step 21's code, against it on H100s: the plain launch faster, 0.974 [0.970, 0.986] and 0.973 "
              "[0.970, 0.989] in round 23, 0.980 [0.975, 0.985] in round 24's confirming gate (the default gate "
              "called the pair slower by attn_merge, a task neither step changes; router_topk 0.70-0.71 the pair's "
              "change))",
              "slower", defines=(("MKL_CAMPAIGN_STEP", 15),)),
    Candidate("step_21", "campaign step 21, the production from promote21 until step 22 (the previous production): "
              "step 15 + step (p)'s router + step (r)'s W13 acq_rel fences, step_p_r's code, without step (t)'s "
              "split merge (MKL_CAMPAIGN_STEP 21; step 15's bits, not production's: step (t) sums the merge in "
              "another order, judged by closeness; 'slower' read from two gates of step_t, production's code, "
              "against it on an H100, 2026-12-07: the plain launch faster, 0.966 [0.960, 0.967] and 0.966 [0.964, "
              "0.968], the profiled worker 0.974 [0.968, 0.980] and 0.978 [0.974, 0.982], attn_merge's slowCTA "
              "0.578 and 0.575, oproj 1.043 [1.029, 1.056] in the first)",
              "slower", defines=(("MKL_CAMPAIGN_STEP", 21),)),
    Candidate("step_i", "campaign step (i), a candidate (round 15): step 10 (its base, step_10) with the GEMVs' row groups "
              "split into column parts of at most one round of the loop where a warp then takes fewer dependent "
              "rounds (gemv_kparts_rounds): the QKV tile 3 parts (3 rounds a warp, not 4), the O-projection 4 (2, "
              "not 3), W2 3 (5, not 6), W13 unchanged (9); the loop's code step 10's, no task spilling more "
              "(MKL_CAMPAIGN_STEP 11; the parts' sums differ: last bits differ from step 10's and step 14's; round "
              "15: slower than step 10, oproj 1.115, the launch no-change)", "slower",
              defines=(("MKL_CAMPAIGN_STEP", 11),)),
    Candidate("step_j", "campaign step (j), a candidate (round 16): step 10 (its base, step_10) with 40-row QKV tiles, "
              "not 64: 128 tiles on 128 of 132 workers, not 80, each 230 KB, not 369 KB (gemv_kparts: 4 parts "
              "of 90 chunks, 3 rounds on the busiest warp, not 4); the same QKV work on more blocks, so the qkv "
              "task's sumCTA may rise as its slowCTA falls (MKL_CAMPAIGN_STEP 12; the parts' sums differ: last "
              "bits differ from step 10's and step 14's; round 16: sloughing against step 10, attn_chunk 1.100, the "
              "launch no-change)", "sloughing", defines=(("MKL_CAMPAIGN_STEP", 12),)),
    Candidate("step_k", "campaign step (k), a candidate (round 16): step 10 (its base, step_10) with the next layer's QKV "
              "weights kept in L2 across the MoE: after its O-projection each QKV tile holder bulk-prefetches its "
              "next-layer tiles under an L2::evict_last policy, the GEMV loop loads under L2::evict_first and a tile "
              "read is demoted (applypriority) (MKL_CAMPAIGN_STEP 13, MKL_L2_KEEP_QKV; no wait moved; step 10's "
              "bits, step 14's; round 17: slower than step 10, router_topk 2.12, worker 1.028 on the launch)",
              "slower", defines=(("MKL_CAMPAIGN_STEP", 13),)),
    Candidate("step_k_half", "step (k) with the evict_last policy on half the kept lines (MKL_L2_KEEP_PCT 50): "
              "the variant if step_k's 29.5 MB kept starve the MoE's prefetch windows (step 10's bits; not "
              "measured: 'faster' is the hypothesis it was written for, and step_k, its base, was slower than "
              "step 10 in round 17)", "faster",
              defines=(("MKL_CAMPAIGN_STEP", 13), ("MKL_L2_KEEP_PCT", 50))),
    Candidate("step_k_setaside", "step (k) with a 30 MB persisting-L2 set-aside (MKL_L2_SET_ASIDE_MB 30: the harness "
              "sets cudaLimitPersistingL2CacheSize once per process, resets it at exit): the variant if step_k's "
              "evict_last lines are not kept without one (step 10's bits; not measured: 'faster' is the "
              "hypothesis it was written for, and step_k, its base, was slower than step 10 in round 17)", "faster",
              defines=(("MKL_CAMPAIGN_STEP", 13), ("MKL_L2_SET_ASIDE_MB", 30))),
    Candidate("step_l", "campaign step (l) (round 17; production's code from step 14 until step 15, step_14's): step 10 with the copies on the "
              "layer's critical path issuing a thread's loads before its stores (the attention's q, the RMSNorm's x "
              "and weight, the router's hn payload, W13's hn, the O-projection's attn_out and its and W2's output "
              "rows; in the harness build several waited for each load before the next), the same loads of the same "
              "kind (MKL_CAMPAIGN_STEP 14; step 10's bits; faster than step 10 by the launch's gate in round 17; slower than step 15, step 14 + step (m), and production)", "slower",
              defines=(("MKL_CAMPAIGN_STEP", 14),)),
    Candidate("step_m", "campaign step (m) (round 19; production's code from step 15 until step 21, step_15's): step 14 (its base, step_14) with the "
              "attention chunk's 32-token block loop on tensor cores at the default shape (GQ 8): per block 16 "
              "mma.sync m16n8k16 bf16 for the scores and 16 for P.V, q and P split into bf16 hi + lo rows (fp32 "
              "accumulation; ~2^-17 relative a product), the softmax in registers (a head's max: 2 shuffles); the "
              "small shape (GQ 4) runs the same loop with half of the mma's rows zero dummies; the same loads' "
              "kinds, waits and sub-span points "
              "(MKL_CAMPAIGN_STEP 15, MKL_ATTN_MMA; other bits than step 14's: judged by closeness; faster than step 14 by "
              "both gates in round 19: worker 0.901 [0.892, 0.910], attn_chunk 0.560, the launch 0.907; against production, "
              "step 22, step 15 + steps (p), (r) and (t), slower: step_15's prediction)", "slower",
              defines=(("MKL_CAMPAIGN_STEP", 15),)),
    Candidate("step_o", "campaign step (o), a candidate: step 15 (its base, production then; step_15) with the W13 arrival's "
              "shared_line emulation image (8 strong L2 loads of the expert's release words by the leader, "
              "spilled at once, one dependent L2 round trip before every W13 arrival) loaded only where the "
              "emulation can store it back (writeback_ppm > 0 and the release words in the counter's 64-B line: "
              "the shared_line layout), so the fixed layout arrives with no load ahead (MKL_CAMPAIGN_STEP 17, "
              "MKL_W13_EMIT_LEAN; no arithmetic changed: step 15's bits, production's; written to shorten the moe_w13 emit by one L2 "
              "round trip; round 22 (an H100) judged it slower: moe_w13 1.031 [1.018, 1.042], the launch 1.020 "
              "[1.015, 1.025]; emit 8.1 us against production's 8.0: the loads were not the emit's time)", "slower",
              defines=(("MKL_CAMPAIGN_STEP", 17),)),
    Candidate("step_p", "campaign step (p) (in production since step 21, with step (r)'s switch): step 15 (its base, "
              "production then; step_15) with the router's last block on a short "
              "chain (router_from_partials_wide): every thread issues its partials (9 a pass, one pass at 132 "
              "workers; step 15's remainder loop waited for up to 8 one at a time) and its payload elements of "
              "h and norm before any add, one block barrier (step 15's 3), the top-k and softmax from the lanes' "
              "registers (no local memory, loops not unrolled); the caller's acquire, the ROUTING publish and "
              "every wait step 15's (MKL_CAMPAIGN_STEP 18, MKL_ROUTER_WIDE; the same sums in the same order: "
              "step 15's bits; round 22 (an H100): router_topk 0.641 [0.620, 0.677] and the launch 0.984 [0.980, 0.989] "
              "(no-change: inside the gate's 2% minimum effect), but the default gate slower by oproj 1.051 "
              "[1.016, 1.085], whose sub-spans did not move; the bench without the profiler 574.7 against 595.5 us, "
              "unpaired; round 23 (H100s): the plain launch 0.980 [0.976, 0.991] faster, 0.981 no-change in the "
              "default gate (slower by attn_merge 1.080), the profiled one no-change; promoted by the launch "
              "gate's faster and undone when the confirming gate said no-change, 0.980 [0.973, 0.987]: a ~2% step "
              "on the 2% minimum effect; against step 21 (step 18 + step (r)'s switch) no-change, a prediction: "
              "step (r) alone no-change on both launches in round 23; against production, step 22, which adds step "
              "(t)'s merge, slower as step_21: a prediction)",
              "slower", defines=(("MKL_CAMPAIGN_STEP", 18),)),
    Candidate("step_p_topk_twice", "a diagnostic of step (p) (MKL_ROUTER_TOPK_REPS 2): the router block runs the "
              "same top-k code twice, the sub-spans' `topk` timing the second run (the first falls in `hn`): a "
              "top-k much faster run again was paying for cold code, not for its dependent chain (production's "
              "bits; round 22 (an H100): step (p)'s top-k run again 1.5 us against its first run's 2.1 (step_p), the "
              "first run's cost in hn (2.5 us against step_p's 0.2): at most ~0.6 us of warm-up; step 15's "
              "top-k not run twice; gate not run)",
              "slower", defines=(("MKL_CAMPAIGN_STEP", 18), ("MKL_ROUTER_TOPK_REPS", 2))),
    Candidate("step_q", "campaign step (q), a candidate: step 15 (its base, production then; step_15) with the attention chunk's and the "
              "merge's fixed costs cut (MKL_CHUNK_LEAN): q read from qbuf beside the first block's K words (no copy to "
              "shared memory, no barrier), the combine of a kv head's warps in the registers of its first warp (the "
              "others' values through shared memory, one barrier; production: every warp's values stored, a barrier, "
              "8-9 passes a thread of a division, loads and 4-B stores), the partial by 8-B stores, the chunk's "
              "arrival without the count read back (no second barrier), the merge's batches in two register sets "
              "(a batch reissued as soon as it is weighed, not after the next one lands), the last merger's publish "
              "by its leader with one fence (production: every thread's fence, a barrier, the leader's fence); no "
              "wait added or moved "
              "(MKL_CAMPAIGN_STEP 19; production's operations in production's order: production's bits; round 22 (an "
              "H100) judged it slower: attn_merge 1.102 [1.057, 1.154] (merge 7.3 us against 5.6), the launch "
              "no-change 1.012 [1.008, 1.018]; the combine 1.7 us against 2.3, the q copy 0.5 against 0.9, the "
              "arrival 3.6 against 3.1)", "slower",
              defines=(("MKL_CAMPAIGN_STEP", 19),)),
    Candidate("step_r", "campaign step (r), a candidate: step 15 (its base, production then; step_15) with the W13 arrival's gpu-scope fences as acq_rel "
              "fences (MKL_W13_ACQ_REL: fence.acq_rel.gpu, MEMBAR.ALL.GPU, in place of __threadfence's fence.sc.gpu, "
              "MEMBAR.SC.GPU): the leader's release before the arrival's atomic, and the expert's last arriver's "
              "acquire and fan-out release as one fence of its leader (step 15: every thread's acquire fence, "
              "then the leader's release fence, three MEMBAR.SC.GPU on the path to the release flags, one now); no "
              "wait added or moved, no arithmetic changed (MKL_CAMPAIGN_STEP 20; step 15's bits). Written for "
              "faster (the W13 emit, 8.0 us a tile, read as the SC fence's wait); round 23 (an H100) measured the "
              "W13 emit unmoved (8.0 us as step 15's), the plain launch no-change 0.993 [0.989, 1.004] and "
              "0.998, the profiled one 1.001 and 0.999, the default gate slower (attn_merge 1.075, router_topk "
              "1.034, tasks it does not change): rejected alone; in production since step 21, with step (p)'s switch; "
              "against production (step 22: step 20 + step (p)'s router + step (t)'s merge), slower as step_15: a "
              "prediction)", "slower",
              defines=(("MKL_CAMPAIGN_STEP", 20),)),
    Candidate("step_p_r", "steps (p) and (r) stacked (step 21's code, production's from step 21 until step 22: "
              "the same switches as step 21, step_21's PTX): step (r)'s build (MKL_CAMPAIGN_STEP 20, the W13 arrival's acq_rel "
              "fences) with step (p)'s switch on (-DMKL_ROUTER_WIDE=1: the router's last block on a short chain); "
              "each has step 15's bits, so the pair does. Round 23 (an H100): the plain launch faster, 0.974 "
              "[0.970, 0.986] and 0.973 [0.970, 0.989] in two gates, the profiled one no-change (0.986, 0.984), "
              "the default gate slower by attn_merge (sumCTA 1.075) (step (p) alone 0.980 and 0.981 on the plain launch, "
              "step (r) alone no-change, in the same round): the promotion rule's launch items met once, not "
              "confirmed (no device time left for a second gate; step (p)'s confirming gate said no-change); "
              "round 24's confirming gate (decided before it ran; an H100): the plain launch faster again, 0.980 "
              "[0.975, 0.985], the profiled one no-change 0.986: promoted as step 21; against production, step 22, "
              "slower as step_21)",
              "slower", defines=(("MKL_CAMPAIGN_STEP", 20), ("MKL_ROUTER_WIDE", 1))),
    Candidate("step_s", "campaign step (s), a candidate on production (step 21 when measured, step 22 since promote22; "
              "no step number: -DMKL_HN_FIRST=1): a "
              "W13 tile copies hn to shared memory before it issues its tile's L2 prefetch (production: the prefetch "
              "first). Round 24's sub-spans (an H100) put the hn copy at 3.0 us a tile with the prefetch first and "
              "0.6 us with no W13 prefetch (MKL_PREFETCH_W13_KB=0), whose GEMV then took 4.8 us longer; the order "
              "alone is changed: no wait added or moved, production's bits. Written for a shorter hn copy; expected "
              "no-change (a prediction: the ~2 us a layer it may save is ~1.3% of a launch, inside the gate's 2% "
              "minimum effect); round 25 (an H100): no-change, the plain launch 1.003 [1.000, 1.006], the profiled worker "
              "1.016 [1.012, 1.019]: the hn copy 2.9 -> 2.3 us a tile, the W13 GEMV 38.2 -> 41.7 us: rejected)",
              "no-change", defines=(("MKL_HN_FIRST", 1),)),
    Candidate("step_t", "campaign step (t), production's code since step 22 (promote22): step 21 (its base, production "
              "then; step_21) with -DMKL_MERGE_SPLIT=1 (no step number of its own; step 22 turns the switch on): the "
              "LSE merge one head a block (merge_head_split) instead of one head a warp (merge_heads): a head's 16 "
              "warps take its chunks warp, warp + 16, ... (2-3 of 33: one round trip of loads), each keeps its own "
              "(m, l, acc), and one warp combines the 16 by the same LSE rule from shared memory and writes the head; "
              "mkl_model.h's MERGE_HEADS_PER_WORKER 1, not 16, the one count that changes: 64 merge workers at the "
              "default shape (not 4), 16 at the small one, still QKV-tile holders. Round 25's sub-spans (an H100) "
              "put the merge at 5.7 us + 1.3 us of arrival a layer on the 4 merge workers (a warp's dependent chain "
              "through 33 partials), Nsight Compute the O-projection's wait for ATTN_RELEASE (the whole layer head) at a fifth of all "
              "stall samples. Other sums' order: other last bits, judged by closeness. Expected faster (a prediction, written before any run: "
              "the merge ~1.8 us a layer, the plain launch ~0.975 (0.96-0.985)); measured: faster twice, promoted "
              "(the seventeenth session, an H100, 2026-12-07, production (step 21) -> step_t: the plain launch 0.966 "
              "[0.960, 0.967] and 0.966 [0.964, 0.968], the profiled worker 0.974 [0.968, 0.980] and 0.978 [0.974, "
              "0.982], attn_merge's slowCTA 0.578 [0.546, 0.602] and 0.575 [0.558, 0.593], oproj 1.043 [1.029, 1.056] "
              "in the first; cos against the reference 0.99999988, step 21's 0.99998697); against production, step "
              "22, its own code: no-change",
              "no-change", defines=(("MKL_CAMPAIGN_STEP", 21), ("MKL_MERGE_SPLIT", 1))),
    Candidate("step_u", "campaign step (u), a candidate on production (written on step 21; step 22 since promote22, "
              "which has step (t)'s merge: step_t_u's code; no step number: -DMKL_OPROJ_STAGE=1): "
              "a worker's O-projection rows (22 of Wo at 132 workers, 176 KB) copied into its shared memory by bulk "
              "copies on an mbarrier, issued where production issues their L2 prefetch (before the merge), so they land "
              "during the ATTN_RELEASE wait (~28 us on most workers); after the wait the GEMV (gemv_block_staged: "
              "production's items, lanes, order and reductions, production's bits) reads them with ld.shared instead "
              "of three dependent L2 rounds. An L1 prefetch cannot do it: the acquire poll's CCTL.IVALL empties L1. No "
              "wait on another worker added or moved (who waits where: production's). Cost: the block asks for 215,424 "
              "B of shared memory, not 52,848 (the 228-KB configuration: L1 28 KB, not ~192; ring_smem's 188-KB "
              "reservation cost ~2%). Prediction, written before any run: the O-projection's gemv sub-span 7.0 -> ~1.0 "
              "us a layer (0.7-2.0), the layer head ~5 us a layer shorter; the plain launch ~0.985 (0.965-1.01, the "
              "carve-out's cost unknown at 28 KB of L1): faster or no-change on the 2% line. (Read the gemv sub-span "
              "knowing it includes the wait for the stage's copies, which may land late on the workers that issue "
              "last: the last chunk workers, the merge worker that publishes ATTN_RELEASE.) Measured (the seventeenth "
              "session, an H100, against step 21): slower, the plain launch 1.084 [1.074, 1.086], the profiled worker "
              "1.089 [1.083, 1.094], qkv 1.295, attn_chunk 1.170, oproj 0.949; the gemv sub-span 7.0 -> 5.8 us: rejected",
              "slower", defines=(("MKL_OPROJ_STAGE", 1),)),
    Candidate("step_u16", "step (u) with 16 rows staged (-DMKL_OPROJ_STAGE=1 -DMKL_OPROJ_STAGE_ROWS=16: 128 KB; the "
              "block asks for 166,272 B, the 164-KB configuration, L1 92 KB): the carve-out's other point; a worker's "
              "last 1-2 row groups (rows 16-21) from L2 as production (one L2 round a warp after the staged items). "
              "Prediction, written before any run: the O-projection's gemv sub-span 7.0 -> ~2.5 us a layer (1.5-3.5), "
              "the plain launch ~0.985 (0.97-1.005); against step_u it says whether the carve-out or the last rounds "
              "cost more. Measured (the seventeenth session, an H100, against step 21): slower, the plain launch 1.033 "
              "[1.031, 1.044], the profiled worker 1.032 [1.029, 1.039], qkv 1.132, moe_w13 0.960; the gemv sub-span "
              "6.6 us: rejected",
              "slower", defines=(("MKL_OPROJ_STAGE", 1), ("MKL_OPROJ_STAGE_ROWS", 16))),
    Candidate("step_t_u", "steps (t) and (u) stacked on step 21 (-DMKL_CAMPAIGN_STEP=21 -DMKL_MERGE_SPLIT=1 "
              "-DMKL_OPROJ_STAGE=1; step_u's code since step 22, production with step (t)): the merge "
              "one head a block (64 merge workers), then the O-projection from its shared-memory stage; independent "
              "switches (step (t)'s merge scratch, < 1,100 floats, lies below step (u)'s stage, which starts at 2 NQ * "
              "HD floats of the arena). Prediction, written before any run: the merge ~1.8 us and the O-projection's "
              "gemv ~1.0 us a layer, the plain launch ~0.965 (0.94-0.99), against step 21). Not gated: step (u) was "
              "slower alone (the seventeenth session); expected slower",
              "slower", defines=(("MKL_CAMPAIGN_STEP", 21), ("MKL_MERGE_SPLIT", 1), ("MKL_OPROJ_STAGE", 1))),
    Candidate("step_v", "campaign step (v), a candidate on production (written on step 21; step 22 since promote22, "
              "whose split merge's scratch, the arena's first 1,056 floats, reaches 32 floats into the stage at the "
              "small shape, written only after the chunk has read the stage; no step number: -DMKL_ATTN_STAGE=1): "
              "an attention chunk's K rows (its first 128 tokens, 128 KB) and its first 64 tokens' V rows (64 KB; "
              "the small shape: all 128 tokens' K and V, 128 KB) copied into the chunk worker's shared memory by two "
              "bulk copies on an mbarrier, issued at layer entry where production issues the chunk's K/V L2 prefetch, "
              "so they land during its QKV tile and the QKV_EPOCH wait; the block loop (attend_blocks_mma) reads a "
              "staged block's K (and V) words with ld.shared in production's fragment layout (production's bits), "
              "other blocks (chunks past 128 tokens) from L2 as production. The new token's row (written by this "
              "layer's QKV tiles) is not copied early: the chunk that holds it loads it beside the q copy after the "
              "wait and stores it into its stage slot. No wait on another worker added or moved (who waits where: "
              "production's). Cost: the block asks for 215,424 B of shared memory, not 52,848 (the 228-KB "
              "configuration: L1 28 KB, as step (u)); ptxas -v: the plain kernel body 410 / 1,476 B of spill stores / "
              "loads against production's 406 / 1,440 when written on step 21; on step 22 430 / 1,500 against 422 / "
              "1,460 (the tripwire body 366 / 1,192 against 386 / 1,224), attend_chunk unchanged (0 / 12). Prediction, written before any "
              "run (reasoning: the fifteenth session's sub-spans, an H100, put the block loop at 8.5 us a layer on "
              "warp 0, two blocks a warp, each two dependent L2 round trips (K, then V after the scores): ~2 us a "
              "round trip under the QKV stream's load; here a warp's first block has none and its second one (V); the "
              "shared-memory pipe then bounds the loop: a warp's block reads q (production's 4 LDS.128, 16-way bank "
              "conflicts: 64 wavefronts), K (8 LDS.128, conflict-free by the odd lanes' word order: 32) and a staged "
              "V (8: 32), 3,584 wavefronts a chunk, ~2.0 us at one a clock, against production's 2,048): the loop_w0 "
              "sub-span 8.5 -> ~3.5 us a layer (2.5-5.0), the layer head ~5 us a layer shorter (4 layers: ~20 us of a "
              "~600-us launch), the carve-out's cost unknown at 28 KB of L1 (the kernel body's spill reloads); the "
              "plain launch ~0.975 (0.95-1.00): faster or no-change on the 2% line."
              " Revised before any run of step (v), after step (u)'s gate (the seventeenth session: slower, launch 1.084, qkv 1.295, with the same 215,424-B carve-out and copies at layer entry): expected slower. Measured (the eighteenth "
              "session, an H100, against step 22): slower, the plain launch 1.075 [1.073, 1.077], the profiled worker "
              "1.079 [1.076, 1.083], qkv 1.204, moe_w2 1.111, router_topk 1.094, attn_chunk 1.022 [0.998, 1.038]: "
              "rejected",
              "slower", defines=(("MKL_ATTN_STAGE", 1),)),
    Candidate("step_v_k", "step (v) with K alone staged (-DMKL_ATTN_STAGE=1 -DMKL_ATTN_STAGE_V_BLOCKS=0: 128 KB; the "
              "block asks for 149,888 B, the 164-KB configuration, L1 92 KB): the carve-out's other point; every V "
              "word from L2 as production (one L2 round trip a block). Prediction, written before any run: the "
              "loop_w0 sub-span 8.5 -> ~5.0 us a layer (3.5-6.0), the plain launch ~0.98 (0.965-1.00); against "
              "step_v it says whether V's blocks or the carve-out cost more."
              " Revised before any run of step (v), after step (u)'s gate (the seventeenth session: slower, launch 1.084, qkv 1.295, with the same 215,424-B carve-out and copies at layer entry): expected no-change (149,888 B: step_u16's carve-out lost 3.3%, so nearer 1.0 than step_v, not faster). "
              "Measured (the eighteenth session, an H100, against step 22): slower, the plain launch 1.025 [1.024, "
              "1.026], the profiled worker 1.025 [1.021, 1.028], router_topk 1.085, moe_w2 1.035, qkv 1.029 [0.998, "
              "1.058]; attn_chunk 0.969 [0.948, 0.986] faster (moe_w13 0.989, inside the 2% line): the chunk is "
              "shorter, the launch longer; rejected",
              "slower", defines=(("MKL_ATTN_STAGE", 1), ("MKL_ATTN_STAGE_V_BLOCKS", 0))),
    Candidate("step_u_v", "steps (u) and (v) stacked on production (step 22 since promote22; -DMKL_OPROJ_STAGE=1 "
              "-DMKL_ATTN_STAGE=1): the "
              "chunk's K/V from its stage, then the O-projection's rows from theirs, the two stages in the same bytes "
              "of the arena one after the other (each issue starts with every thread's proxy fence and a block "
              "barrier: the other stage's ld.shared reads done before the copies overwrite it); the block asks for "
              "215,424 B, as each alone. Prediction, written before any run: the loop_w0 sub-span ~3.5 us and the "
              "O-projection's gemv ~1.0 us a layer, the plain launch ~0.96 (0.93-0.99)."
              " Revised before any run of step (v), after step (u)'s gate (the seventeenth session: slower, launch 1.084, qkv 1.295, with the same 215,424-B carve-out and copies at layer entry): expected slower."
              " Not gated: steps (u) and (v) were each slower alone (the seventeenth and eighteenth sessions)",
              "slower", defines=(("MKL_OPROJ_STAGE", 1), ("MKL_ATTN_STAGE", 1))),
    # Round 4's chunks64 was sloughing because the one-block merge paid for twice the partials;
    # with the merge spread (step d) the shorter chunks may pay. Gated against step_d.
    Candidate("step_d_chunks64", "step (d) with 64-token attention chunks (65 chunks, each on its own worker; the "
              "spread merge weighs twice the partials; sloughing against step_d in round 7)", "sloughing",
              params=(("chunk_tokens", 64),), defines=(("MKL_CAMPAIGN_STEP", 5),)),
    # Round 5's question (step_c slower in every task, also in those whose code it did not change):
    # step (c)'s base (step_b0, the production of round 5) with step (c)'s shared memory reserved and
    # unused (so the SM keeps step (c)'s small L1). Gated against step_b0: what the carve-out costs;
    # step_c against it: what the ring itself does.
    Candidate("ring_smem", "step_b0's code with step (c)'s 135,296-B ring reserved in shared memory and never "
              "used (MKL_RESERVE_RING_SMEM 1, MKL_CAMPAIGN_STEP 2): the L1 shrinks as step (c)'s does, step_b0's "
              "bits", "slower", defines=(("MKL_RESERVE_RING_SMEM", 1), ("MKL_CAMPAIGN_STEP", 2))),
    Candidate("chunks32", "32-token attention chunks (129 chunks, nearly one per worker): shorter chunks, a "
              "merge of 4x the partials", "sloughing", params=(("chunk_tokens", 32),)),
    Candidate("stale_descriptor", "the stale_descriptor switch: layers >= 1 read layer 0's W2 and KV cache",
              "incorrect", params=(("hazard", "stale_descriptor"),)),
)}


def candidate(name: str) -> Candidate:
    if name not in CANDIDATES:
        raise UserError(f"unknown layered-megakernel candidate {name!r} (known: {', '.join(CANDIDATES)})")
    return CANDIDATES[name]


def task_names(text: str) -> dict[int, str]:
    """The binary's "2=qkv,3=attn_chunk,..." (MKL_TASK_NAMES) as {id: name}."""
    out = {}
    for item in text.split(","):
        tid, _, name = item.partition("=")
        out[int(tid)] = name
    return out


def subspan_names(text: str) -> dict[int, list[str]]:
    """A sub-span build's "2=wait,norm,gemv,emit;3=..." (MKL_SUBSPAN_NAMES) as {task id: names in
    point order} (a sub-span record's point k is the k-th name)."""
    out = {}
    for item in text.split(";"):
        tid, _, names = item.partition("=")
        out[int(tid)] = names.split(",")
    return out


def read_rings(path: Path, launches: int, names: dict[int, str]) -> list[profiler.Profile]:
    """The rings the binary wrote: per launch claimed, capacity, capacity x 4 record words."""
    raw = path.read_bytes()
    words = memoryview(raw).cast("Q")
    profiles, at = [], 0
    for i in range(launches):
        if at + HEADER_WORDS > len(words):
            raise ValueError(f"ring file {path} ends before launch {i}")
        claimed, capacity = int(words[at]), int(words[at + 1])
        end = at + HEADER_WORDS + capacity * profiler.RECORD_WORDS
        if end > len(words):
            raise ValueError(f"ring file {path} ends inside launch {i}'s ring")
        profiles.append(profiler.decode(words[at + HEADER_WORDS:end], claimed, capacity=capacity, names=names))
        at = end
    if at != len(words):
        raise ValueError(f"ring file {path} holds more than {launches} launches")
    return profiles


class RingTooSmall(ValueError):
    """The profiler ring overflowed: the metrics would be of a truncated launch."""


class ProtocolMismatch(ValueError):
    """A binary built from another revision answers in a format this checkout does not read.
    `exited`: it exited before its first reply, so it does not take the request at all (a
    plain build from before plain launches refuses --profile-serve and exits 2)."""

    def __init__(self, message: str, *, exited: bool = False) -> None:
        super().__init__(message)
        self.exited = exited


class Faithful:
    """One warm `--profile-serve` process per build: candidates differ by defines or params,
    a side at a git revision (`revision`) by its sources, and the plain build (no HZ_PROFILER,
    the `launch` row's) from the profiled one."""

    def __init__(self) -> None:
        self.procs: dict[BuildKey, subprocess.Popen] = {}
        self.builds: dict[BuildKey, Path] = {}
        self.answered: set[int] = set()  # pids of binaries that replied once
        self.no_plain: dict[BuildKey, str] = {}  # a revision's plain build from before plain launches: why
        self.tmp = tempfile.TemporaryDirectory(prefix="hz-mkl-faithful-")

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.stdin.close()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    kill_and_reap(proc)  # reaped now, not left a zombie until this object is collected
        self.procs.clear()
        self.tmp.cleanup()

    def binary(self, defines: tuple[tuple[str, int], ...], revision: RevisionSources | None = None,
               profiled: bool = True) -> Path:
        """The profiled build (HZ_PROFILER) or, `profiled=False`, the plain build: the family's
        default build with the candidate's defines, the one bench/megakernel_layers_perf.py times."""
        key = (defines, revision, profiled)
        if key not in self.builds:
            from hazards.family import build_harness  # the table's binary: no arrow up into the catalog

            self.builds[key] = build_harness("megakernel_layers",
                                             defines={**({"HZ_PROFILER": 1} if profiled else {}), **dict(defines)},
                                             standalone=revision.standalone if revision else None)
        return self.builds[key]

    def _server(self, defines: tuple[tuple[str, int], ...],
                revision: RevisionSources | None = None, profiled: bool = True) -> subprocess.Popen:
        key = (defines, revision, profiled)
        proc = self.procs.get(key)
        if proc is None or proc.poll() is not None:
            proc = subprocess.Popen([str(self.binary(defines, revision, profiled)), "--profile-serve"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
            self.procs[key] = proc
        return proc

    def _ask(self, proc: subprocess.Popen, request: dict[str, Any], other: str, revision: RevisionSources | None,
             what: str) -> dict[str, Any]:
        """One request to a warm binary and its ok reply (`what` names the binary in errors).
        A revision's binary that exits before its first reply (but with the harness's device-fault
        exit 3: DeviceError), or a reply that is not a JSON object: ProtocolMismatch (`exited`
        says which)."""
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:  # it exited already (an old revision's usage line): its exit code says why, below
            pass
        while True:
            line = proc.stdout.readline()
            if not line:
                code = proc.wait()
                # exit 3 is the harness's device fault (its device did not start), any binary's;
                # another exit before a first reply, another protocol; a signal, either that (an
                # old table parser's uncaught exception aborts) or a crash or a kill: not judged
                if revision and proc.pid not in self.answered and code != 3:
                    how, maybe = ((f"exited (code {code})", "") if code >= 0 else
                                  (f"was ended by {signal_name(-code)}", "it crashed, was killed, or "))
                    raise ProtocolMismatch(f"{other} {how} before its first {PROFILE_TAG.strip()} reply: {maybe}it "
                                           "does not speak this checkout's --profile-serve protocol "
                                           "(the faithful server is today's Python)", exited=True)
                raise DeviceError(f"{other or what} exited (code {code}) before replying")
            if line.startswith(PROFILE_TAG):
                break
        try:
            reply = json.loads(line[len(PROFILE_TAG):])
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            raise ProtocolMismatch(f"{other or what} replied {line.strip()[:120]!r}: not a JSON object")
        self.answered.add(proc.pid)
        if reply.get("status") == "fault":
            raise DeviceError(reply.get("message", "device fault"))
        if reply.get("status") != "ok":
            raise ValueError(reply.get("message", f"bad reply {reply}"))
        return reply

    def profile(self, cand: Candidate, workers: int | None, launches: int, *, ring: Path | None = None,
                params: dict[str, Any] | None = None,
                revision: RevisionSources | None = None) -> tuple[dict[str, Any], list]:
        """One request to the candidate's warm binary (built from `revision`'s sources when
        given): its reply and the decoded rings (kept in `ring` when given). `params` adds
        request fields to the candidate's. A revision's binary that exits before its first
        reply (but with the harness's device-fault exit 3: DeviceError), or replies
        without what `measure` reads: ProtocolMismatch."""
        ring = ring or Path(self.tmp.name) / "ring.bin"
        params = {**dict(cand.params), **(params or {}), "grid": workers or 0}
        proc = self._server(cand.defines, revision)
        other = f"the binary built from revision {revision.commit[:12]}" if revision else ""
        reply = self._ask(proc, {"params": params, "launches": launches, "ring": str(ring)}, other, revision,
                          "the profiled binary")
        missing = [k for k in REPLY_KEYS if k not in reply]
        if missing:
            raise ProtocolMismatch(f"{other or 'the profiled binary'}'s reply lacks {', '.join(missing)}: it does "
                                   "not speak this checkout's --profile-serve protocol")
        reply["build"] = self.binary(cand.defines, revision).parent.name
        return reply, read_rings(ring, launches, task_names(reply["task_names"]))

    def plain(self, cand: Candidate, workers: int | None, plain_launches: int, *,
              revision: RevisionSources | None = None) -> dict[str, Any]:
        """One request to the candidate's plain build (no HZ_PROFILER; from `revision`'s sources
        when given): one checked launch, then `plain_launches` timed launches of the compiled-out
        instance. The reply, its `plain_us` checked: one finite positive time per launch. A reply
        without the fields: ProtocolMismatch; bad times: ValueError; a revision's plain build
        that exits before replying: ProtocolMismatch with `exited`."""
        params = {**dict(cand.params), "grid": workers or 0}
        proc = self._server(cand.defines, revision, False)
        other = f"the plain build from revision {revision.commit[:12]}" if revision else ""
        reply = self._ask(proc, {"params": params, "launches": 0, "plain_launches": plain_launches}, other, revision,
                          "the plain binary")
        missing = [k for k in PLAIN_REPLY_KEYS if k not in reply]
        if missing:
            raise ProtocolMismatch(f"{other or 'the plain binary'}'s reply lacks {', '.join(missing)}: it does not "
                                   "time plain launches as this checkout's --profile-serve protocol asks")
        times = reply["plain_us"]
        if not isinstance(times, list) or len(times) != plain_launches or not all(
                isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0 for t in times):
            raise ValueError(f"{other or 'the plain binary'} replied plain_us {str(times)[:120]}: not "
                             f"{plain_launches} finite positive times (us per launch)")
        reply["build"] = self.binary(cand.defines, revision, False).parent.name
        return reply

    def measure(self, cand: Candidate, workers: int | None, launches: int, cos_min: float,
                revision: RevisionSources | None = None, plain_launches: int = 0) -> dict[str, Any]:
        """Check one launch, profile `launches` (of the binary built from `revision`'s
        sources when given); the per-task rows and the verdict. `plain_launches` > 0: then the
        plain build checks one launch and times that many, and its median is the `launch` row
        (`launch_row`); a revision from before plain launches (its harness never reads the
        field: `plain_unknown`, from its sources, nothing built) leaves the row out, its reason
        in `skipped_rows`; any other revision's plain build that exits before replying stops
        (DeviceError for exit 3, else ProtocolMismatch), as its profiled build does."""
        reply, profiles = self.profile(cand, workers, launches, revision=revision)
        dropped = sum(p.dropped for p in profiles)
        if dropped:
            raise RingTooSmall(f"profiler ring overflow: {dropped} records dropped over {launches} launches "
                               f"(capacity {reply['capacity']})")
        rows = profiler.summarize(profiles)
        shape = {k: reply[k] for k in SHAPE_KEYS}
        common = {"cos": reply["cos"], "rel_err": reply["rel_err"], "workers": reply["grid"], "launches": launches,
                  "dropped": 0, "shape": shape, "build": reply["build"], "candidate": cand.name,
                  "kernel_us": profiler.median(reply["kernel_us"]), **({"revision": revision.commit} if revision else {})}
        out_rows = [{**r, **common} for r in rows]
        skipped: dict[str, str] = {}
        mismatched = not reply["cos"] >= cos_min
        if plain_launches:
            key = (cand.defines, revision, False)
            if revision is not None and key not in self.no_plain:
                why = plain_unknown(revision)
                if why:
                    self.no_plain[key] = why
            if key in self.no_plain:
                skipped[LAUNCH_TASK] = f"not measured: {self.no_plain[key]}"
            else:  # a build that knows plain launches: its exit or a bad reply stops the gate, as the profiled one's
                plain = self.plain(cand, workers, plain_launches, revision=revision)
                out_rows.append(launch_row(plain, common, plain_launches, shape))
                mismatched = mismatched or not plain["cos"] >= cos_min
        return {"rows": out_rows, "cos": reply["cos"], "rel_err": reply["rel_err"],
                "mismatched": int(mismatched), "kernel_us": common["kernel_us"],
                "profiles": profiles, "reply": reply, "skipped_rows": skipped}


def plain_unknown(revision: RevisionSources) -> str | None:
    """Why `revision`'s plain build cannot time plain launches (its harness's request parsing
    never reads `plain_launches`: a revision from before them, whose plain build refuses
    --profile-serve), decided from its sources before anything is built or started; None when
    it can (then any early exit of its plain build is a fault, not a skipped row)."""
    harness = revision.standalone / "megakernel_layers" / "megakernel_layers.cu"
    try:
        text = harness.read_text(errors="replace")
    except OSError:
        return None  # no harness to read: its build says why
    if PLAIN_REQUEST_FIELD in text:
        return None
    return (f"revision {revision.commit[:12]}'s megakernel_layers.cu does not read {PLAIN_REQUEST_FIELD} (a "
            "revision from before plain launches: its plain build refuses --profile-serve)")


def launch_row(plain: dict[str, Any], common: dict[str, Any], plain_launches: int,
               shape: dict[str, Any]) -> dict[str, Any]:
    """The plain build's launch as a FAITHFUL_RESULT row: slowCTA, wall and sumCTA are all the
    median CUDA-event time per launch (one measurement, `single_metric`: the gate counts it as
    one interval, and it can be faster, slower or no-change but never sloughing). ValueError when
    the plain build ran another grid or shape than the profiled one."""
    plain_shape = {k: plain[k] for k in SHAPE_KEYS}
    if plain_shape != shape or plain["grid"] != common["workers"]:
        raise ValueError(f"the plain build ran grid {plain['grid']} {plain_shape}, the profiled one grid "
                         f"{common['workers']} {shape}: not the same launch")
    t = profiler.median(plain["plain_us"])
    return {"task_id": LAUNCH_TASK_ID, "task": LAUNCH_TASK, "slowCTA_us": t, "wall_us": t, "sumCTA_us": t,
            "single_metric": True, "timing": "plain build (no HZ_PROFILER, tripwire compiled out): median "
            "CUDA-event time per launch", **common, "launches": plain_launches, "instances": 1,
            "blocks": plain["grid"], "cos": plain["cos"], "rel_err": plain["rel_err"], "build": plain["build"],
            "kernel_us": t}


class DeviceError(RuntimeError):
    """The profiled binary hit a device fault (a sticky error: its process is done)."""


def once(args: argparse.Namespace) -> int:
    faithful = Faithful()
    try:
        workers = workers_from_env(args.workers)
        if workers is not None and workers < 1:
            raise ValueError(f"the worker count must be >= 1, got {workers}")
        res = faithful.measure(candidate(args.candidate), workers, args.launches, args.cos_min,
                               plain_launches=args.plain_launches)
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line and an exit code
        print(f"faithful check: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 3 if isinstance(exc, DeviceError) else 2
    finally:
        faithful.close()
    for row in res["rows"]:
        print("FAITHFUL_RESULT " + json.dumps(row), flush=True)
    return 1 if res["mismatched"] else 0


def handle(faithful: Faithful, req: dict[str, Any]) -> dict[str, Any]:
    """One protocol request: check one launch, profile `launches`; a bad_request reply saying
    why not; a device fault ends the server."""
    from hazards.engine.protocol_server import StopServing

    params = dict(req.get("params") or {})
    # the gate's NAME@REV: the full commit id and the tree the gate extracted from it
    commit, sources = params.pop("revision", None), params.pop("sources", None)
    plain_launches = params.pop("plain_launches", 0)  # the gate's `launch` row
    try:
        if (isinstance(plain_launches, bool) or not isinstance(plain_launches, int)
                or not 0 <= plain_launches <= MAX_PLAIN_LAUNCHES):
            raise UserError(f"plain_launches must be an integer in [0, {MAX_PLAIN_LAUNCHES}], got {plain_launches!r}")
        revision = None
        if commit is not None or sources is not None:
            if not isinstance(commit, str) or not commit or not isinstance(sources, str) or not sources:
                raise UserError(f"revision (a commit id) and sources (its extracted tree) come together, "
                                f"got {commit!r} and {sources!r}")
            revision = RevisionSources(commit, Path(sources))
        cand, workers, launches, cos_min, seed = parse_request({**req, "params": params}, candidate)
    except UserError as exc:
        return {"status": "bad_request", "message": str(exc)}
    try:
        res = faithful.measure(cand, workers, launches, cos_min, revision=revision, plain_launches=plain_launches)
    except DeviceError as exc:
        raise StopServing(3, {"status": "fault", "message": str(exc)}) from None
    except Exception as exc:  # noqa: BLE001
        return {"status": "bad_request", "message": f"{type(exc).__name__}: {exc}"}
    return {"status": "ok", "launches": 1, "mismatched": res["mismatched"], "max_rel_err": res["rel_err"],
            "kernel_ms": res["kernel_us"] / 1000.0, "seed": seed,
            "metrics": {"faithful": res["rows"], "cos": res["cos"], "profiled_launches": launches,
                        "plain_launches": plain_launches, **({"skipped_rows": res["skipped_rows"]}
                                                             if res.get("skipped_rows") else {})}}


def serve(args: argparse.Namespace) -> int:
    from hazards.engine.protocol_server import serve as serve_lines

    faithful = Faithful()
    try:
        return serve_lines(lambda req: handle(faithful, req),
                           {"server": "megakernel_layers-faithful", "pid": os.getpid(),
                            "variants": list(CANDIDATES)})
    finally:
        faithful.close()


def main(argv: list[str] | None = None) -> int:
    ap = faithful_parser("python3 -m hazards.megakernel_layers.faithful", __doc__, list(CANDIDATES),
                         "profiled launches (medians over them)")
    ap.add_argument("--plain-launches", type=int, default=0,
                    help="also time this many launches of the plain build (the `launch` row); 0: not")
    args = ap.parse_args(argv)
    if args.launches < 1 or not -1.0 <= args.cos_min <= 1.0 or not 0 <= args.plain_launches <= MAX_PLAIN_LAUNCHES:
        print(f"faithful check: --launches must be >= 1, --cos-min in [-1, 1], --plain-launches in "
              f"[0, {MAX_PLAIN_LAUNCHES}]", file=sys.stderr)
        return 2
    return serve(args) if args.serve else once(args)


if __name__ == "__main__":
    sys.exit(main())
