"""`hazards report` on a campaign of a `hazards mutate` session shows the session's mutation
score and every survivor with its diff and per-launch bound: in HTML, markdown and JSON."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "HZ_FAKE_GPUS": ""}
KERNEL = "void f(int* d, int* g){ d[0] = 1; __threadfence(); g[0] = 1; __syncthreads(); }\n"
# The test sees a missing fence (a mismatch) and not a missing barrier; it reports its launches.
CHECK = """import sys
if "__threadfence" not in open(sys.argv[1]).read():
    print('HZ_RESULT {"status": "ok", "launches": 100, "mismatched": 100}')
    sys.exit(1)
print('HZ_RESULT {"status": "ok", "launches": 100, "mismatched": 0}')
"""


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> Path:
    """A store holding one mutate session: remove-fence killed, remove-barrier survived."""
    tmp = tmp_path_factory.mktemp("mutate-report")
    project = tmp / "p"
    project.mkdir()
    (project / "kernel.cu").write_text(KERNEL)
    (project / "check.py").write_text(CHECK)
    store = tmp / "r.db"
    res = subprocess.run([sys.executable, "-m", "hazards", "mutate", "kernel.cu", "--operators",
                          "remove-fence,remove-barrier", "--test", f"{sys.executable} {{dir}}/check.py {{src}}",
                          "--timeout", "30", "-n", "3", "--store", str(store)], cwd=project, capture_output=True,
                         text=True, timeout=300, env=ENV)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "mutation score: 1 of 2 judged mutants killed (50%); 2 mutants in all" in res.stdout
    return store


def _report(store: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hazards", "report", *args, "--store", str(store)],
                          capture_output=True, text=True, timeout=300, env=ENV, cwd=store.parent)


def test_the_markdown_report_of_the_latest_mutant_shows_the_score_and_each_survivors_diff(session, tmp_path):
    res = _report(session, "--markdown", "-o", str(tmp_path / "r.html"))
    assert res.returncode == 0, res.stderr
    md = res.stdout
    assert "### Mutation score" in md
    assert "**1 of 2 judged mutants killed (50%); 2 mutants in all** (killed 1, survived 1)" in md
    assert "survived: `remove-barrier@1`" in md and "0 failures in 300 launches (3 runs): per-launch rate" in md
    assert "```diff\n--- a/" in md and "-void f(int* d, int* g){ d[0] = 1; __threadfence(); g[0] = 1; __syncthreads(); }" in md
    assert "remove-fence@1" not in md.split("### Mutation score")[1].split("```")[0].replace("killed 1", "")


def test_the_html_and_json_reports_show_every_mutant_and_the_survivors_diff(session, tmp_path):
    out = tmp_path / "r.html"
    res = _report(session, "--json", "-o", str(out))
    assert res.returncode == 0, res.stderr
    mutation = json.loads(res.stdout)["mutation"]
    assert mutation["score"] == {"killed": 1, "judged": 2, "mutants": 2}
    assert {m["id"]: m["fate"] for m in mutation["mutants"]} == {"remove-fence@1": "killed",
                                                                 "remove-barrier@1": "survived"}
    (surv,) = mutation["survivors"]
    assert surv["diff"].startswith("--- a/") and surv["launches"] == 300
    page = out.read_text()
    assert "Mutation score (session campaign" in page and "<pre class=\"diff\">--- a/" in page
    assert "g[0] = 1; __syncthreads(); }" in page and "mismatch" in page  # the killed one's evidence


def test_the_baseline_campaign_reports_the_same_session_and_other_campaigns_none(session, tmp_path):
    from hazards.engine.report import build_report
    from hazards.engine.store import Store

    with Store(session, read_only=True) as store:
        camps = store.campaigns(kind="mutate")
        base = next(c for c in camps if c.spec.get("baseline"))
        reps = [build_report(store, c.id, figures=False).mutation for c in camps]
    assert all(r is not None and r["session"] == base.id and r["score"]["killed"] == 1 for r in reps)
    assert _report(session, str(base.id), "--markdown", "-o", str(tmp_path / "b.html")).stdout.count("### Mutation") == 1
    from types import SimpleNamespace

    from hazards.engine.report import mutation_summary

    assert mutation_summary(None, SimpleNamespace(id=7, spec={"families": ["ordering"]})) is None  # a soak, say
