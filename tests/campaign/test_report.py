"""The HTML report: real PNG figures, the telemetry table, comparison with the previous
campaign, a markdown summary, and a page that opens in headless Chromium without errors."""
from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.image as mpimg
import pytest
from campaign_fakes import synthetic_soaks

from hazards.engine.report import build_report, render_markdown, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
IMG_RE = re.compile(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def _pngs(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in IMG_RE.findall(html)]


def test_synthetic_campaign_renders_html_whose_figures_are_real_pngs(store, tmp_path):
    _, cur = synthetic_soaks(store)
    out = tmp_path / "report.html"
    write_report(store, cur, out)
    html = out.read_text()
    pngs = _pngs(html)
    assert len(pngs) == 5  # outcomes, rates, trend, time to failure, kernel time
    for png in pngs:
        assert png.startswith(PNG_MAGIC)
        img = mpimg.imread(io.BytesIO(png), format="png")
        assert img.ndim == 3 and img.shape[0] > 50 and img.shape[1] > 50
        assert img.std() > 0.01  # not a blank canvas
    assert "pipeline/fixed" in html and "ordering/fixed" in html


def test_report_flags_new_signatures_rate_rises_and_a_hardware_suspect_gpu(store):
    prev, cur = synthetic_soaks(store)
    rep = build_report(store, cur, figures=False)
    assert rep.previous_id == prev
    new = [s for s in rep.signatures if s["new"]]
    assert sorted((s["target"], s["variant"], s["outcome"]) for s in new) == [
        ("ordering", "fixed", "hang"), ("pipeline", "fixed", "mismatch")]
    rose = [c for c in rep.changes if c["direction"] == "rose"]
    assert [(c["target"], c["variant"]) for c in rose] == [("pipeline", "fixed")]
    # every failure of the clean variants is on GPU-bbbb... but the canary fails on both,
    # so the failures are not confined to one GPU: no hardware hint
    assert rep.hint is None
    gpus = {g.uuid: g for g in rep.gpus}
    assert gpus["GPU-bbbb"].xids == [48] and gpus["GPU-bbbb"].ecc_corrected == 1
    assert gpus["GPU-aaaa"].runs + gpus["GPU-bbbb"].runs == 180


def test_hardware_suspect_hint_appears_when_failures_are_confined_to_one_gpu(store):
    from hazards.engine.outcome import Outcome, RunResult

    cid = store.create_campaign("soak", {})
    for i in range(40):
        uuid = "GPU-aaaa" if i % 2 else "GPU-bbbb"
        fail = uuid == "GPU-bbbb" and i % 4 == 0
        tel = {"uuid": uuid, "xids": [79] if i == 0 else []}
        store.record_run(cid, RunResult(Outcome.FAULT if fail else Outcome.CLEAN, "x", target="t",
                                        evidence={"telemetry": tel}, gpu_uuid=uuid, duration_s=0.1))
    rep = build_report(store, cid, figures=False)
    assert rep.hint and "GPU-bbbb" in rep.hint and "Xid 79" in rep.hint
    assert rep.hint in render_markdown(rep)


def test_markdown_summary_has_rates_with_intervals_and_the_comparison(store):
    prev, cur = synthetic_soaks(store)
    md = render_markdown(build_report(store, cur, figures=False))
    assert md.startswith(f"## hazards soak campaign {cur}")
    row = next(line for line in md.splitlines() if line.startswith("| pipeline/fixed |"))
    assert re.search(r"\| clean \|.*\| 33% \(95% CI \d+%–\d+%\) \| regressed \|$", row), row
    canary = next(line for line in md.splitlines() if line.startswith("| pipeline/broken |"))
    assert canary.startswith("| pipeline/broken | detect |") and canary.endswith("| detected |")
    assert (f"2 failure signature(s) never seen before in the store; compared with campaign {prev}: "
            "1 significant rate change(s) (Holm-corrected).") in md
    assert "NEW hang in ordering/fixed" in md


def test_empty_campaign_renders_without_figures(store, tmp_path):
    cid = store.create_campaign("check", {})
    out = tmp_path / "empty.html"
    write_report(store, cid, out)
    html = out.read_text()
    assert "No runs stored in this campaign." in html and not _pngs(html)


# -- headless Chromium -------------------------------------------------------------------

COLLECTOR = """<script>
window.__hzErrors = [];
window.addEventListener('error', function (e) {
  window.__hzErrors.push(e.message || ('failed to load ' + ((e.target && (e.target.src || e.target.href)) || '?')));
}, true);
var __hzConsoleError = console.error;
console.error = function () { window.__hzErrors.push(Array.prototype.join.call(arguments, ' ')); __hzConsoleError.apply(console, arguments); };
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var broken = imgs.filter(function (i) { return !i.complete || i.naturalWidth === 0; }).length;
  var links = Array.prototype.slice.call(document.querySelectorAll('a.artifact'));
  var unreachable = [];
  // every artifact link must load (file URLs: chromium runs with --allow-file-access-from-files)
  Promise.all(links.map(function (a) {
    return fetch(a.href).then(function (r) { if (!r.ok && r.status !== 0) unreachable.push(a.href + ' ' + r.status); })
                        .catch(function (e) { unreachable.push(a.href + ' ' + e); });
  })).then(function () {
    document.documentElement.setAttribute('data-hz-result', JSON.stringify(
      {errors: window.__hzErrors, images: imgs.length, broken: broken, links: links.length, unreachable: unreachable}));
  });
});
</script>"""


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _open_in_chromium(page, tmp_path) -> dict:
    """Load `page` (with the error collector injected first) and return what it collected:
    script errors, console errors, images that did not load, and the artifact links that
    did not load. The probe lies beside the page, so relative links resolve as they would."""
    html = page.read_text()
    probe = page.parent / ("probe-" + page.name)
    probe.write_text(html.replace("<head>", "<head>\n" + COLLECTOR, 1))
    profile = tmp_path / "chromium-profile"
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
           "--enable-logging=stderr", "--v=0", "--allow-file-access-from-files", "--virtual-time-budget=10000",
           "--dump-dom", probe.as_uri()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    m = re.search(r"data-hz-result=\"([^\"]*)\"", r.stdout)
    assert m, f"chromium did not finish the page (rc {r.returncode}): {r.stderr[-2000:]}"
    result = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    result["console"] = [ln for ln in r.stderr.splitlines() if "CONSOLE" in ln and "probe-" in ln]
    result["dom"] = r.stdout
    return result


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (scripts/setup.sh installs it: apt-get install chromium)")
def test_report_opens_in_headless_chromium_without_console_errors(store, tmp_path):
    _, cur = synthetic_soaks(store)
    page = tmp_path / "report.html"
    write_report(store, cur, page)
    result = _open_in_chromium(page, tmp_path)
    assert result["errors"] == [] and result["console"] == []
    assert result["images"] == 5 and result["broken"] == 0


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (scripts/setup.sh installs it: apt-get install chromium)")
def test_chromium_probe_does_catch_script_errors_and_broken_images(tmp_path):
    page = tmp_path / "bad.html"
    (tmp_path / "there.txt").write_text("x")
    page.write_text("<!DOCTYPE html><html><head><title>bad</title></head><body>"
                    "<img src=\"data:image/png;base64,AAAA\"><script>undefinedFunction()</script>"
                    "<a class=\"artifact\" href=\"there.txt\">ok</a><a class=\"artifact\" href=\"gone/hang.md\">gone</a>"
                    "</body></html>")
    result = _open_in_chromium(page, tmp_path)
    assert result["broken"] == 1
    assert any("undefinedFunction" in e for e in result["errors"])
    assert result["links"] == 2 and len(result["unreachable"]) == 1 and "gone/hang.md" in result["unreachable"][0]


def test_cli_report_writes_html_markdown_and_junit(tmp_path, capsys):
    from hazards.cli import main
    from hazards.engine.store import Store

    db = tmp_path / "r.db"
    with Store(db) as s:
        _, cur = synthetic_soaks(s)
    out, junit = tmp_path / "rep.html", tmp_path / "rep.xml"
    rc = main(["report", "--store", str(db), "-o", str(out), "--markdown", "--junit", str(junit), "--last", "5"])
    captured = capsys.readouterr()
    assert rc == 0 and out.is_file() and junit.is_file()
    assert captured.out.startswith(f"## hazards soak campaign {cur} (night 1)")
    assert len(_pngs(out.read_text())) == 5


def test_cli_report_json_has_every_row_with_its_rate_and_verdict(tmp_path, capsys):
    import json

    from hazards.cli import main
    from hazards.engine.stats import format_rate
    from hazards.engine.store import Store

    db = tmp_path / "r.db"
    with Store(db) as s:
        _, cur = synthetic_soaks(s)
    rc = main(["report", "--store", str(db), "-o", str(tmp_path / "rep.html"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["campaign"]["id"] == cur and out["report_html"].endswith("rep.html")
    row = next(r for r in out["rows"] if (r["target"], r["variant"]) == ("pipeline", "fixed"))
    assert row["verdict"] == "regressed" and row["rate_text"] == format_rate(row["failures"], row["judged"])
    assert main(["report", "--store", str(db), "--json", "--markdown"]) == 2


def test_cli_report_of_an_unknown_campaign_is_a_one_line_error(tmp_path, capsys):
    from hazards.cli import main
    from hazards.engine.store import Store

    db = tmp_path / "r.db"
    Store(db).close()
    rc = main(["report", "7", "--store", str(db), "-o", str(tmp_path / "x.html")])
    err = capsys.readouterr().err
    assert rc == 2 and err == f"hazards: error: no campaign 7 in {db} (it holds none)\n"
    assert not (tmp_path / "x.html").exists()
    rc = main(["report", "--store", str(tmp_path / "none.db")])
    assert rc == 2 and "no results store" in capsys.readouterr().err


# -- a report engineers open in the morning ------------------------------------------------

FLAKY = """import json, os, signal, sys, time
count = {count!r}
n = int(open(count).read()) + 1 if os.path.exists(count) else 1
open(count, "w").write(str(n))
print(f"run {{n}}: <b>output</b> | with a pipe", flush=True)
print(f"flaky: starting run {{n}}", file=sys.stderr, flush=True)
if n % 4 == 2:
    os.kill(os.getpid(), signal.SIGSEGV)
if n % 4 == 3:
    print("HZ_RESULT " + json.dumps({{"ok": False, "mismatched": 3}}))
    sys.exit(0)
if n == 5:
    time.sleep(60)
print("HZ_RESULT " + json.dumps({{"ok": True, "mismatched": 0}}))
"""
HREF_RE = re.compile(r'<a class="artifact" href="([^"]+)"')


@pytest.fixture(scope="module")
def repro_store(tmp_path_factory):
    """A store with two `hazards repro --keep-going` campaigns of a program that faults,
    mismatches and hangs (the hang read by the hang forensics: hang.md), made through the
    real command on the CPU."""
    from hazards.cli import main

    root = tmp_path_factory.mktemp("morning")
    prog = root / "flaky.py"
    prog.write_text(FLAKY.format(count=str(root / "count")))
    db = root / "store" / "results.db"
    for forensics in ("--forensics", "--no-forensics"):
        (root / "count").unlink(missing_ok=True)
        rc = main(["repro", "--keep-going", "-n", "6", "--timeout", "2", "--hang-budget", "5", forensics,
                   "--store", str(db), "--", sys.executable, str(prog)])
        assert rc == 1
    return db


def _artifact_links(page) -> list:
    from urllib.parse import unquote

    return [(page.parent / unquote(h)).resolve() for h in HREF_RE.findall(page.read_text())]


def test_every_failing_row_and_signature_links_its_artifacts_and_every_link_resolves(repro_store, tmp_path):
    from hazards.engine.store import Store

    with Store(repro_store, read_only=True) as store:
        page = tmp_path / "elsewhere" / "report.html"
        rep = write_report(store, 1, page)
        html = page.read_text()
    links = _artifact_links(page)
    assert links and all(p.exists() for p in links), [p for p in links if not p.exists()]
    run_dirs = {p for p in links if p.is_dir()}
    # the failing row links its failing runs, each signature its raw example's folder
    (row,) = rep.rows
    assert [a.outcome for a in row.linked] == ["fault", "mismatch", "hang"]
    assert {a.folder for a in row.linked} <= run_dirs
    assert {s["outcome"] for s in rep.signatures} == {"fault", "mismatch", "hang"}
    for s in rep.signatures:
        assert s["example"].folder in run_dirs and s["example"].reason
    names = {p.name for p in links}
    assert {"hang.md", "evidence.json", "stdout.log", "stderr.log", "repro-context.json"} <= names
    hang = next(s for s in rep.signatures if s["outcome"] == "hang")["example"]
    assert hang.files[0][0] == "hang report" and hang.files[0][1].name == "hang.md"
    # links are relative to the page: the page and the store's artifacts move together
    assert 'href="../' in html and "file://" not in html


def test_trends_are_over_dates_on_a_log_scale_with_intervals(store, monkeypatch):
    from hazards.engine import report_figures
    from hazards.engine.report import build_report as build

    prev, cur = synthetic_soaks(store)
    day = 86400.0
    for cid, when in ((prev, 1_700_000_000.0), (cur, 1_700_000_000.0 + 3 * day)):
        with store._write() as db:
            db.execute("UPDATE campaigns SET created = ? WHERE id = ?", (when, cid))
    figures = []
    monkeypatch.setattr(report_figures, "_png", lambda fig: figures.append(fig) or b"\x89PNG")
    rep = build(store, cur)
    pts = rep.trend["pipeline/fixed"]
    assert [(p.when, p.campaign_id, p.failures, p.judged) for p in pts] == [
        (1_700_000_000.0, prev, 0, 60), (1_700_000_000.0 + 3 * day, cur, 20, 60)]
    assert pts[0].ci()[0] == 0.0 and pts[0].ci()[1] > 0 and 0 < pts[1].ci()[0] < pts[1].rate < pts[1].ci()[1]
    ax = next(f.axes[0] for f in figures if "over time" in f.axes[0].get_title())
    import matplotlib.dates as mdates

    assert ax.get_yscale() == "log"
    lo, hi = ax.get_xlim()  # dates, not campaign ids
    assert lo <= mdates.date2num(__import__("datetime").datetime.fromtimestamp(1_700_000_000.0)) < hi
    assert hi - lo >= 3
    html = render_html_of(rep)
    assert "2023-11-14 22:13" in html and "2023-11-17 22:13" in html and "20/60" in html


def render_html_of(rep):
    from hazards.engine.report import render_html

    return render_html(rep)


def test_signatures_show_a_raw_example_and_when_they_were_first_and_last_seen_in_the_store(store):
    from hazards.engine.outcome import Outcome, RunResult

    t0 = 1_700_000_000.0
    first = store.create_campaign("run", {})
    store.record_run(first, RunResult(Outcome.HANG, "timed out after 7s", target="prog", started_at=t0))
    cur = store.create_campaign("run", {})
    store.record_run(cur, RunResult(Outcome.HANG, "timed out after 3s", target="prog", started_at=t0 + 500))
    store.record_run(cur, RunResult(Outcome.HANG, "timed out after 4s", target="prog", started_at=t0 + 900))
    rep = build_report(store, cur, figures=False)
    (sig,) = rep.signatures
    assert sig["message"] == "timed out after <n>s" and sig["count"] == 2  # this campaign's runs
    assert sig["example"].reason == "timed out after 3s" and sig["example"].seq == 1  # raw, not normalised
    assert (sig["first_seen"], sig["last_seen"]) == (t0, t0 + 900)  # the whole store's
    html = render_html_of(rep)
    assert "timed out after 3s" in html and "2023-11-14 22:13:20" in html


def test_run_context_is_stored_when_a_campaign_is_created_and_shown(store, fake_gpus, fake_nvml, monkeypatch):
    from hazards.engine.campaign import LeasedCampaign

    monkeypatch.setattr(sys, "argv", ["/venv/lib/python3/site-packages/hazards/__main__.py", "soak", "--name", "a b"])
    with LeasedCampaign(store, [_fake_lease("GPU-aaaa")]) as frame:
        cid = frame.create("soak", {})
    (session,) = store.campaign(cid).spec["sessions"]
    assert session["command"] == "hazards soak --name 'a b'"  # as typed, `python -m hazards` or not
    assert session["cwd"] and session["host"] and session["python"]
    assert session["git_describe"] is None or isinstance(session["git_describe"], str)
    assert session["gpus"][0]["uuid"] == "GPU-aaaa" and session["gpus"][0]["name"]
    assert session["driver"]
    rep = build_report(store, cid, figures=False)
    (ctx,) = rep.context
    html = render_html_of(rep)
    assert ctx["driver"] == session["driver"] and f"{session['gpus'][0]['name']} GPU-aaaa" in html
    assert "Run context" in html and session["command"].split()[0] in html


def _fake_lease(uuid):
    """A lease of a fake GPU that nobody holds (nothing to release)."""
    import os
    import time
    from pathlib import Path

    from hazards.engine.leases import GpuLease

    return GpuLease("0", uuid, "test", Path(os.devnull), os.getpid(), "host", time.time())


def test_markdown_summary_escapes_pipes_and_html(store):
    """Escaped the markdown way (a backslash), never with HTML entities: the same summary
    is what `hazards soak` prints on the terminal, where '&lt;n&gt;' is noise."""
    from hazards.engine.outcome import Outcome, RunResult

    cid = store.create_campaign("run", {})
    for reason in ("<script>alert(1)</script> | oops", "fine"):
        store.record_run(cid, RunResult(Outcome.MISMATCH if reason != "fine" else Outcome.CLEAN, reason,
                                        target="a|b <i>", variant="v|w"))
    prev = store.create_campaign("run", {})
    store.set_campaign_status(prev, "complete")
    md = render_markdown(build_report(store, cid, figures=False))
    row = next(line for line in md.splitlines() if line.startswith("| a"))
    assert row.startswith(r"| a\|b \<i\>/v\|w | clean | 2 |")
    assert row.count(" | ") == 9  # ten cells: the pipes in the names did not add any
    assert "<script>" not in md and "<i>" not in md
    assert "&lt;" not in md and "&gt;" not in md and "&amp;" not in md


def test_without_the_report_extra_the_html_report_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    from hazards.cli import main
    from hazards.engine.store import Store

    db = tmp_path / "r.db"
    with Store(db) as s:
        _, cur = synthetic_soaks(s)
    monkeypatch.setitem(sys.modules, "jinja2", None)  # `import jinja2` now raises ImportError
    rc = main(["report", "--store", str(db), "-o", str(tmp_path / "r.html")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "pip install 'gpu-hazards[reports]'" in err
    assert not (tmp_path / "r.html").exists()
    with Store(db, read_only=True) as s:  # the text summaries need neither
        assert render_markdown(build_report(s, cur, figures=False)).startswith("## hazards soak")


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (scripts/setup.sh installs it: apt-get install chromium)")
def test_report_with_artifacts_opens_in_chromium_and_every_artifact_link_loads(repro_store, tmp_path):
    from hazards.engine.store import Store

    with Store(repro_store, read_only=True) as store:
        page = tmp_path / "report.html"
        write_report(store, 2, page)
    result = _open_in_chromium(page, tmp_path)
    assert result["errors"] == [] and result["console"] == []
    assert result["broken"] == 0 and result["images"] >= 3
    assert result["links"] >= 10 and result["unreachable"] == []


def test_a_failing_run_of_any_command_keeps_evidence_json_that_the_report_links(tmp_path, capsys):
    from hazards.cli import main
    from hazards.engine.store import Store

    db = tmp_path / "r.db"
    rc = main(["run", "-n", "2", "--progress-interval", "0", "--store", str(db), "--",
               sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])
    assert rc == 1
    with Store(db, read_only=True) as store:
        (row,) = build_report(store, 1, figures=False).rows
    assert [a.outcome for a in row.linked] == ["fault", "fault"]
    evidence = dict((p.name, what) for what, p in row.linked[0].files)
    assert evidence["evidence.json"] == "evidence"
    assert json.loads((row.linked[0].folder / "evidence.json").read_text())["outcome"] == "fault"


# -- made for triage: per signature what it said, how to reproduce it, what is new ------------

def test_each_signature_has_its_diagnostic_line_stderr_tail_and_a_repro_command_that_reproduces_it(
        repro_store, tmp_path):
    from hazards.engine.store import Store

    with Store(repro_store, read_only=True) as store:
        page = tmp_path / "report.html"
        rep = write_report(store, 1, page)
        spec = store.campaign(1).spec
    sigs = {s["outcome"]: s for s in rep.signatures}
    assert sigs["mismatch"]["diagnostic"].startswith('HZ_RESULT {"ok": false')  # the failing result line
    assert sigs["fault"]["diagnostic"] == sigs["fault"]["example"].reason  # no better line: the reason
    for s in sigs.values():
        assert s["stderr_tail"] and s["stderr_tail"][-1].startswith("flaky: starting run "), s["stderr_tail"]
        assert s["repro"] == (f"cd {spec['cwd']} && hazards repro --timeout 2 -- "
                              f"{sys.executable} {repro_store.parent.parent / 'flaky.py'}")
    html = page.read_text()
    assert html.count('class="repro"') >= 3 and "flaky: starting run 2" in html
    hang = sigs["hang"]
    assert hang["hang_md"] and "hang.md</a>" in html  # the forensics' hang.md, linked from its signature
    # the command reproduces it: run as written (with this checkout's hazards), it stops at a failure
    line = sigs["mismatch"]["repro"].replace(" hazards repro ", f" {sys.executable} -m hazards repro ", 1)
    r = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HZ_STORE": str(tmp_path / "again.db"),
                            "HZ_PROGRESS_INTERVAL": "0", "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert r.returncode == 1, r.stderr[-2000:]


def test_a_family_signature_reproduces_with_hazards_repro_family_and_a_server_target_says_it_has_none(store):
    _, cur = synthetic_soaks(store)
    rep = build_report(store, cur, figures=False, families=("pipeline", "ordering"))
    sig = next(s for s in rep.signatures if s["label"] == "ordering/fixed")
    assert sig["repro"] == "hazards repro --family ordering --variant fixed --timeout 20"
    assert sig["diagnostic"] == "no reply within 10 s" and sig["stderr_tail"] == []
    unknown = build_report(store, cur, figures=False)  # not told the catalog: a server it cannot rerun
    assert all(s["repro"] is None for s in unknown.signatures)
    assert "no one-command repro" in render_html_of(unknown)


def test_elided_runs_are_counted_as_n_more(store):
    _, cur = synthetic_soaks(store)
    rep = build_report(store, cur, figures=False)
    row = next(r for r in rep.rows if r.label == "pipeline/fixed")
    assert len(row.linked) == 3 and row.linked_of == 20
    sig = next(s for s in rep.signatures if s["label"] == "pipeline/fixed")
    assert sig["count"] == 20 and sig["more"] == 19
    html = render_html_of(rep)
    assert "17 more (their signatures are below)" in html and "this run and 19 more" in html


def test_timestamps_carry_their_time_zone(store, monkeypatch):
    import time

    from hazards.engine.report import _when

    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        assert _when(1_700_000_000.0) == "2023-11-14 23:13:20 CET (+01:00)"
        assert _when(1_690_000_000.0) == "2023-07-22 06:26:40 CEST (+02:00)"
        cid = store.create_campaign("run", {})
        from hazards.engine.outcome import Outcome, RunResult
        store.record_run(cid, RunResult(Outcome.HANG, "timed out", target="p", started_at=1_700_000_000.0))
        html = render_html_of(build_report(store, cid, figures=False))
        assert '<time datetime="2023-11-14T23:13:20+01:00">2023-11-14 23:13:20 CET (+01:00)</time>' in html
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_the_report_opens_with_what_is_new_since_the_previous_campaign(store):
    from hazards.engine.outcome import Outcome, RunResult

    prev, cur = synthetic_soaks(store)
    html = render_html_of(build_report(store, cur, figures=False))
    news = html[html.index('<section class="news"'):html.index("</section>")]
    assert html.index('<section class="news"') < html.index("<h2>Run context</h2>")
    assert f"campaign {prev}, started " in news
    assert "new hang</span> in <strong>ordering/fixed</strong>" in news
    assert "<strong>pipeline/fixed</strong> regressed" in news and "rose from 0/60 to 20/60" in news
    assert news.count("rose from 0/60 to 20/60") == 1  # said once, in its verdict
    first = render_html_of(build_report(store, prev, figures=False))
    assert "This is the first soak campaign in the store" in first
    quiet = store.create_campaign("soak", {"items": [{"target": "pipeline", "variant": "fixed", "role": "clean"}]})
    for _ in range(5):
        store.record_run(quiet, RunResult(Outcome.CLEAN, "ok", target="pipeline", variant="fixed"))
    assert "Nothing new:" in render_html_of(build_report(store, quiet, figures=False))


SORT_AND_FILTER = """<script>
window.addEventListener('load', function () {
  var table = document.getElementById('signatures');
  function column(i) { return Array.prototype.map.call(table.tBodies[0].rows, function (r) { return r.cells[i].textContent.trim(); }); }
  var runs = Array.prototype.findIndex.call(table.tHead.rows[0].cells, function (c) { return c.textContent.trim() === 'runs'; });
  table.tHead.rows[0].cells[runs].click();
  var up = column(runs).map(function (t) { return parseInt(t, 10); });
  table.tHead.rows[0].cells[runs].click();
  var down = column(runs).map(function (t) { return parseInt(t, 10); });
  var filter = table.previousElementSibling;
  filter.value = 'ordering';
  filter.dispatchEvent(new Event('input'));
  var shown = Array.prototype.filter.call(table.tBodies[0].rows, function (r) { return !r.hidden; }).length;
  document.documentElement.setAttribute('data-hz-triage', JSON.stringify({up: up, down: down, shown: shown,
    total: table.tBodies[0].rows.length, filter: filter.tagName + ':' + filter.type}));
});
</script>"""


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (scripts/setup.sh installs it: apt-get install chromium)")
def test_tables_sort_and_filter_in_headless_chromium_offline(store, tmp_path):
    _, cur = synthetic_soaks(store)
    page = tmp_path / "report.html"
    write_report(store, cur, page)
    page.write_text(page.read_text().replace("</body>", SORT_AND_FILTER + "</body>"))
    result = _open_in_chromium(page, tmp_path)
    assert result["errors"] == [] and result["console"] == []
    m = re.search(r'data-hz-triage="([^"]*)"', result["dom"])
    assert m, "the probe did not run"
    got = json.loads(m.group(1).replace("&quot;", '"'))
    assert got["total"] == 3 and got["up"] == sorted(got["up"]) and got["down"] == sorted(got["down"], reverse=True)
    assert got["up"] != got["down"] and got["shown"] == 1 and got["filter"] == "INPUT:search"


def test_cli_report_knows_the_catalog_families_for_the_repro_command(tmp_path, capsys):
    from hazards.cli import main
    from hazards.engine.outcome import Outcome, RunResult
    from hazards.engine.store import Store

    db = tmp_path / "r.db"
    item = {"target": "pipeline", "variant": "fixed", "kind": "server", "argv": ["/cache/pipeline", "--serve"],
            "params": {"variant": "fixed"}, "timeout_s": 20.0, "expect": "clean"}
    with Store(db) as store:
        cid = store.create_campaign("soak", {"budget_s": 60, "items": [item]})
        store.record_run(cid, RunResult(Outcome.MISMATCH, "3 of 200 launches mismatched", target="pipeline",
                                        variant="fixed", params={"variant": "fixed"}))
    assert main(["report", "--json", "--store", str(db), "-o", str(tmp_path / "r.html")]) == 0
    (sig,) = json.loads(capsys.readouterr().out)["signatures"]
    assert sig["repro"] == "hazards repro --family pipeline --variant fixed --timeout 20"
