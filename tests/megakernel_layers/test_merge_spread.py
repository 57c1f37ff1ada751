"""Campaign step (d) (MKL_CAMPAIGN_STEP 5, production from round 8 until step 10; steps 10, 14, 15 and 21 keep it, step 22 splits its heads): the
LSE merge spread over the QKV-tile workers.

Round 4's profile had the merge at 35 us a layer on the one block that arrived last. Step (d)
gives every head a warp of the merge workers (mkl::merge_workers: 4 QKV-tile holders at 64
heads), and the last merge arrival releases ATTN_RELEASE. On the CPU (nvcc 13.0, sm_90a, nvdisasm):
the step (d) build of the family's own source compiles, its merge issues a batch's loads
before any arithmetic and spills nothing, step 21's build (production from promote21 until step 22) calls it
and the default build (production, step 22) calls step (t)'s merge_head_split instead (step_b0's, round 8's
previous production, neither), and the compiled static checks pass it with one acquire poll more than
step_b0 (the merge workers' wait for the chunk count). Without a GPU: the schedule keeps the
merge workers among the QKV holders (snapshot_epoch's vulnerable set is step_b0's) and the hang
explainer reads step (d)'s waits (merge workers at CHUNK_MERGE, the rest at ATTN_RELEASE).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from hazards.families import megakernel_layers as F
from hazards.megakernel_layers import model as M
from hazards.megakernel_layers.explain import BAR_ATTN_RELEASE, BAR_CHUNK_MERGE

from .sass_text import MERGE_BATCH, function_listings, longest_load_run
from .tripwire_fakes import NO_FEEDER, PHASE_ATTN_MERGE, PHASE_OPROJ, slot, snapshot

ROOT = Path(__file__).resolve().parents[2]
LAYERED = ROOT / "standalone" / "megakernel_layers" / "megakernel_layers.cu"
INCLUDE = ROOT / "standalone" / "include"


# The folders the family's source includes from (standalone/<name>), copied by staged_sources.
STAGED_FOLDERS = ("megakernel_layers", "include", "common", "tripwire_host")


def copy_sources(dest: Path) -> None:
    """The family's source folders (STAGED_FOLDERS) copied under `dest` (a new folder), as they lie under
    standalone/."""
    for name in STAGED_FOLDERS:
        shutil.copytree(ROOT / "standalone" / name, dest / name)


def staged_sources() -> Path:
    """The family's sources (STAGED_FOLDERS) copied once to /tmp/hz-mkl-src-<hash of their content>/standalone,
    returned. nvcc hashes the source's path into internal names, and NVVM's cloning follows the path (whether
    gemv_round<4> is cloned; ptxas fed the same PTX renamed allocates the same): the machine code of the same
    sources differed between checkouts (a step-15
    body's spill loads 1724 B in one folder, 1512 in another), so a test comparing two builds' spills or
    listings passed or failed by the checkout's folder. Compiled from a folder named by the content alone,
    every checkout of the same sources gets the same machine code. (Not tempfile's folder: $TMPDIR varies.)"""
    standalone = ROOT / "standalone"
    files = sorted(f for name in STAGED_FOLDERS for f in (standalone / name).rglob("*") if f.is_file())
    digest = hashlib.sha256()
    for f in files:
        digest.update(str(f.relative_to(standalone)).encode() + b"\0" + f.read_bytes() + b"\0")
    root = Path("/tmp") / f"hz-mkl-src-{digest.hexdigest()[:16]}"
    if not root.exists():
        tmp = Path(tempfile.mkdtemp(prefix=f"{root.name}.", dir=root.parent))
        copy_sources(tmp / "standalone")
        try:
            os.rename(tmp, root)  # atomic: a pytest-xdist worker that lost the race uses the winner's copy
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return root / "standalone"


# Suffixes of the C/C++ files canonical_sources writes without their comments and blank lines.
C_SUFFIXES = (".c", ".cu", ".cuh", ".h", ".hpp")


def without_comments(text: str) -> str:
    """`text` (C/C++) without its comments, trailing blanks and blank lines: a comment becomes one space (a
    block comment's newlines with it, as the preprocessor reads it), string and character literals are kept as
    written, and a blank line that a backslash continues onto is kept. Two texts that differ in comments and
    layout only give the same result."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 2 if text.startswith("\\\n", i) else 1  # a backslash-newline continues a // comment
            out.append(" ")
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            assert end >= 0, "unterminated block comment"
            i = end + 2
            out.append(" ")
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                assert text[j] != "\n", "unterminated literal"
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    lines, kept = "".join(out).split("\n"), []
    for line in lines:
        line = line.rstrip()
        if line or (kept and kept[-1].endswith("\\")):
            kept.append(line)
    return "\n".join(kept) + "\n"


# Where canonical_sources writes the family's sources: one fixed folder for every checkout and content.
CANONICAL_ROOT = Path("/tmp/hz-mkl-canon")


@contextlib.contextmanager
def canonical_sources():
    """The family's sources (STAGED_FOLDERS) with their C/C++ files written without comments and blank lines
    (without_comments) to CANONICAL_ROOT/standalone, yielded while this process holds that folder's lock (a
    build from it must finish before another checkout or pytest-xdist worker rewrites it): for a test that
    compares two builds' ptxas spills. Those spills follow the folder's path, not only the code: nvcc 13.0's
    NVVM clones gemv_round<4> (a `$1` copy) for one path and not for another (ptxas reads the PTX the same
    whatever its names and .file paths), and step 15's plain body then spills 454 / 1724 B (stores / loads)
    or 462 / 1516 from the same sources (step 20's 454 / 1728 where step 15's was 454 / 1724, a failing
    comparison; 462 / 1512 where it was 462 / 1516, a passing one). The staged_sources folder is
    named by the content, so a comment-only edit moved it and re-rolled that. Here a comment-only edit gives
    the same files in the same folder, so the same builds; every content is compiled from the same path."""
    import fcntl

    standalone = ROOT / "standalone"
    files = sorted(f for name in STAGED_FOLDERS for f in (standalone / name).rglob("*") if f.is_file())
    texts = {f.relative_to(standalone): (without_comments(f.read_text()).encode() if f.suffix in C_SUFFIXES
                                         else f.read_bytes()) for f in files}
    CANONICAL_ROOT.mkdir(exist_ok=True)
    with open(CANONICAL_ROOT / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        dest = CANONICAL_ROOT / "standalone"
        have = {f.relative_to(dest): f.read_bytes() for f in dest.rglob("*") if f.is_file()}
        if have != texts:
            shutil.rmtree(dest, ignore_errors=True)
            for rel, data in texts.items():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                (dest / rel).write_bytes(data)
        yield dest


def family_cubin(defines: dict[str, int] | None, label: str, *extra_args: str, canonical: bool = False):
    """The family's source compiled for sm_90a with the harness build's flags (stress.build.target_flags:
    the machine code of the binary the GPU runs, -split-compile=0 and -lineinfo among them), `defines`
    (None: the default, production's build) and `extra_args` (e.g. "-Xptxas=-v" for the spill lines in
    its `.log`), from staged_sources' folder (the same machine code in every checkout), or with `canonical`
    from canonical_sources' folder (the same machine code for every comment and layout of the same code and
    every checkout: for spill comparisons; its line numbers are not the checkout's); build cache. The test
    skips without nvcc."""
    from hazards.engine.errors import ToolchainMissing
    from hazards.static.compile import compile_cubin

    try:
        with canonical_sources() if canonical else contextlib.nullcontext(staged_sources()) as src:
            return compile_cubin(src / LAYERED.relative_to(ROOT / "standalone"), defines=defines, label=label,
                                 extra_args=(f"-I{src / INCLUDE.relative_to(ROOT / 'standalone')}", *extra_args),
                                 harness_flags=True)
    except ToolchainMissing as e:
        pytest.skip(f"cannot build the family's machine code: {e}")


def listing_of(cubin) -> str:
    """nvdisasm's SASS listing of a `family_cubin`; the test skips without nvdisasm."""
    from hazards.engine.errors import ToolchainMissing
    from hazards.static.compile import disassemble

    try:
        return disassemble(cubin.path).text
    except ToolchainMissing as e:
        pytest.skip(f"cannot read the build's machine code: {e}")


def _sass(step: int | None) -> str:
    """The SASS listing of the family's source built as MKL_CAMPAIGN_STEP=step (None: the
    default, production's build; build cache)."""
    return listing_of(family_cubin(None if step is None else {"MKL_CAMPAIGN_STEP": step},
                                   f"test-mkl-step-{'default' if step is None else step}"))


def test_the_sass_tests_read_a_build_with_the_harness_build_flags():
    """family_cubin compiles with the flags of the binary the GPU runs (stress.build.target_flags, the one
    list both builds take): -split-compile=0 changes the machine code (generic loads in out-of-line
    functions), so a SASS test of another build would judge code the GPU never runs."""
    from hazards.engine import toolchain
    from hazards.engine.build import target_flags

    command = family_cubin(None, "test-mkl-step-default").command
    flags = target_flags(toolchain.SM90A)
    assert "-split-compile=0" in flags and "-lineinfo" in flags
    assert [f for f in command if f in flags] == list(flags), command


@pytest.fixture(scope="module")
def step_d() -> str:
    return _sass(5)


def test_step_d_merge_issues_the_next_batch_of_chunks_before_weighing_this_one_and_spills_nothing(step_d):
    merge = function_listings(step_d, ("merge_heads",)).get("merge_heads", "")
    assert merge, "the step (d) build has no out-of-line merge_heads"
    # a lane's 16 partials and one chunk's (m, l) of this batch AND of the next go out before any
    # FFMA: two dependent L2 round trips a head at 33 chunks, not three (round 6: 17). In the harness
    # build (-split-compile=0) the out-of-line merge's loads are generic (LD.E.64, 66 in a row), global
    # (LDG.E) in a build without that flag
    run = longest_load_run(merge, r"\bLDG?\.E")
    assert run >= 2 * (MERGE_BATCH + 1), run
    # round 4's merge_chunks stored just-loaded registers to local memory (a spill store waits
    # for its load and serialised the loads issued ahead again): none here
    assert not re.search(r"\bSTL\b", merge)


def test_step_d_merge_computes_each_chunks_weight_once_not_in_every_lane(step_d):
    """Round 6's merge_heads had every lane compute all 16 weights of a batch (an expf each,
    behind two shuffles): a serial chain of 16 expf a batch, ~2,000 cycles, the largest part of
    its ~10 us. Now lane b computes chunk b's weight: one expf for alpha and one for the lane's
    chunk in each instance of the function (an instance per kernel and shape)."""
    merge = function_listings(step_d, ("merge_heads",)).get("merge_heads", "")
    instances = len(re.findall(r"^\S*merge_heads\S*:\s*$", step_d, re.M))
    assert instances >= 2, instances  # the plain and the tripwire kernel at least
    ex2 = len(re.findall(r"\bMUFU\.EX2\b", merge))
    assert 0 < ex2 <= 2 * instances, (ex2, instances)


def test_steps_5_to_21_call_step_d_spread_merge_production_splits_it_and_step_b0_merges_on_one_block():
    """Round 8's promotion made the default build (no define, what every family run, bench and gate
    `production` builds) step (d), and steps 10 (production from promote10), 14 (production from promote14),
    15 (production from promote15) and 21 (production from promote21 until step 22) keep its spread merge
    (merge_heads, a head a warp); production since promote22 (step 22) keeps step (d)'s merge workers and
    splits each one's heads over its warps (step (t): merge_head_split, a head a block); step_b0
    (MKL_CAMPAIGN_STEP 2, the production before round 8) still merges on the last chunk block. Before round 8
    the default build had no merge_heads."""
    from hazards.megakernel_layers import faithful as FA

    calls = re.findall(r"\bCALL\.\S+\s+`?\(?(\S*merge_\w+)", _sass(21))
    assert any("merge_heads" in c for c in calls), calls
    calls = re.findall(r"\bCALL\.\S+\s+`?\(?(\S*merge_\w+)", _sass(None))
    assert any("merge_head_split" in c for c in calls) and not any("merge_heads" in c for c in calls), calls
    assert "merge_heads" not in _sass(2)
    assert dict(FA.candidate("step_b0").defines) == {"MKL_CAMPAIGN_STEP": 2}
    assert FA.candidate("production").defines == ()


def _static(build: int | list[str]) -> tuple[list, int]:
    """Failing findings and the polls checked of the compiled static checks (nvcc, sm_90a) of a build: a
    campaign step's number, or the nvcc flags of a switch on production (`[]`: production)."""
    from hazards.engine.errors import ToolchainMissing
    from hazards.static import compiled

    flags = [f"-DMKL_CAMPAIGN_STEP={build}"] if isinstance(build, int) else list(build)
    try:
        found = compiled.check_jobs(compiled.jobs_for_files([LAYERED], flags, archs=["sm_90a"]))
    except ToolchainMissing as e:
        pytest.skip(f"cannot run the compiled static checks: {e}")
    [coverage] = [f.message for f in found if f.check == "coverage"]
    polls = int(re.search(r"(\d+) poll\(s\) checked", coverage).group(1))
    return [f for f in found if f.fails], polls


def assert_static_checks_pass_with_the_polls_of(step: int | list[str], base: int | list[str]) -> None:
    """The compiled static checks pass on `step`'s build and count `base`'s polls: no wait added or moved
    (either a campaign step's number or nvcc flags, as `_static`)."""
    failing, polls = _static(step)
    assert failing == [], [f.message for f in failing]
    assert polls == _static(base)[1]  # no wait added or moved


def test_step_d_passes_the_compiled_static_checks_with_the_merge_workers_acquire_poll():
    failing, polls = _static(5)
    assert failing == [], [f.message for f in failing]
    _, step_b0_polls = _static(2)
    assert polls == step_b0_polls + 1  # the merge workers' wait for the chunk count


@pytest.mark.parametrize("workers", [16, 32, 64, 80, 132])
@pytest.mark.parametrize("model", ["default", "small"])
def test_merge_workers_hold_qkv_tiles_so_the_snapshot_class_keeps_its_vulnerable_workers(workers, model):
    sc = M.describe(F.resolve({"model": model}), workers, {"MKL_CAMPAIGN_STEP": 21})  # step (d)'s merge: step 21's
    n = sc.merge_workers()
    assert n == -(-sc.shape.NQ // M.MERGE_HEADS_PER_WORKER)  # a warp a head, as few blocks as that needs
    assert all(sc.holds_qkv(w) for w in range(n))  # none of them arrived at nothing before
    # every head has a merge worker, and a worker's heads fit its 16 warps
    heads = [[h for h in range(w, sc.shape.NQ, n)] for w in range(n)]
    assert sorted(h for hs in heads for h in hs) == list(range(sc.shape.NQ))
    assert max(len(hs) for hs in heads) <= M.MERGE_HEADS_PER_WORKER


def test_step_d_participant_set_hang_counts_the_merge_workers_and_names_the_missing_chunks():
    """Step (d) at seq 16384: the 4 merge workers wait for the chunk count at CHUNK_MERGE (it
    wants 129 x epoch), the other 128 workers at ATTN_RELEASE; both watches carry the counter."""
    sl = [slot(w, layer=0, phase=PHASE_ATTN_MERGE, barrier=BAR_CHUNK_MERGE, observed=80, expected=129,
               aux=(80, 129, NO_FEEDER)) for w in range(4)]
    sl += [slot(w, layer=0, phase=PHASE_OPROJ, barrier=BAR_ATTN_RELEASE, observed=0, expected=1,
                aux=(80, 129, NO_FEEDER)) for w in range(4, 132)]
    # step 21's build: step (d)'s merge workers (production's, step 22, are one a head: test_merge_split.py)
    text = F.explain_hang(snapshot(132, sl), {"variant": "participant_set"}, {"MKL_CAMPAIGN_STEP": 21})
    assert "128 of 132 workers wait at ATTN_RELEASE in layer 0 (epoch 1) and 4 at CHUNK_MERGE" in text
    assert "CHUNK_MERGE counted 80 of its 129" in text and "chunk ranks 80–128 never arrived" in text
    assert "nested inside the QKV rank guard" in text


def test_step_d_hang_read_from_the_merge_workers_alone_names_the_chunks_without_a_worker():
    """Grid 64, 80 chunks, guard off, layer 1: if only the merge workers' watches were published
    (the others' waits still short), CHUNK_MERGE (it wants 80 x epoch 2) leads the sentence."""
    sl = [slot(w, layer=1, phase=PHASE_ATTN_MERGE, barrier=BAR_CHUNK_MERGE, observed=144, expected=160,
               aux=(144, 160, NO_FEEDER)) for w in range(4)]
    sl += [slot(w, layer=1, phase=PHASE_OPROJ, waiting=False) for w in range(4, 64)]
    text = F.explain_hang(snapshot(64, sl), {"variant": "chunk_supply", "grid": 64}, {"MKL_CAMPAIGN_STEP": 21})
    assert "4 of 64 workers wait at CHUNK_MERGE in layer 1 (epoch 2)" in text
    assert "chunk ranks 64–79 never arrived" in text and "have no worker (grid 64)" in text


def test_production_tripwire_instance_has_its_out_of_line_wait_checked_and_acquired():
    """The tripwire instance (mkl_megakernel<true>) waits through the out-of-line
    wait_ge_watched: its poll is reached only by a CALL (and its loop rebuilds the memory
    descriptor from SR_CgaCtaId for the watch's shared-memory stores); the compiled checks
    found 0 polls in that instance before. Checked on production's build (the default: step 21
    since promote21; written for step_b0, the production of its time)."""
    from hazards.engine.errors import ToolchainMissing
    from hazards.static import compiled

    try:
        found = compiled.check_jobs(compiled.jobs_for_files([LAYERED], [], archs=["sm_90a"]))
    except ToolchainMissing as e:
        pytest.skip(f"cannot run the compiled static checks: {e}")
    watched = [f.message for f in found if f.check == "sync-scope" and "mkl_megakernelILb1E" in f.message]
    assert len(watched) == 1 and "in out-of-line `_ZN3mkl15wait_ge_watched" in watched[0], watched
    assert "acquire: `CCTL.IVALL`" in watched[0]
    assert not [f for f in found if f.fails]
