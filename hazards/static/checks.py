"""The registry of static check ids: what each check reads, its severity, one line of doc.

Every `Finding` a checker in `hazards.static` reports is made through its `Check`
(`EARLY_CLOBBER.finding(path, line, message)`), so an id is spelled once, here, and the
table in `docs/static-checks.md` is generated from this registry (`markdown_table`; a test
keeps the two in sync). Families name the checks they expect by these constants too.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

from hazards.static.findings import SEVERITIES, Finding, Severity


@dataclasses.dataclass(frozen=True)
class Check:
    """One static check: a stable id, its severity, what it reads, and what it flags.

    `also` lists the other severities a finding of this check may carry, with `also_doc`
    saying when (e.g. a layout hazard that is an error on AMD is a warning on NVIDIA).
    """

    id: str
    severity: Severity
    on: str
    doc: str
    also: tuple[Severity, ...] = ()
    also_doc: str = ""

    def __post_init__(self) -> None:
        for sev in (self.severity, *self.also):
            if sev not in SEVERITIES:
                raise ValueError(f"check {self.id}: unknown severity {sev!r}")

    def finding(self, path: str, line: int, message: str, snippet: str = "", *,
                severity: Severity | None = None, subject: str = "") -> Finding:
        """A finding of this check (`severity` only when it differs, from `also`)."""
        sev = severity or self.severity
        if sev != self.severity and sev not in self.also:
            raise ValueError(f"check {self.id} is never {sev!r}")
        return Finding(self.id, sev, path, line, message, snippet, subject)

    @property
    def severity_text(self) -> str:
        """The severity column of the docs table."""
        return f"{self.severity} ({self.also_doc})" if self.also else self.severity


REGISTRY: dict[str, Check] = {}


def register(check: Check) -> Check:
    """Add a check to the registry (ids are unique)."""
    if check.id in REGISTRY and REGISTRY[check.id] != check:
        raise ValueError(f"check id {check.id!r} registered twice")
    REGISTRY[check.id] = check
    return check


def get(check_id: str) -> Check:
    """The registered check with this id (KeyError names the known ones)."""
    try:
        return REGISTRY[check_id]
    except KeyError:
        raise KeyError(f"no static check {check_id!r} (known: {', '.join(sorted(REGISTRY))})") from None


def markdown_table(checks: Iterable[Check]) -> str:
    """The `| id | severity | on | flags |` table of docs/static-checks.md."""
    rows = ["| id | severity | on | flags |", "|---|---|---|---|"]
    for c in checks:
        rows.append(f"| `{c.id}` | {c.severity_text} | {c.on} | {c.doc} |")
    return "\n".join(rows) + "\n"


# --- source lint ---------------------------------------------------------------------------
EARLY_CLOBBER = register(Check(
    "early-clobber", "error", "source",
    "an asm block where an output without `&` (`\"=v\"`, or a `\"+v\"`/tied operand whose value "
    "is undefined or equal to an input) is written before an instruction that runs after it - "
    "later, or around an asm-written loop - reads a register input"))
ASM_WRITES_INPUT = register(Check(
    "asm-writes-input", "error", "source",
    "an AMDGCN asm template whose instruction writes (destination position) an operand listed "
    "only as an input: the compiler assumes an input's register holds its value after the block "
    "and may reuse it, or have put another live value there"))
ASM_UNCHECKED = register(Check(
    "asm-unchecked", "info", "source",
    "an asm block that could have the hazard but that the lint could not read (a macro the "
    "preprocessor could not expand with the flags it had): counted as skipped, never as clean"))
LINT_SKIPPED = register(Check(
    "lint-skipped", "warning", "source",
    "a source file containing `asm` that was not linted (too large, unreadable)"))
ALLOW_NO_REASON = register(Check(
    "allow-no-reason", "warning", "source",
    "an allowlist comment `hazards: allow(...)` without a reason: ignored"))

# --- AMDGCN (clang-19 listings) -------------------------------------------------------------
ASM_OVERLAP = register(Check(
    "asm-overlap", "error", "AMDGCN",
    "inside `;;#ASMSTART`..`;;#ASMEND`, an output and an input got overlapping registers and "
    "the block writes the output before it reads the input (range-aware: `v[4:7]` overlaps "
    "`v[6:7]`)"))
MFMA_ACC_READ = register(Check(
    "mfma-acc-read", "error", "AMDGCN",
    "an MFMA result read (VALU incl. `v_accvgpr_read`, memory op, another MFMA) with too few "
    "wait states on some path"))
MFMA_SRC_WAR = register(Check(
    "mfma-src-war", "error", "AMDGCN",
    "a hand-written load into the sources of an MFMA still in flight"))
MFMA_EXIT_PARITY = register(Check(
    "mfma-exit-parity", "error", "AMDGCN",
    "a load into MFMA operand registers that leaves its asm region unread on some path (one "
    "tail for two parities)"))
MFMA_UNKNOWN_SHAPE = register(Check(
    "mfma-unknown-shape", "warning", "AMDGCN",
    "an MFMA the wait-state table does not know: its hazards cannot be checked"))
RELEASE_ORDER = register(Check(
    "release-order", "error", "AMDGCN",
    "a data store reaches a flag (sc1 / write-through store, atomic; a nontemporal `nt` store is "
    "data) without `s_waitcnt "
    "vmcnt(0)` or a release fence; an atomic after an `s_barrier` is a release of every wave's "
    "stores before it; not the arrive of a final barrier (nothing read after its wait); `scratch_` "
    "(private) stores are not data"))
RELEASE_SCOPE = register(Check(
    "release-scope", "error", "AMDGCN",
    "a write-through (`sc0 sc1`) flag after L2-resident data with no `buffer_wbl2 sc1` (not the "
    "arrive of a final barrier)"))
ACQUIRE_MISSING = register(Check(
    "acquire-missing", "error", "AMDGCN",
    "a poll loop (one loop-invariant address of shared memory re-read until its value lets the "
    "loop exit; an address an inner loop walks is not invariant) exits into a plain load with no "
    "`buffer_inv`; not after a start barrier (an arrive of the "
    "value waited for, no shared store before it) nor for `scratch_` (private) loads"))
SYNC_SCOPE = register(Check(
    "sync-scope", "info", "AMDGCN, SASS",
    "the scope each release/acquire sequence provides, in words"))

# --- NVIDIA (SASS, ptxas) -------------------------------------------------------------------
SPIN_NO_LOAD = register(Check(
    "spin-no-load", "error", "SASS",
    "a reachable loop with no memory load whose exit never changes: the hoisted poll, a "
    "certain hang"))
POLL_NO_ACQUIRE = register(Check(
    "poll-no-acquire", "error", "SASS",
    "a poll loop (its exit tests the value re-read from one address) followed by a weak "
    "global data load with no gpu/system acquire (`CCTL.IVALL`, `MEMBAR.GPU`/`.SYS`), once "
    "per poll; not after a start barrier (an arrive storing the value waited for, no store of "
    "the kernel before it: the reads are of data written before the launch, said in `sync-scope`)"))
WGMMA_SERIALIZED = register(Check(
    "wgmma-serialized", "perf", "ptxas log",
    "ptxas serialized `wgmma.mma_async` (C7510-C7516), with its reason"))

# --- NVIDIA wgmma pipelines (hazards/static/wgmma.py) ---------------------------------------
WGMMA_REFILL_IN_FLIGHT = register(Check(
    "wgmma-refill-in-flight", "error", "SASS",
    "a bulk copy into shared memory (`UBLKCP.S.G`, `UTMALDG`; and `STS` when the caller says the "
    "ring is refilled by stores) issued while as many wgmma groups "
    "may be pending (after the `WARPGROUP.DEPBAR` before it) as the ring has operand buffers: "
    "the copy can overwrite operands the tensor core still reads"))
WGMMA_REFILL_DEPTH = register(Check(
    "wgmma-refill-depth", "info", "SASS",
    "how many wgmma groups may be pending at the shared-memory refills of a function (safe "
    "only for rings with more buffers; stated when the ring size is not known)"))
WGMMA_REGISTER_IN_FLIGHT = register(Check(
    "wgmma-register-in-flight", "error", "SASS",
    "a non-wgmma instruction reads or writes an accumulator or register-A operand of a wgmma "
    "that may still be pending"))
WGMMA_PROXY_FENCE = register(Check(
    "wgmma-proxy-fence", "error", "SASS",
    "a thread's `STS` reaches a wgmma on some path with no `FENCE.VIEW.ASYNC` between them "
    "(PTX: `st.shared` then `wgmma.mma_async` without `fence.proxy.async`): the wgmma's "
    "async-proxy operand read need not see the store",
    also=("info",), also_doc="info unless the caller says the ring is refilled by stores: the "
    "store may be to memory no wgmma reads"))
WGMMA_EARLY_ACCESS = register(Check(
    "wgmma-early-access", "warning", "ptxas log",
    "the PTX touches the registers of an in-flight wgmma (C7513-C7515: undefined); ptxas "
    "serialized every wgmma of the function to keep it correct"))

# --- barrier layouts ------------------------------------------------------------------------
LAYOUT_WT_L2_LINE = register(Check(
    "layout-wt-l2-line", "error", "layout",
    "a write-through slot in one line with an L2-resident writer (atomic or plain), one "
    "finding per pair of barriers", also=("warning",), also_doc="warning on NVIDIA"))
LAYOUT_FALSE_SHARING = register(Check(
    "layout-false-sharing", "warning", "layout",
    "one line (NVIDIA: and whether one 32-B sector) shared by unrelated barriers, one "
    "finding per pair of barriers", also=("perf",), also_doc="perf on NVIDIA"))
LAYOUT_OVERLAP = register(Check(
    "layout-overlap", "error", "layout", "slots sharing bytes"))
LAYOUT_MISALIGNED = register(Check(
    "layout-misaligned", "error", "layout",
    "an atomic slot not naturally aligned or crossing a line"))

# --- when a check could not look ------------------------------------------------------------
TOOLCHAIN_MISSING = register(Check(
    "toolchain-missing", "error", "any",
    "a compiler or disassembler a check needs is not installed: the check could not look "
    "(names it and how to install it; exit 3 unless `--skip TOOL` names it)"))
CHECK_SKIPPED = register(Check(
    "check-skipped", "info", "any",
    "checks skipped at the user's request (`--skip TOOL`): names them and the tool"))
NOT_ANALYSED = register(Check(
    "not-analysed", "error", "compiled mode",
    "a device function of the source with asm, atomics, volatile accesses, fences or loops that "
    "left no code in the output (a template never instantiated, a function never called): "
    "nothing in it was checked (exit 3, could not judge)"))
COVERAGE = register(Check(
    "coverage", "info", "compiled mode",
    "per build: device functions compiled, asm blocks and polls checked, functions not analysed"))
COMPILE_FAILED = register(Check(
    "compile-failed", "error", "compiled mode",
    "a user source that did not compile with the given flags: nothing in it was checked "
    "(exit 3, could not judge)"))
TOOL_KILLED = register(Check(
    "tool-killed", "error", "any",
    "a compiler or disassembler a check ran was ended before it finished, by a signal (the "
    "OOM killer, someone's kill, a stop) or at its time limit: the check could not look (exit 3, "
    "could not judge)"))


def could_not_look(path: str, what: str, missing: Exception, subject: str = "") -> Finding:
    """The finding for checks that could not run for a missing (or `--skip`ped) tool:
    `check-skipped` (info) when the user asked to skip it, else `toolchain-missing` (an
    error: a check that could not look must never read as passed)."""
    if getattr(missing, "skipped", False):
        return CHECK_SKIPPED.finding(path, 0, f"{what} skipped: {missing}", subject=subject)
    return TOOLCHAIN_MISSING.finding(path, 0, f"{what} could not run: {missing}", subject=subject)


def tool_killed(path: str, what: str, killed: Exception, subject: str = "") -> Finding:
    """The `tool-killed` error for checks whose compiler or disassembler was ended before it
    finished (`compile.ToolKilled`): `what` says what was not judged, `killed` names the tool."""
    return TOOL_KILLED.finding(path, 0, f"{what}: {killed}", subject=subject)
