"""The compiled mode: a user's sources compiled with their flags, every check run on the output.

AMD (gfx942 with clang-19, gfx950 with clang-22): the source is preprocessed with the installed HIP headers and the
user's flags, every asm template of the preprocessed text gets its `; HZ_ASM` operand
annotation (so a macro-built template is annotated after its expansion, never between a
macro's name and its arguments), the annotated text is compiled to assembly with line
tables, and the AMDGCN checks run on it. NVIDIA (sm_90a, nvcc): a cubin with line info,
disassembled, and the SASS and ptxas checks. Findings point at the user's source line
(from the line tables) and name the listing line they were found on. Every build lands in
the static build cache, never next to the user's files; a source that does not compile is
a `compile-failed` error (nothing in it was checked: exit 3), not a pass.
More in docs/static-checks.md.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from pathlib import Path
from typing import Iterable, Sequence

from hazards.engine.errors import ToolchainMissing, UserError
from hazards.static import amdgcn, amdgcn_isa as isa, amdgcn_sync, checks, cscan, sass
from hazards.engine import toolchain
from hazards.static.compile import DIAGNOSTIC_ERROR, ToolKilled, compile_amdgcn, compile_cubin, disassemble, run_tool
from hazards.static.findings import Finding
from hazards.static.userbuild import (CompileDatabase, Entry, device_lib_args, hip_device_args,
                                      source_flags)

_AMD_HINTS = re.compile(r"hip_runtime|__HIP|__builtin_amdgcn|__hip_atomic|hipLaunch|"
                        r"\b(?:v_mfma|global_load|buffer_load|ds_read|s_waitcnt)\w*")
_NV_HINTS = re.compile(r"cuda_runtime|cuda\.h|__nv_|cooperative_groups|\bcuda::|"
                       r"\bld\.(?:global|shared|acquire|volatile)|\bcp\.async|\bwgmma\b")


@dataclasses.dataclass(frozen=True)
class CompileJob:
    """One source to compile for one target with the flags that decide its text."""

    source: Path
    arch: str
    flags: tuple[str, ...] = ()

    @property
    def platform(self) -> str:
        return "amd" if self.arch.startswith("gfx") else "nvidia"


def infer_archs(source: Path) -> tuple[str, ...]:
    """The targets a source is meant for, from its suffix and text: `.hip` or HIP/AMDGCN
    spellings -> gfx942; CUDA/PTX spellings -> sm_90a; a `.cu` with neither -> sm_90a."""
    try:
        text = Path(source).read_text(errors="replace")
    except OSError as e:
        raise UserError(f"cannot read {source}: {e.strerror or e}") from None
    amd = Path(source).suffix == ".hip" or bool(_AMD_HINTS.search(text))
    nv = bool(_NV_HINTS.search(text)) or (not amd and Path(source).suffix in (".cu", ".cuh"))
    return ((toolchain.GFX942,) if amd else ()) + ((toolchain.SM90A,) if nv else ()) or (toolchain.GFX942,)


def _absolute(flags: Sequence[str], directory: Path) -> tuple[str, ...]:
    """Relative include paths and forced includes made absolute against `directory`."""
    out, take_next = [], False
    for f in flags:
        if take_next:
            out.append(str(directory / f) if not Path(f).is_absolute() else f)
            take_next = False
            continue
        if f in ("-isystem", "-iquote", "-idirafter", "-include", "-imacros"):
            take_next = True
        elif f.startswith("-I") and len(f) > 2 and not Path(f[2:]).is_absolute():
            f = "-I" + str(directory / f[2:])
        out.append(f)
    return tuple(out)


def _checked_archs(archs: Sequence[str]) -> Sequence[str]:
    """`--arch` as given; a UserError for an AMD target the AMDGCN checks do not read (their
    release/acquire checks know gfx942/gfx950's cache bits and fences: another target's
    listing would pass them unread)."""
    for a in archs:
        if a.startswith("gfx") and a not in toolchain.AMD_ARCHS:
            raise UserError(f"--arch {a}: the AMDGCN checks read {' and '.join(toolchain.AMD_ARCHS)} code "
                            "(their cache bits and fences); give one of them")
    return archs


def jobs_for_files(sources: Iterable[Path], flags: Sequence[str] = (),
                   archs: Sequence[str] = ()) -> list[CompileJob]:
    """Jobs for sources named on the command line with the flags after `--`."""
    archs = _checked_archs(archs)
    jobs = []
    for src in sources:
        src = Path(src)
        if not src.is_file():
            raise UserError(f"no such source file: {src}")
        kept = _absolute(source_flags(flags, for_nvcc=True), Path.cwd())
        jobs += [CompileJob(src, a, kept) for a in (archs or infer_archs(src))]
    return jobs


def jobs_from_database(db: CompileDatabase, only: Iterable[Path] = (),
                       archs: Sequence[str] = ()) -> list[CompileJob]:
    """Jobs for every entry of a compile database (or those of the files in `only`), each
    for the target its compiler builds (nvcc: sm_90a; hipcc/clang HIP: the command's
    `--offload-arch` targets, gfx942 when it names none)."""
    wanted = {Path(p).resolve() for p in only}
    archs = _checked_archs(archs)
    jobs = []
    for e in db.entries:
        if wanted and e.file not in wanted:
            continue
        if not e.file.is_file():
            raise UserError(f"{db.path}: {e.file} does not exist")
        targets = archs or ((toolchain.SM90A,) if e.platform == "nvidia" else _offload_archs(e) or (toolchain.GFX942,))
        jobs += [CompileJob(e.file, a, _absolute(_entry_flags(e, a), e.directory)) for a in targets]
    if wanted and not jobs:
        raise UserError(f"{db.path} has no command for {', '.join(map(str, sorted(wanted)))}")
    return jobs


def _offload_archs(e: Entry) -> tuple[str, ...]:
    """The AMD targets a HIP compile command builds (`--offload-arch=gfx950`, `--amdgpu-target=`,
    `--offload-arch gfx942`; a feature suffix such as `:xnack-` dropped), in order, once each.
    A target the AMDGCN checks do not read (gfx90a, gfx1100: other cache bits and fences,
    which would pass the checks unread) is checked as gfx942: the same source's code there."""
    found: list[str] = []
    args = list(e.arguments)
    for k, a in enumerate(args):
        value = None
        for flag in ("--offload-arch", "--amdgpu-target", "--cuda-gpu-arch"):
            if a.startswith(flag + "="):
                value = a.split("=", 1)[1]
            elif a == flag and k + 1 < len(args):
                value = args[k + 1]
        for v in (value or "").split(","):
            arch = v.split(":", 1)[0].strip()
            if re.fullmatch(r"gfx[0-9a-f]+", arch):
                arch = arch if arch in toolchain.AMD_ARCHS else toolchain.GFX942
                if arch not in found:
                    found.append(arch)
    return tuple(found)


def _entry_flags(e: Entry, arch: str) -> list[str]:
    return source_flags(e.arguments[1:], for_nvcc=not arch.startswith("gfx"))


@dataclasses.dataclass
class Coverage:
    """What one compiled build let the checks look at."""

    source: str
    arch: str
    functions: int = 0      # device functions in the output
    asm_blocks: int = 0     # asm blocks in the output, checked
    polls: int = 0          # poll loops found in the output, checked
    out_of_line: int = 0    # out-of-line functions in the kernels' listings, their polls among `polls`
    not_analysed: list[cscan.DeviceFunction] = dataclasses.field(default_factory=list)  # watched ones
    no_code: int = 0        # other source functions without code in the output (nothing to judge)

    def summary(self) -> str:
        """One line, like the lint's: what was checked and what was not."""
        out = (f"{self.source} ({self.arch}): {self.functions} device function(s) compiled, "
               f"{self.asm_blocks} asm block(s) and {self.polls} poll(s) checked")
        if self.out_of_line:
            out += (f" (those in the {self.out_of_line} out-of-line function(s) they call included, "
                    f"against what their callers read after them)")
        if self.not_analysed:
            names = ", ".join(f"{f.name} (line {f.line})" for f in self.not_analysed)
            out += f"; not analysed: {len(self.not_analysed)} function(s) with no code in the output: {names}"
        if self.no_code:
            out += f"; {self.no_code} other function(s) left no code (nothing to judge in them)"
        return out

    def findings(self) -> list[Finding]:
        """The `coverage` line and one `not-analysed` error per watched function left out."""
        out = [checks.COVERAGE.finding(self.source, 0, self.summary())]
        for f in self.not_analysed:
            out.append(checks.NOT_ANALYSED.finding(
                self.source, f.line, f"not analysed for {self.arch}: device function `{f.name}` "
                f"(lines {f.line}-{f.end_line}) left no code in the output - never instantiated or "
                f"never called in this build - so nothing in it was checked; instantiate or call it "
                f"from a kernel of this source"))
        return out


def _coverage(job: CompileJob, functions: list[cscan.DeviceFunction], funcs_out: int,
              blocks: int, polls: int, covered: set[int]) -> Coverage:
    """`functions` (the source's) split by whether any output line came from their lines."""
    cov = Coverage(str(job.source), job.arch, funcs_out, blocks, polls)
    for f in functions:
        if any(f.line <= ln <= f.end_line for ln in covered):
            continue
        if f.watched:
            cov.not_analysed.append(f)
        else:
            cov.no_code += 1
    return cov


def _covered_lines(locations: list[tuple | None], source: Path) -> set[int]:
    """The lines of `source` some output line came from (line tables)."""
    names: dict[str, bool] = {}
    out = set()
    for loc in locations:
        if loc is None:
            continue
        same = names.get(loc[0])
        if same is None:
            try:
                same = names[loc[0]] = os.path.samefile(loc[0], source)
            except OSError:
                same = names[loc[0]] = False
        if same:
            out.update(loc[1:])  # the line, and the inlined helper's line where there is one
    return out


def check_job(job: CompileJob) -> list[Finding]:
    """Compile one job and run every check for its platform (a `compile-failed` error
    when it does not compile), then say what was covered (`Coverage`). A finding repeated
    at one source line (the instantiations of one template, the inlined copies of one
    function) is reported once."""
    try:
        found, cov = _check_amd(job) if job.platform == "amd" else _check_nvidia(job)
        return once_per_line([_as_given(f, job.source) for f in found]) + cov.findings()
    except ToolchainMissing:
        raise  # not a compile failure: check_jobs names the missing tool
    except ToolKilled as e:  # the compiler said nothing about the source (OOM killer, a kill)
        return [checks.tool_killed(str(job.source), f"not checked for {job.arch}", e)]
    except UserError as e:
        lines = str(e).splitlines()
        first = next((ln for ln in lines[1:] if DIAGNOSTIC_ERROR.search(ln)),
                     next((ln for ln in lines[1:] if "error" in ln), lines[0]))
        return [checks.COMPILE_FAILED.finding(str(job.source), 0,
                                              f"not checked for {job.arch}: {first.strip()}")]


def check_jobs(jobs: Iterable[CompileJob]) -> list[Finding]:
    """Every job's findings; a missing compiler is a `toolchain-missing` error per job (the
    checks could not look), `check-skipped` when `--skip` names the tool."""
    out: list[Finding] = []
    for job in jobs:
        try:
            out += check_job(job)
        except ToolchainMissing as e:
            out.append(checks.could_not_look(str(job.source), f"{job.arch} checks", e))
    return out


def _language_flags(flags: Sequence[str]) -> list[str]:
    """The flags that still matter once the text is preprocessed (the language)."""
    return [f for f in flags if f.startswith(("-std=", "-f"))]


def _check_amd(job: CompileJob) -> tuple[list[Finding], Coverage]:
    clang = toolchain.find_tool("clang", needed_for="for the AMDGCN checks of user builds", arch=job.arch)
    cmd = [clang, "-E", *hip_device_args(clang, job.arch), "-w", *job.flags,
           str(job.source.resolve()), "-o", "-"]
    pre = run_tool(cmd, "clang -E").stdout
    annotated, stmts = amdgcn.annotate_source(pre)
    build = compile_amdgcn(job.source, arch=job.arch, text=annotated,
                           label=f"{job.source.stem}-{job.arch}-user",
                           extra_args=(*_language_flags(job.flags), "-gline-tables-only"),
                           device_libs=device_lib_args(clang, job.arch))
    lines = cscan.line_map(pre)
    found = amdgcn.check_listing(build.text, str(build.path), target=job.arch, stmts=stmts,
                                 source_path=str(job.source), line_map=lines)
    locations = _amd_locations(build.text)
    covered = _covered_lines(locations, job.source)
    funcs = isa.parse_listing(build.text)
    blocks = {(f.name, r.index) for f in funcs for r in f.regions}
    # asm blocks are part of the output too (line tables may not reach inside them)
    for r in (r for f in funcs for r in f.regions if r.annotation):
        sid = int(r.annotation.split()[0])
        if 0 <= sid < len(stmts) and lines:
            covered |= {lines[ln - 1][1] for ln in range(stmts[sid].line, stmts[sid].end_line + 1)
                        if ln - 1 < len(lines) and _same_file(lines[ln - 1][0], job.source)}
    polls = sum(len(amdgcn_sync.poll_loops(f)) for f in funcs)
    mine = [dataclasses.replace(f, line=lines[f.line - 1][1], end_line=lines[f.end_line - 1][1])
            for f in cscan.device_functions(pre)
            if lines and _same_file(lines[f.line - 1][0], job.source)] if lines else []
    cov = _coverage(job, mine, len(funcs), len(blocks), polls, covered)
    return at_source(found, build.text, str(build.path), _amd_locations), cov


def _same_file(name: str, source: Path) -> bool:
    try:
        return os.path.samefile(name, source)
    except OSError:
        return False


def _check_nvidia(job: CompileJob) -> tuple[list[Finding], Coverage]:
    build = compile_cubin(job.source, arch=job.arch, label=f"{job.source.stem}-{job.arch}-user",
                          extra_args=(*job.flags, "-lineinfo"), key_extra=_headers_key(job))
    found = sass.check_ptxas_log(build.log, str(job.source))
    listing = disassemble(build.path)
    found += sass.check_sass(listing.text, str(listing.path))
    funcs = sass.parse_sass(listing.text)
    polls = sum(len(sass.poll_loops(f)) for f in funcs)
    covered = _covered_lines(_sass_locations(listing.text), job.source)
    text = job.source.read_text(errors="replace")
    # SASS marks no asm blocks: a block counts as checked when its lines left code
    blocks = sum(1 for st in cscan.asm_statements(text)
                 if any(st.line <= ln <= st.end_line for ln in covered))
    cov = _coverage(job, cscan.device_functions(text), len(funcs), blocks, polls, covered)
    cov.out_of_line = sum(1 for f in funcs for name in f.routines.values() if not name.startswith("__cuda_"))
    return at_source(found, listing.text, str(listing.path), _sass_locations), cov


def _headers_key(job: CompileJob) -> str:
    """The text of every file nvcc reads for this job (`nvcc -M`): part of the cache key, so
    an edited header behind -I never leaves a stale cubin in use."""
    cmd = [toolchain.find_tool("nvcc", needed_for="for the NVIDIA checks of user builds"), "-M",
           *toolchain.nvcc_arch_flags(job.arch), *job.flags, str(job.source)]
    deps = run_tool(cmd, "nvcc -M").stdout.replace("\\\n", " ").split(":", 1)[-1].split()
    digest = hashlib.sha256()
    for dep in sorted(set(deps)):
        try:
            digest.update(dep.encode() + b"\0" + Path(dep).read_bytes())
        except OSError:
            digest.update(dep.encode() + b"\0missing")
    return digest.hexdigest()


_LOC_RE = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)")
_FILE_RE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]*)"(?:\s+"([^"]*)")?')
_SASS_LOC_RE = re.compile(r'^\s*//## File "([^"]*)", line (\d+)(?: inlined at "([^"]*)", line (\d+))?')


def _amd_locations(listing: str) -> list[tuple[str, int] | None]:
    """For each listing line, the source line its code came from (the latest `.loc`)."""
    files: dict[str, str] = {}
    cur: tuple[str, int] | None = None
    out: list[tuple[str, int] | None] = []
    for raw in listing.split("\n"):
        m = _FILE_RE.match(raw)
        if m:
            files[m.group(1)] = str(Path(m.group(2)) / m.group(3)) if m.group(3) else m.group(2)
        m = _LOC_RE.match(raw)
        if m:
            name = files.get(m.group(1))
            cur = (name, int(m.group(2))) if name and int(m.group(2)) > 0 else None
        elif re.match(r"^[A-Za-z_.$][\w.$]*:", raw):
            cur = None  # a new function starts without a location
        out.append(cur)
    return out


def _sass_locations(listing: str) -> list[tuple | None]:
    """For each SASS line, the source line nvdisasm's line info (`-gi`) gives it: code
    inlined from a helper is placed at the call site, `(file, line, helper line)`, so a
    helper called from many places is reported once per call, not once at its own line."""
    cur: tuple | None = None
    inner: tuple[str, int] | None = None  # the helper line of the latest "inlined at" marker
    out: list[tuple | None] = []
    for raw in listing.split("\n"):
        m = _SASS_LOC_RE.match(raw)
        if m and m.group(3):
            inner = (m.group(1), int(m.group(2)))
            cur = (m.group(3), int(m.group(4)), inner[1]) if inner[0] == m.group(3) else (m.group(3), int(m.group(4)))
        elif m:
            here = (m.group(1), int(m.group(2)))
            # nvdisasm repeats the call site after an "inlined at" marker: keep the helper line
            cur = cur if cur is not None and inner is not None and cur[:2] == here else here
            if cur is here:
                inner = None
        elif raw.startswith("//---"):
            cur, inner = None, None
        out.append(cur)
    return out


def at_source(found: list[Finding], listing: str, listing_path: str, locations) -> list[Finding]:
    """Findings on listing lines re-pointed at the source line the code came from (the
    listing line is kept in the message)."""
    where = locations(listing)  # (file, line) or (file, line, the inlined helper's line)
    out = []
    for f in found:
        loc = where[f.line - 1] if f.path == listing_path and 0 < f.line <= len(where) else None
        if loc is None:
            out.append(f)
            continue
        via = f", inlined from line {loc[2]}" if len(loc) > 2 else ""
        out.append(dataclasses.replace(f, path=loc[0], line=loc[1],
                                       message=f"{f.message} [listing {listing_path}:{f.line}{via}]"))
    return out


def once_per_line(found: list[Finding]) -> list[Finding]:
    """One finding per (check, file, line), saying how many more the line had."""
    groups: dict[tuple[str, str, int], list[Finding]] = {}
    for f in found:
        groups.setdefault((f.check, f.path, f.line), []).append(f)
    out = []
    for group in groups.values():
        first = group[0]
        if len(group) > 1:
            first = dataclasses.replace(first, message=f"{first.message} (and {len(group) - 1} more at "
                                                       f"this line: other instantiations or inlined copies)")
        out.append(first)
    return out


def _as_given(f: Finding, source: Path) -> Finding:
    """A finding on the compiled source named as the user named it (line tables and line
    markers spell it absolute or relative, as the compiler saw it)."""
    try:
        same = f.path != str(source) and os.path.samefile(f.path, source)
    except OSError:
        same = False
    return dataclasses.replace(f, path=str(source)) if same else f
