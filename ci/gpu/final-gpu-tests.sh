#!/usr/bin/env bash
# The GPU tests alone (the stress verdicts are ci/gpu/final-suite.sh's), the kernels changed
# most recently first and the minute-long check test last (a budget cut loses the least); every binary built in parallel
# first. pytest is stopped with SIGINT at the budget so it still prints its summary.
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
R=/tmp/final-gpu-tests; rm -rf $R; mkdir -p $R
# BUDGET default 360 s: 108 tests took 29 s of builds and 264 s of pytest on an H100 (3f19e01), and
# BUDGET=300 cut the last test (the check test, ~62 s) short.
T0=$(date +%s); left() { echo $(( ${BUDGET:-360} - ($(date +%s) - T0) )); }
trap 'tar -czf "$OUT/final-gpu-tests.tar.gz" -C $R .; echo "== done in $(( $(date +%s) - T0 )) s"' EXIT
{ cat .gpu/COMMIT 2>/dev/null || echo "commit unknown"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $R/context.txt
timeout 120 python3 - > $R/build.txt 2>&1 <<'PY'
import concurrent.futures as cf, time
from hazards.families import all_families
from hazards.stress_family import family_binary
fams = [f for f in all_families() if f.binary]
t = time.monotonic()
with cf.ThreadPoolExecutor(8) as pool:
    # the layered megakernel's profiled build too: the perf gate's catalog sides run it
    # (tests/gates/test_perf_revision_gpu.py's two sides share it: one cache key); the plain build of the
    # `launch` row (test_perf_launch_gpu.py) is the family's default build, built below with every family's
    mkl = next(f for f in fams if f.name == "megakernel_layers")
    prof = pool.submit(family_binary, mkl, defines={"HZ_PROFILER": 1})
    # the campaign steps' builds tests/megakernel_layers/test_gpu.py compares bits of (its defines,
    # no profiler: else each is built one after another inside pytest, 10-16 s each)
    # (production is step 22, the default build; step 21, the previous production, and steps 15, 14, 10 and
    # (d), the ones before it, are steps 21, 15, 14, 10 and 5; steps (p) + (r) by name, below, are step 21's
    # code, which test_gpu.py's step_r tests still name beside step (r); step (t) on step 21, below, is
    # production's code, which test_gpu.py's production tests and test_merge_split.py compare)
    steps = [{"MKL_CAMPAIGN_STEP": 2}, {"MKL_CAMPAIGN_STEP": 5}, {"MKL_CAMPAIGN_STEP": 6}, {"MKL_CAMPAIGN_STEP": 7},
             {"MKL_CAMPAIGN_STEP": 8}, {"MKL_CAMPAIGN_STEP": 8, "MKL_ATTN_AHEAD": 0},
             {"MKL_CAMPAIGN_STEP": 9}, {"MKL_CAMPAIGN_STEP": 10}, {"MKL_CAMPAIGN_STEP": 11},
             {"MKL_CAMPAIGN_STEP": 12}, {"MKL_CAMPAIGN_STEP": 13}, {"MKL_CAMPAIGN_STEP": 13, "MKL_L2_SET_ASIDE_MB": 30},
             {"MKL_CAMPAIGN_STEP": 14}, {"MKL_CAMPAIGN_STEP": 15}, {"MKL_CAMPAIGN_STEP": 21},
             # this session's candidates: step (o) (test_w13_emit_lean.py), step (p) (test_gpu.py's step_p
             # tests), step (q) (test_gpu.py's step_q tests), step (r) and steps (p) + (r) (test_gpu.py's step_r tests)
             {"MKL_CAMPAIGN_STEP": 17}, {"MKL_CAMPAIGN_STEP": 18}, {"MKL_CAMPAIGN_STEP": 19},
             {"MKL_CAMPAIGN_STEP": 20}, {"MKL_CAMPAIGN_STEP": 20, "MKL_ROUTER_WIDE": 1},
             # step (s) on production (test_hn_first.py), step (t) on step 21, production's code (test_gpu.py,
             # test_merge_split.py)
             {"MKL_HN_FIRST": 1}, {"MKL_CAMPAIGN_STEP": 21, "MKL_MERGE_SPLIT": 1},
             # step (u) on production, its 16-row point and steps (t) + (u) on step 21 (test_oproj_stage.py)
             {"MKL_OPROJ_STAGE": 1}, {"MKL_OPROJ_STAGE": 1, "MKL_OPROJ_STAGE_ROWS": 16},
             {"MKL_CAMPAIGN_STEP": 21, "MKL_MERGE_SPLIT": 1, "MKL_OPROJ_STAGE": 1},
             # step (v) on production, its K-only point and steps (u) + (v) (test_attn_stage.py)
             {"MKL_ATTN_STAGE": 1}, {"MKL_ATTN_STAGE": 1, "MKL_ATTN_STAGE_V_BLOCKS": 0},
             {"MKL_OPROJ_STAGE": 1, "MKL_ATTN_STAGE": 1},
             # the negative controls of steps (u) and (v) (not candidates: their stages never filled; the two
             # files' CONTROL_U, CONTROL_V)
             {"MKL_OPROJ_STAGE": 1, "MKL_STAGE_CONTROL_NO_COPY": 1}, {"MKL_ATTN_STAGE": 1, "MKL_STAGE_CONTROL_NO_COPY": 1}]
    cands = {str(d): pool.submit(family_binary, mkl, defines=d) for d in steps}
    for f, r in zip(fams, pool.map(family_binary, fams)):
        print(f.name, r)
    print("megakernel_layers (HZ_PROFILER)", prof.result())
    for n, r in cands.items():
        print(f"megakernel_layers {n}", r.result())
print(f"built {len(fams)} binaries in {time.monotonic() - t:.1f} s")
PY
tail -1 $R/build.txt
timeout -s INT -k 10 $(( $(left) - 5 )) python3 -m pytest -m gpu -v -rs -p no:cacheprovider -p no:randomly --durations=25 \
  tests/megakernel_layers/test_gpu.py tests/families/test_mma_pingpong_gpu.py tests/tripwire/test_deadlock_gpu.py \
  tests/megakernel_layers/test_w13_emit_lean.py tests/megakernel_layers/test_hn_first.py tests/megakernel_layers/test_merge_split.py \
  tests/megakernel_layers/test_oproj_stage.py tests/megakernel_layers/test_attn_stage.py \
  tests/families/test_families_gpu.py tests/families/test_barrier_layout_runtime.py \
  tests/ragged_decode/test_gpu_kernel.py tests/ragged_decode/test_check_target.py tests/ragged_decode/test_profiler_gpu.py \
  tests/plugin/test_family_property_gpu.py tests/gates/test_layers_logit_gate.py tests/gates/test_perf_revision_gpu.py \
  tests/gates/test_perf_launch_gpu.py \
  tests/megakernel_layers/test_gpu_tripwire_fastpath.py \
  tests/campaign/test_check_gpu.py > $R/gpu-tests.txt 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|error" $R/gpu-tests.txt | tail -3
