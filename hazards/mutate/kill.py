"""The kill loop: which synchronization points the user's test can see, mutant by mutant.

Each mutant is built in a scratch copy, judged statically, then run by the user's test through
the engine. Each mutant ends as exactly one of `Fate`: killed-static (the early-clobber lint
flags what the original passes), killed (a run hung, faulted or mismatched: the run's evidence
is kept), survived (no failure in n runs: its per-run upper bound), did-not-build,
timed-out-build, not-judged (every run an infrastructure error) or not-run (the budget ended
first). The user's files are never written: the folder `root` is copied once into a scratch
folder, each mutant gets a hard-linked copy of it with only its file rewritten (a new inode),
and everything is removed at the end. Every mutant's runs are a campaign of kind `mutate` in
the store, its spec holding the mutant (id, operator, line, description, diff) and its fate.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import enum
import filecmp
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from hazards.engine.errors import NotJudged, UserError
from hazards.engine.evidence import launches_of
from hazards.engine.loop import WorkItem
from hazards.engine.proctree import communicate_or_kill_group, kill_whole_group, start_in_group
from hazards.engine.stats import describe_rate, format_rate
from hazards.mutate.mutants import Mutant

KIND = "mutate"
T = TypeVar("T")
_IGNORED_NAMES = shutil.ignore_patterns(".git", ".hazards", "__pycache__", "*.pyc")


def _ignored(folder: str, entries: list[os.DirEntry]) -> set[str]:
    """What the scratch copy leaves out: the patterns above, and named pipes, sockets and
    devices (nothing a build reads; copying a named pipe's contents would wait forever)."""
    special = {e.name for e in entries
               if not (e.is_file(follow_symlinks=False) or e.is_dir(follow_symlinks=False) or e.is_symlink())}
    return set(_IGNORED_NAMES(folder, [e.name for e in entries])) | special


class Fate(str, enum.Enum):
    """How one mutant ended."""

    KILLED_STATIC = "killed-static"
    KILLED = "killed"
    SURVIVED = "survived"
    DID_NOT_BUILD = "did-not-build"
    TIMED_OUT_BUILD = "timed-out-build"
    NOT_JUDGED = "not-judged"
    NOT_RUN = "not-run"


KILLED = (Fate.KILLED_STATIC, Fate.KILLED)
# Mutants the loop could not look at: a score over the judged ones says nothing about them, so
# they keep the command from passing. A mutant that did not build is no program, not a gap.
UNJUDGED = (Fate.NOT_JUDGED, Fate.NOT_RUN, Fate.TIMED_OUT_BUILD)


@dataclasses.dataclass
class KillConfig:
    """What the kill loop runs. Commands are shell lines; `{dir}` is the mutant's copy of
    `root`, `{src}` its mutated file, `{out}` a folder for the build's output."""

    root: Path
    test: str
    build: str | None = None
    budget_s: float = 600.0
    timeout_s: float = 60.0
    max_runs: int = 50
    build_timeout_s: float = 300.0
    jobs: int = max(1, os.cpu_count() or 1)
    static: bool = True


@dataclasses.dataclass
class MutantResult:
    mutant: Mutant
    fate: Fate
    evidence: str = ""
    runs: int = 0
    failures: int = 0
    bound: str = ""
    campaign_id: int | None = None
    launches: int = 0  # the launches its judged runs made (as the test reported them; 1 a run otherwise)

    def as_json(self, text: str) -> dict[str, Any]:
        return {**self.mutant.as_json(text), "fate": self.fate.value, "evidence": self.evidence, "runs": self.runs,
                "failures": self.failures, "launches": self.launches, "bound": self.bound,
                "campaign": self.campaign_id}


def _fill(template: str, **values: str) -> str:
    try:
        return template.format(**{k: shlex.quote(v) for k, v in values.items()})
    except (KeyError, IndexError, ValueError) as e:
        raise UserError(f"command {template!r}: only {{dir}}, {{src}} and {{out}} may be filled in ({e})") from None


def check_config(cfg: KillConfig, sources: list[Path]) -> None:
    """One-line UserErrors for what cannot work, before anything runs."""
    if not cfg.root.is_dir():
        raise UserError(f"--root {cfg.root} is not a folder")
    for src in sources:
        try:
            src.resolve().relative_to(cfg.root.resolve())
        except ValueError:
            raise UserError(f"{src} is not inside --root {cfg.root}: the scratch copy would not hold it") from None
    for tmpl in (cfg.test, cfg.build or ""):
        _fill(tmpl, dir="d", src="s", out="o")
    if not cfg.test.strip():
        raise UserError("--test is empty")
    if not cfg.budget_s > 0 or not cfg.timeout_s > 0 or cfg.max_runs < 1:
        raise UserError("--budget and --timeout must be > 0 and --runs >= 1")


# The most --root may hold (what the copy takes, ignored names aside): the default root is the
# first source's folder, which for a kernel in a home folder is the whole home (caches, envs).
MAX_ROOT_BYTES = 8 << 30
MAX_ROOT_FILES = 500_000


@dataclasses.dataclass
class RootListing:
    """One walk of --root: what its scratch copy holds, in the order the copy makes it (each
    folder before what it holds, as shutil.copytree would), and what that copy takes. Each
    entry is (kind, path relative to the root, why it could not be listed): kind is "folder",
    "file" (a regular file), "link" (a symbolic link, copied as one) or "unlisted" (a folder
    that could not be listed: the copy stops there with that error, as copytree's would)."""

    entries: list[tuple[str, Path, OSError | None]] = dataclasses.field(default_factory=list)
    size: int = 0  # bytes of the regular files
    files: int = 0  # regular files and links to anything but a folder (what os.walk calls files)

    def regular_files(self) -> list[Path]:
        return [rel for kind, rel, _ in self.entries if kind == "file"]


def list_root(root: Path) -> RootListing:
    """The listing of `root`, a UserError before anything is copied when it is too big to copy
    (the limits above), or larger than 80% of what the scratch folder's file system has free
    (a /tmp in memory fills the machine's RAM)."""
    listing = RootListing()

    def walk(rel: Path) -> None:
        folder = str(root / rel)
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError as e:
            listing.entries.append(("unlisted", rel, e))
            return
        listing.entries.append(("folder", rel, None))
        skip = _ignored(folder, entries)
        for entry in entries:
            if entry.name in skip:
                continue
            if entry.is_symlink():
                listing.entries.append(("link", rel / entry.name, None))
                listing.files += not entry.is_dir()
            elif entry.is_dir(follow_symlinks=False):
                walk(rel / entry.name)
            else:
                listing.entries.append(("file", rel / entry.name, None))
                try:
                    listing.size += entry.stat(follow_symlinks=False).st_size
                except OSError:  # gone since it was listed: the copy says so
                    continue
                listing.files += 1
        if listing.size > MAX_ROOT_BYTES or listing.files > MAX_ROOT_FILES:
            raise UserError(f"--root {root} holds more than {MAX_ROOT_BYTES >> 30} GiB or {MAX_ROOT_FILES:,} files "
                            "to copy for the mutants: give --root the folder the build needs")

    walk(Path())
    free = shutil.disk_usage(tempfile.gettempdir()).free
    if listing.size > 0.8 * free:
        raise UserError(f"--root {root} holds {listing.size / 2**30:.1f} GiB, more than 80% of the {free / 2**30:.1f} "
                        f"GiB free in {tempfile.gettempdir()} (the scratch copy's home): give --root the folder the "
                        "build needs, or TMPDIR a roomier one")
    return listing


def replicate(listing: RootListing, src: Path, dst: Path, copy_file: Callable[[str, str], Any]) -> None:
    """`dst` made from `src` by its listing, without walking it again: folders made, files
    copied by `copy_file` (shutil.copy2, or os.link for a hard-linked copy), links copied as
    links, each folder's times and mode copied last. A failure raises at once what
    shutil.copytree would have raised for it: a shutil.Error of (source, destination, why),
    or for `src` itself the OSError that listing it raised.

    Not copytree itself: it lists every folder it copies (with an ignore callback too), so root
    would be listed twice (the size limits hold before the first byte is copied) and base once
    more for each mutant's copy."""
    made = []
    for kind, rel, error in listing.entries:
        s, d = str(src / rel), str(dst / rel)
        try:
            if kind == "unlisted":
                if rel == Path():
                    raise error
                raise shutil.Error([(s, d, str(error))])
            if kind == "folder":
                os.makedirs(d)
                made.append((s, d))
            elif kind == "link":
                os.symlink(os.readlink(s), d)
                shutil.copystat(s, d, follow_symlinks=False)
            else:
                copy_file(s, d)
        except shutil.Error:
            raise
        except OSError as why:
            if rel == Path():
                raise
            raise shutil.Error([(s, d, str(why))]) from None
    for s, d in reversed(made):  # after what they hold: a copy into a folder changes its times
        try:
            shutil.copystat(s, d)
        except OSError as why:
            raise shutil.Error([(s, d, str(why))]) from None


class Scratch:
    """The scratch folder: `base` (a copy of root) and one hard-linked copy per mutant, all
    made from one listing of root."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self._listing = list_root(self.root)
        self.dir = Path(tempfile.mkdtemp(prefix="hazards-mutate-"))
        self.base = self.dir / "base"
        try:
            replicate(self._listing, self.root, self.base, shutil.copy2)
        except (OSError, shutil.Error) as e:  # an unreadable file: one line, and no scratch folder left
            self.close()
            first = e.args[0][0] if isinstance(e, shutil.Error) and e.args and e.args[0] else None
            why = f"{first[0]}: {first[2]}" if first else str(e)
            raise UserError(f"cannot copy --root {self.root} into a scratch folder ({why})") from None
        self._seen = {}  # each shared file's (size, mtime): a change is a write into every copy
        for rel in self._listing.regular_files():
            st = os.lstat(self.base / rel)
            self._seen[rel] = (st.st_size, st.st_mtime_ns)

    def written_in_place(self) -> list[Path]:
        """Files of `base`, shared as hard links by every copy, that a build or test wrote
        into in place (opened for writing rather than replaced) since the last look, and that
        no longer hold the user's bytes: every copy saw that write."""
        changed = []
        for rel, seen in self._seen.items():
            try:
                st = os.lstat(self.base / rel)
            except OSError:
                continue
            if (st.st_size, st.st_mtime_ns) == seen:
                continue
            self._seen[rel] = (st.st_size, st.st_mtime_ns)
            try:
                same = filecmp.cmp(self.base / rel, self.root / rel, shallow=False)
            except OSError:
                same = False
            if not same:
                changed.append(rel)
        return changed

    def restore(self, rels: list[Path]) -> None:
        """The user's bytes back into shared files (in place: every copy sees them again)."""
        for rel in rels:
            shutil.copyfile(self.root / rel, self.base / rel)
            st = os.lstat(self.base / rel)
            self._seen[rel] = (st.st_size, st.st_mtime_ns)

    def copy_with(self, name: str, rel: Path, text: str | None) -> Path:
        dest = self.dir / name
        replicate(self._listing, self.base, dest, os.link)
        if text is not None:
            target = dest / rel
            target.unlink()  # a new inode: the hard link to base (and to nothing of the user's) stays intact
            target.write_text(text, encoding="utf-8", errors="surrogateescape")
        (dest / ".hazards-out").mkdir(exist_ok=True)
        return dest

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class Builds:
    """The build commands in flight, each in its own process group: an interruption of the
    kill loop (Ctrl-C, a stop signal: the main thread's) ends every one of them at once, and
    no new one starts (the worker threads running them never see the interruption)."""

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._running: set[subprocess.Popen] = set()
        self.stopped = False

    def start(self, cmd: str, folder: Path) -> subprocess.Popen:
        with self._mu:
            if self.stopped:
                raise KeyboardInterrupt("the kill loop was interrupted")
            proc = start_in_group(["bash", "-c", cmd], cwd=folder, text=True, errors="replace")
            self._running.add(proc)
            return proc

    def finished(self, proc: subprocess.Popen) -> None:
        with self._mu:
            self._running.discard(proc)

    def stop(self) -> None:
        with self._mu:
            self.stopped = True
            for proc in self._running:
                if proc.returncode is None:  # not reaped: its pid is still the group's id
                    kill_whole_group(proc)


def _build(cfg: KillConfig, folder: Path, src: Path, builds: Builds | None = None) -> tuple[Fate | None, str]:
    """None when it built (or there is nothing to build); a build fate and the reason otherwise.
    The build runs in its own process group, killed whole on a timeout or an interruption
    (killing only its shell would leave the compiler it started running)."""
    if not cfg.build:
        return None, ""
    cmd = _fill(cfg.build, dir=str(folder), src=str(src), out=str(folder / ".hazards-out"))
    builds = builds or Builds()
    proc = builds.start(cmd, folder)
    try:
        stdout, stderr = communicate_or_kill_group(proc, cfg.build_timeout_s)
    except subprocess.TimeoutExpired:
        return Fate.TIMED_OUT_BUILD, f"the build ran past {cfg.build_timeout_s:g} s"
    finally:
        builds.finished(proc)
    if proc.returncode != 0:
        last = (stderr.strip() or stdout.strip()).splitlines()[-1:]
        said = f": {last[0][:200]}" if last else " (it printed nothing)"
        return Fate.DID_NOT_BUILD, f"build exit {proc.returncode}{said}"
    return None, ""


def _content_key(rel: Path, mutated: str, cfg: KillConfig) -> str:
    """Builds are cached by content: the same file (its path in the root) with the same
    mutated text and build command builds once. The path is part of it: two identical files
    (a header vendored twice) mutated alike are two different trees."""
    return hashlib.sha256((rel.as_posix() + "\0" + mutated + "\0" + (cfg.build or "")).encode(
        "utf-8", "surrogateescape")).hexdigest()


def _lint_errors(text: str, path: str) -> list[str]:
    from hazards.static.asm_lint import lint_text

    return [f"{f.check} line {f.line}: {f.message}" for f in lint_text(text, path) if f.fails]


def _item(cfg: KillConfig, folder: Path, src: Path, name: str) -> WorkItem:
    cmd = _fill(cfg.test, dir=str(folder), src=str(src), out=str(folder / ".hazards-out"))
    return WorkItem(target=name, kind="command", argv=("bash", "-c", cmd), cwd=str(folder), timeout_s=cfg.timeout_s)


def kill_loop(frame: Any, cfg: KillConfig, mutants: list[tuple[Mutant, str]],
              say: Callable[[str], None] = lambda s: None) -> list[MutantResult]:
    """Judge every mutant (with its original file's text) within cfg.budget_s, on the leased
    campaign frame `frame`. The unmutated sources must build and pass the test first."""
    t0 = time.monotonic()
    scratch = Scratch(cfg.root)
    try:
        return _judge_all(frame, cfg, mutants, scratch, t0, say)
    finally:
        scratch.close()


def _judge_all(frame: Any, cfg: KillConfig, mutants: list[tuple[Mutant, str]], scratch: Scratch, t0: float,
               say: Callable[[str], None]) -> list[MutantResult]:
    results: dict[tuple[str, str], MutantResult] = {}
    rel = {m.key: Path(m.path).resolve().relative_to(scratch.root) for m, _ in mutants}

    # Static first (no build needed): the lint judges the mutated text against the original's.
    todo: list[tuple[Mutant, str]] = []
    lint_before: dict[str, set[str]] = {}
    for m, text in mutants:
        if cfg.static:
            before = lint_before.setdefault(m.path, set(_lint_errors(text, m.path)))
            new = [e for e in _lint_errors(m.apply(text), m.path) if e not in before]
            if new:
                results[m.key] = MutantResult(m, Fate.KILLED_STATIC, evidence=new[0])
                continue
        todo.append((m, text))

    # Builds in parallel, the original's among them, one per distinct mutated text (cached
    # by content): the original's build no longer waits alone before the mutants'.
    first = mutants[0][0]  # the command refuses a source with no mutant before this
    original = scratch.copy_with("original", rel[first.key], None)
    original_src = original / rel[first.key]  # {src}: a file, as for a mutant
    folders: dict[tuple[str, str], Path] = {}
    built: dict[tuple[str, str], tuple[Fate | None, str]] = {}
    content = {m.key: _content_key(rel[m.key], m.apply(text), cfg) for m, text in todo}
    unique: dict[str, tuple[Mutant, str]] = {}  # content key -> the first mutant with that text
    for m, text in todo:
        unique.setdefault(content[m.key], (m, text))

    def build_one(pair: tuple[Mutant, str] | None) -> None:
        if pair is None:
            built[("", "original")] = _build(cfg, original, original_src, builds)
            return
        m, text = pair
        key = m.key
        folders[key] = scratch.copy_with(f"m-{content[key][:16]}", rel[key], m.apply(text))
        built[key] = _build(cfg, folders[key], folders[key] / rel[key], builds)

    builds = Builds()
    pool = cf.ThreadPoolExecutor(max_workers=max(1, cfg.jobs))
    try:
        list(pool.map(build_one, [None, *unique.values()]))
    except BaseException:  # Ctrl-C, a stop signal: the builds in flight end now, not when they finish
        builds.stop()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    shared = scratch.written_in_place()
    if shared:  # the builds ran at once, each seeing the others' writes: nothing built can be trusted
        raise UserError(f"the build command wrote into {shared[0]} in place, a file of --root that every "
                        "mutant's copy shares (hard links), so the parallel builds could mix: make it write "
                        "new files (under {out}, or remove a file before writing it)")
    fate, why = built.pop(("", "original"))
    if fate is not None:
        raise UserError(f"the unmutated sources do not build ({why}): fix the build command first")
    for m, _ in todo:  # duplicates of an already built text share its folder and fate
        key = m.key
        if key not in built:
            first_key = unique[content[key]][0].key
            folders[key], built[key] = folders[first_key], built[first_key]
    say(f"{len(unique)} distinct mutant builds, {sum(1 for f, _ in built.values() if f is not None)} did not build")

    # The original: its test must pass, or no mutant can be judged.
    base_id = frame.create(KIND, {"baseline": True, "test": cfg.test, "build": cfg.build, "root": str(cfg.root)},
                           name="mutate baseline")
    t_run = time.monotonic()
    base = frame.repeat(item=_item(cfg, original, original_src, "mutate:original"), n=2, timeout=cfg.timeout_s,
                        until_fail=True, campaign_id=base_id)
    per_run_s = max(0.05, (time.monotonic() - t_run) / max(1, base.counts.get("clean", 0) or 1))
    _restore_shared(scratch, say)
    bad = {k: v for k, v in base.counts.items() if k != "clean" and v}
    failed = next((r.result for r in frame.store.iter_runs(base_id) if r.result.outcome.value != "clean"), None)
    why = " ".join(((failed.reason if failed else "") or base.stop_reason or "no reason stored").split())[:300]
    if bad and set(bad) == {"error"}:  # nothing ran its work (no usable GPU, a missing program): not the test's fault
        raise NotJudged(f"could not judge: the test's runs on the unmutated sources ended only in error "
                        f"({why}; campaign {base_id}): no mutant can be judged")
    if bad:
        raise UserError(f"the test is not clean on the unmutated sources ({bad}: {why}; campaign {base_id}): "
                        "a mutant can only be judged against a test that passes")
    say(f"original: builds, test clean ({per_run_s:.2f} s a run)")

    # The order the budget is spent in (hypothesis chooses it): a budget smaller than the set
    # samples every operator, file and region rather than the top of the file.
    todo = spending_order(todo, lambda pair: (pair[0].operator, pair[0].path, pair[0].line))

    # Runs: the budget left, shared by the mutants left to run.
    runnable = [(m, t) for m, t in todo if built[m.key][0] is None]
    for m, text in todo:
        key = m.key
        if built[key][0] is not None:
            results[key] = MutantResult(m, built[key][0], evidence=built[key][1])
    for k, (m, text) in enumerate(runnable):
        key = m.key
        left = cfg.budget_s - (time.monotonic() - t0)
        share = left / (len(runnable) - k)
        n = min(cfg.max_runs, int(share / per_run_s))
        if n < 1:
            results[key] = MutantResult(m, Fate.NOT_RUN, evidence="the budget ended first")
            continue
        spec = {"mutant": m.as_json(text), "test": cfg.test, "build": cfg.build, "session": base_id}
        cid = frame.create(KIND, spec, name=f"mutate {m.id}")
        folder = folders[key]
        # n runs fit its share at the original's pace; a mutant that slows every run down
        # (without hanging) still stops when the whole budget ends, plus one timeout so that
        # a run in flight then is judged (a hang in it kills the mutant; cut short, unjudged,
        # it would leave the mutant 'survived' on the runs before it)
        summary = frame.repeat(item=_item(cfg, folder, folder / rel[key], f"mutate:{m.id}"), n=n,
                               timeout=cfg.timeout_s, until_fail=True, campaign_id=cid,
                               budget_s=left + cfg.timeout_s)
        _restore_shared(scratch, say)  # the next mutant's runs start from the user's files
        res = _fate_of(frame, m, cid, summary.counts)
        frame.store.update_campaign_spec(cid, {**spec, "fate": res.fate.value, "evidence": res.evidence,
                                               "bound": res.bound, "runs": res.runs, "launches": res.launches})
        results[key] = res
        say(f"{m.id}: {res.fate.value} {res.evidence or res.bound}")
    ordered = [results[m.key] for m, _ in mutants]
    # The session's summary on its baseline campaign: `hazards report` of any of its campaigns
    # shows the score and every survivor from it (mutants killed statically, or that did not
    # build, have no campaign of their own).
    base_spec = frame.store.campaign(base_id).spec
    texts = {m.key: text for m, text in mutants}
    frame.store.update_campaign_spec(base_id, {**base_spec, "mutation": session_summary(ordered, texts)})
    return ordered


def _restore_shared(scratch: Scratch, say: Callable[[str], None]) -> None:
    """The runs run one at a time: a file of the root that the test wrote into in place gets
    the user's bytes back before the next mutant's runs, as if each had a copy of its own."""
    written = scratch.written_in_place()
    if written:
        scratch.restore(written)
        say(f"note: the test wrote into {written[0]} in place (a file every mutant's copy shares); "
            "restored after each mutant's runs")


def session_summary(results: list[MutantResult], texts: dict[tuple[str, str], str]) -> dict[str, Any]:
    """The score and every mutant's fate, as the store keeps it for `hazards report`: each
    mutant's id, file, line, description, fate, evidence, runs, launches and bound; the diff
    of each survivor (text fields JSON-safe: `mutants.json_text`)."""
    killed, judged = score(results)
    rows = []
    for r in results:
        row = {k: v for k, v in r.as_json(texts[r.mutant.key]).items()
               if r.fate is Fate.SURVIVED or not k.startswith("diff")}
        rows.append(row)
    return {"score": {"killed": killed, "judged": judged, "mutants": len(results)}, "mutants": rows}


def _fate_of(frame: Any, m: Mutant, cid: int, counts: dict[str, int]) -> MutantResult:
    """A judged mutant's fate from its campaign's runs: killed with the first failing run's
    reason, survived with its per-launch bound (per run when the test reports no launches),
    or not judged."""
    failures = sum(counts.get(o, 0) for o in ("hang", "fault", "mismatch"))
    judged = sum(v for o, v in counts.items() if o != "error")
    runs = [r.result for r in frame.store.runs(cid)]
    launches = sum(launches_of(r)[0] for r in runs)
    if failures:
        failing = next((r for r in runs if r.outcome.value in ("hang", "fault", "mismatch")), None)
        why = f"{failing.outcome.value}: {failing.reason}" if failing is not None else "a failing run"
        return MutantResult(m, Fate.KILLED, evidence=why, runs=judged, failures=failures, campaign_id=cid,
                            launches=launches)
    if not runs:  # its first run was still going when the budget ended (cut short, not stored)
        return MutantResult(m, Fate.NOT_RUN, evidence="the budget ended during its first run", campaign_id=cid)
    if judged == 0:
        return MutantResult(m, Fate.NOT_JUDGED, evidence=f"every run an error ({counts})", campaign_id=cid)
    if launches > judged:  # the test reported its launches (HZ_RESULT "launches"): bound each launch
        bound = (f"0 failures in {launches} launches ({judged} run{'s' if judged != 1 else ''}): "
                 f"per-launch rate {format_rate(0, launches)}")
    else:
        bound = describe_rate(0, judged)
    return MutantResult(m, Fate.SURVIVED, runs=judged, bound=bound, campaign_id=cid, launches=launches)


def spending_order(items: list[T], key: Callable[[T], tuple[str, str, int]], *, examples: int = 60) -> list[T]:
    """The order the budget is spent in, chosen by hypothesis: a round-robin over the
    operators (key[0]) in a drawn order, each operator's mutants in a drawn permutation, so
    that whatever the budget, the first k mutants cover min(k, operators) operators. Among
    such orders hypothesis' targeted search (`hypothesis.target`) looks for the one whose
    every prefix also spreads widest over files (key[1]) and regions of the source (key[2],
    the line). The draw is deterministic (`derandomize`, no example database: nothing is
    written) and nothing is shrunk (mutants are already minimal)."""
    if len(items) < 2:
        return list(items)
    from hypothesis import HealthCheck, Phase, given, settings, strategies as st, target

    groups: dict[str, list[T]] = {}
    for it in items:
        groups.setdefault(key(it)[0], []).append(it)
    names = list(groups)
    lines = [key(it)[2] for it in items]
    span = max(1, max(lines) - min(lines))
    best: list[tuple[float, list[T]]] = []

    def spread(order: list[T]) -> float:
        """Summed over every prefix: distinct files, plus distinct tenths of the line range."""
        files: set[str] = set()
        tenths: set[tuple[str, int]] = set()
        total = 0.0
        for it in order:
            _, path, line = key(it)
            files.add(path)
            tenths.add((path, 10 * (line - min(lines)) // span))
            total += len(files) + len(tenths)
        return total

    @settings(max_examples=examples, database=None, derandomize=True, deadline=None,
              phases=[Phase.generate, Phase.target], suppress_health_check=list(HealthCheck))
    @given(st.permutations(names), st.tuples(*(st.permutations(groups[n]) for n in names)))
    def draw(name_order: list[str], inner: tuple[list[T], ...]) -> None:
        queues = {n: list(q) for n, q in zip(names, inner)}
        order: list[T] = []
        while len(order) < len(items):
            for n in name_order:
                if queues[n]:
                    order.append(queues[n].pop(0))
        score_ = spread(order)
        target(score_)
        if not best or score_ > best[0][0]:
            best[:] = [(score_, order)]

    # hypothesis keeps caches in ./.hypothesis even without a database: the user's folder
    # must stay untouched, so its home is a temporary folder for this one draw.
    import hypothesis.configuration as home_config

    before = vars(home_config).get("__hypothesis_home_directory")
    with tempfile.TemporaryDirectory(prefix="hazards-hypothesis-") as home:
        home_config.set_hypothesis_home_dir(home)
        try:
            draw()
        finally:
            home_config.set_hypothesis_home_dir(before)
    return best[0][1]


def score(results: list[MutantResult]) -> tuple[int, int]:
    """(killed, judged): mutants that did not build, were not judged or not run are left out."""
    judged = [r for r in results if r.fate in (*KILLED, Fate.SURVIVED)]
    return sum(1 for r in judged if r.fate in KILLED), len(judged)
