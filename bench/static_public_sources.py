#!/usr/bin/env python3
"""The static checks' compiled mode on public sources (docs/results/static-precision.md).

`--part amd`: compile the 48 public AMD sources (ROCm/aiter
`csrc/kernels/*.cu`, ROCm/mori `src/ops/kernels/*.hip`) in the static checks' compiled mode,
for gfx942 (clang-19) and gfx950 (clang-22), and say per source and target what compiled
and, if not, why (the first error) - with the AMDGCN findings of what did.

Two header sets, each the flags a user would pass (`hazards static --compile SRC --arch A
-v -- FLAGS`):
- `debian`: Debian's HIP 5.2 headers and device libraries only (what `scripts/setup.sh`
  installs) plus each repository's own include folders and build defines;
- `compat`: the same plus `userbuild.hip6_compat_args()`: the project's own declarations for
  what HIP 5.2 lacks (`hazards/static/hip_compat/`) and the headers installed wheels carry
  (triton's AMD backend, PyTorch's `c10`), after the system's.

The sources come from snapshots fetched into `--mirror` (`owner+name/repo`, bare or with a
work tree) and are unpacked with `git archive` into a scratch folder outside the repository.
Writes `amd-sources.tsv` (one row per source, target and header set) and `amd-raw.txt` (each
command and its output) to `--out`.

`--part nvidia`: the NVIDIA poll checks on flashinfer's two all-reduce headers (through
translation units written here that instantiate their kernels; spdlog, which flashinfer's
logging header includes, replaced by an empty stand-in written here) and DeepEP's
`intranode.cu` and `layout.cu` for sm_90a: `nvidia-polls.tsv`, `nvidia-raw.txt`.

    python3 bench/static_public_sources.py --part amd --out docs/results/static-precision/2026-12-05b
    python3 bench/static_public_sources.py --part nvidia --out docs/results/static-precision/2026-12-05b
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REPOS = {  # repository -> (sources under the snapshot, the include folders and defines its build uses)
    "ROCm/aiter": ("csrc/kernels/*.cu", ["-std=c++17", "-DUSE_ROCM", "-I{root}/csrc/include", "-I{root}/csrc/kernels"]),
    "ROCm/mori": ("src/ops/kernels/*.hip", ["-std=c++17", "-I{root}/include", "-I{root}/src", "-I{root}"]),
}
ARCHS = ("gfx942", "gfx950")

# translation units of our own that instantiate header-only kernels (file name -> text)
FLASHINFER_TUS = {
    "vllm_all_reduce_tu.cu": (
        '#include "flashinfer/comm/vllm_custom_all_reduce.cuh"\n'
        "namespace vllm {\n"
        "template __global__ void cross_device_reduce_1stage<float, 8>(RankData*, RankSignals, Signal*, float*, int, int);\n"
        "template __global__ void cross_device_reduce_2stage<float, 8>(RankData*, RankSignals, Signal*, float*, int, int);\n"
        "}\n"),
    "trtllm_all_reduce_tu.cu": (
        '#include "flashinfer/comm/trtllm_allreduce.cuh"\n'
        "namespace flashinfer { namespace trtllm_allreduce {\n"
        "template __global__ void oneShotAllReduceKernel<float, 8, true, false>(AllReduceParams<float>);\n"
        "template __global__ void oneShotAllReduceKernel<float, 8, true, true>(AllReduceParams<float>);\n"
        "template __global__ void twoShotAllReduceKernel<float, 8, true, false, false, false>(AllReduceParams<float>);\n"
        "template __global__ void twoShotAllReduceKernel<float, 8, true, true, false, false>(AllReduceParams<float>);\n"
        "} }\n"),
}
# an empty stand-in for the logging library flashinfer's logging header includes (host code only)
SPDLOG_STANDIN = {
    "spdlog/spdlog.h": (
        "#pragma once\n#include <memory>\nnamespace spdlog {\n"
        "namespace level { enum level_enum { trace, debug, info, warn, err, critical, off }; }\n"
        "namespace sinks { struct stdout_color_sink_mt { void set_pattern(const char*) {} "
        "void set_level(level::level_enum) {} }; }\n"
        "struct logger { logger(const char*, std::shared_ptr<sinks::stdout_color_sink_mt>) {} "
        "void set_pattern(const char*) {} void set_level(level::level_enum) {} };\n"
        "inline void set_default_logger(std::shared_ptr<logger>) {}\n"
        "inline void set_level(level::level_enum) {}\n"
        "template <class... A> void trace(A&&...) {}\ntemplate <class... A> void debug(A&&...) {}\n"
        "template <class... A> void info(A&&...) {}\ntemplate <class... A> void warn(A&&...) {}\n"
        "template <class... A> void error(A&&...) {}\ntemplate <class... A> void critical(A&&...) {}\n}\n"),
    "spdlog/sinks/stdout_color_sinks.h": '#pragma once\n#include "../spdlog.h"\n',
}
DEEPEP_FLAGS = ["-std=c++17", "--expt-relaxed-constexpr", "-I{root}/csrc/kernels/legacy", "-I{root}/csrc",
                "-I{root}/deep_ep/include"]
_FINDING = re.compile(r"^(\S+?):(\d+)?:? ?(error|warning): \[([\w-]+)\] (.*)$")


def unpack(mirror: Path, repo: str, dest: Path) -> tuple[Path, str]:
    """The snapshot's newest commit of `repo`, unpacked under `dest`: (folder, commit)."""
    git = mirror / repo.replace("/", "+") / "repo"
    git = git / ".git" if (git / ".git").is_dir() else git
    commit = subprocess.run(["git", "--git-dir", str(git), "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    out = dest / repo.replace("/", "+")
    out.mkdir(parents=True, exist_ok=True)
    archive = subprocess.Popen(["git", "--git-dir", str(git), "archive", commit], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(out)], stdin=archive.stdout, check=True)
    archive.wait()
    return out, commit


def first_error(output: str) -> str:
    """Why a build failed, in one line: the missing header, or the compiler's first error."""
    m = re.search(r"fatal error: '([^']+)' file not found", output)
    if m:
        return f"missing header {m.group(1)}"
    m = re.search(r"timed out after [\d.]+ s", output)
    if m:
        return m.group(0)
    for line in output.splitlines():
        e = re.search(r"\d+:\d+: error: (.*)", line)
        if e:
            where = re.search(r"([\w.+-]+\.(?:h|hpp|cuh|cu|hip|inc)):(\d+)", line)
            return f"{e.group(1)}" + (f" ({where.group(1)}:{where.group(2)})" if where else "")
    return next((ln.strip() for ln in output.splitlines() if "compile-failed" in ln), output.strip()[-200:])


def run_one(src: Path, root: Path, arch: str, flags: list[str], cap: float, env: dict) -> dict:
    cmd = [sys.executable, "-m", "hazards", "static", "--compile", str(src), "--arch", arch, "-v", "--", *flags]
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=root,
                            env=env, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=cap)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # hazards and the compiler it started
        output, _ = proc.communicate()
        output = (output or "") + f"\n(killed: timed out after {cap:g} s)"
        rc = None
    errors, coverage = [], ""
    for line in output.splitlines():
        m = _FINDING.match(line)
        if m and m.group(4) not in ("compile-failed", "not-analysed"):
            errors.append(m.group(4))
        if "[coverage]" in line:
            coverage = line.split("): ", 1)[-1]
    compiled = rc is not None and "[compile-failed]" not in output and bool(coverage)
    why = "" if compiled else (f"did not finish within {cap:g} s" if rc is None else first_error(output))
    counts = {c: errors.count(c) for c in sorted(set(errors))}
    return {"cmd": cmd, "output": output, "rc": rc, "compiled": compiled, "why": why,
            "errors": ", ".join(f"{n} {c}" for c, n in counts.items()) or "0", "coverage": coverage,
            "seconds": round(time.time() - t0, 1)}


def _shown(text: str, scratch: str) -> str:
    return text.replace(scratch, "$SRC").replace(str(ROOT), "$REPO")


def amd(args, env: dict, scratch: str) -> None:
    from hazards.static.userbuild import hip6_compat_args

    compat = hip6_compat_args()
    work = []
    for repo, (pattern, flags) in REPOS.items():
        root, commit = unpack(args.mirror, repo, Path(scratch))
        for src in sorted(root.glob(pattern)):
            if args.only and args.only not in src.name:
                continue
            base = [f.format(root=root) for f in flags]
            for hset in args.sets.split(","):
                for arch in args.archs.split(","):
                    work.append((repo, commit, root, src, arch, hset, base + (compat if hset == "compat" else [])))
    rows, raw = [], []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(run_one, w[3], w[2], w[4], w[6], args.cap, env): w for w in work}
        for fut in concurrent.futures.as_completed(futures):
            repo, commit, root, src, arch, hset, _ = futures[fut]
            r = fut.result()
            rel = src.relative_to(root)
            rows.append((repo, commit, str(rel), arch, hset, "compiled" if r["compiled"] else "not compiled",
                         r["why"], r["errors"] if r["compiled"] else "-", r["coverage"], r["seconds"]))
            raw.append((str(rel), arch, hset, f"### {repo}@{commit[:12]} {rel} {arch} {hset} rc={r['rc']} "
                        f"{r['seconds']} s\n$ {_shown(' '.join(r['cmd']), scratch)}\n"
                        f"{_shown(r['output'], scratch)}\n"))
            print(f"{rel.name:40s} {arch} {hset:6s} {'OK ' if r['compiled'] else 'no '} "
                  f"{r['why'][:70] if not r['compiled'] else r['errors']}", flush=True)
    rows.sort(key=lambda r: (r[0], r[2], r[4], r[3]))
    head = "repository\tcommit\tsource\ttarget\theaders\tresult\twhy not\tAMDGCN error findings\tcoverage\tseconds\n"
    (args.out / "amd-sources.tsv").write_text(head + "".join("\t".join(map(str, r)) + "\n" for r in rows))
    (args.out / "amd-raw.txt").write_text("".join(t for *_, t in sorted(raw)))
    for hset in args.sets.split(","):
        for arch in args.archs.split(","):
            ok = sum(1 for r in rows if r[4] == hset and r[3] == arch and r[5] == "compiled")
            n = sum(1 for r in rows if r[4] == hset and r[3] == arch)
            print(f"{hset} {arch}: {ok} of {n} compiled")


def nvidia(args, env: dict, scratch: str) -> None:
    fi, fi_commit = unpack(args.mirror, "flashinfer-ai/flashinfer", Path(scratch))
    dee, dee_commit = unpack(args.mirror, "deepseek-ai/DeepEP", Path(scratch))
    tus, stubs = Path(scratch) / "tus", Path(scratch) / "stubs"
    for folder, files in ((tus, FLASHINFER_TUS), (stubs, SPDLOG_STANDIN)):
        for name, text in files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)
    work = [("flashinfer-ai/flashinfer", fi_commit, fi, tus / "vllm_all_reduce_tu.cu", ["-std=c++17", f"-I{fi}/include"]),
            ("flashinfer-ai/flashinfer", fi_commit, fi, tus / "trtllm_all_reduce_tu.cu",
             ["-std=c++17", "--expt-relaxed-constexpr", f"-I{fi}/include", f"-I{stubs}"])]
    work += [("deepseek-ai/DeepEP", dee_commit, dee, dee / "csrc/kernels/legacy" / name,
              [f.format(root=dee) for f in DEEPEP_FLAGS]) for name in ("intranode.cu", "layout.cu")]
    rows, raw = [], []
    for repo, commit, root, src, flags in work:
        r = run_one(src, root, "sm_90a", flags, args.cap, env)
        found = r["output"].splitlines()
        errors = [ln for ln in found if "error: [poll-no-acquire]" in ln]
        starts = [ln for ln in found if "[sync-scope]" in ln and "a start barrier" in ln]
        rel = src.relative_to(root) if root in src.parents else Path(src.name)
        rows.append((repo, commit, str(rel), "sm_90a", "compiled" if r["compiled"] else f"not compiled: {r['why']}",
                     len(errors), ";".join(sorted({ln.split(": error", 1)[0].rsplit(":", 1)[-1] for ln in errors})),
                     len(starts), r["coverage"]))
        raw.append(f"### {repo}@{commit[:12]} {rel} sm_90a rc={r['rc']} {r['seconds']} s\n"
                   f"$ (cd {_shown(str(root), scratch)}) {_shown(' '.join(r['cmd']), scratch)}\n"
                   f"{_shown(r['output'], scratch)}\n")
        print(f"{rel}: {rows[-1][4]}, {len(errors)} poll-no-acquire, {len(starts)} start barrier(s)", flush=True)
    for name, text in {**FLASHINFER_TUS, **SPDLOG_STANDIN}.items():
        raw.append(f"### (written by this script) {name}\n{text}\n")
    head = "repository\tcommit\tsource\ttarget\tresult\tpoll-no-acquire errors\tat lines\tstart barriers (info)\tcoverage\n"
    (args.out / "nvidia-polls.tsv").write_text(head + "".join("\t".join(map(str, r)) + "\n" for r in rows))
    (args.out / "nvidia-raw.txt").write_text("".join(raw))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("amd", "nvidia"), required=True)
    ap.add_argument("--mirror", type=Path, default=Path("/work/.mirror"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sets", default="debian,compat", help="AMD header sets to try (debian, compat)")
    ap.add_argument("--archs", default=",".join(ARCHS))
    ap.add_argument("--cap", type=float, default=600.0, help="seconds per build before it is cut")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default="", help="a substring of the AMD source names to keep")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    with tempfile.TemporaryDirectory(prefix="hz-public-sources-") as scratch:
        (amd if args.part == "amd" else nvidia)(args, env, scratch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
