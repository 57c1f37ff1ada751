"""`hazards repro` from the outside: a fake instrumented program, real engine, real store."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def repro(*args: str, store: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "hazards", "repro", "--store", str(store), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def test_repro_stops_at_the_hang_and_prints_the_diagnosis_and_rate(fake_kernel: Path, tmp_path: Path) -> None:
    r = repro("--tripwire", "--timeout", "1", "--runs", "5", "--", str(fake_kernel), "hang",
              store=tmp_path / "r.db")
    assert r.returncode == 1, r.stderr
    assert "run 1: hang" in r.stdout
    assert "6 workers wait at barrier #3 epoch 6 (observed 5)" in r.stdout
    assert "1 failure in 1 run: rate 100% (95% CI 2.5%–100%)" in r.stdout
    art = tmp_path / "artifacts" / "campaign-1"
    assert (art / "repro-context.json").is_file()
    ctx = json.loads((art / "repro-context.json").read_text())
    assert ctx["program_sha256"] and ctx["argv"][1] == "hang"
    run = art / "run-000001"
    for name in ("evidence.json", "stdout.log", "stderr.log", "tripwire-hang.txt", "tripwire-final.bin"):
        assert (run / name).is_file(), name


def test_repro_json_keeps_going_and_counts_every_run(fake_kernel: Path, tmp_path: Path) -> None:
    r = repro("--tripwire", "--json", "--keep-going", "-n", "3", "--", str(fake_kernel), "clean",
              store=tmp_path / "r.db")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["counts"]["clean"] == 3 and d["failures"] == []
    assert d["ci_95"][0] == 0.0 and 0.5 < d["ci_95"][1] < 1.0


def test_names_file_turns_ids_into_names(fake_kernel: Path, tmp_path: Path) -> None:
    names = tmp_path / "names.json"
    names.write_text('{"barriers": {"3": "ATTN_RELEASE"}, "phases": {"7": "MOE_W13_W2"}}')
    r = repro("--tripwire", "--names", str(names), "--timeout", "1", "--", str(fake_kernel), "fault",
              store=tmp_path / "r.db")
    assert r.returncode == 1
    assert "tripwire (post-mortem): 6 workers wait at barrier ATTN_RELEASE" in r.stdout
    assert "1 straggler at MOE_W13_W2 layer 4" in r.stdout


@pytest.mark.parametrize("args, message", [
    (["-n", "0", "--", "true"], "-n/--runs must be at least 1"),
    (["--max-runs", "0", "--", "true"], "-n/--runs must be at least 1"),
    (["--timeout", "-1", "--", "true"], "--timeout must be a positive"),
    (["--params", "{bad", "--family", "deadlock"], "--params is not JSON"),
    (["--family", "no_such_family"], "no family 'no_such_family'"),
    (["--family", "deadlock", "--variant", "nope", "--binary", "/bin/true"], "has no variant 'nope'"),
    (["--variant", "x", "--", "true"], "go with --family"),
    (["-D", "MKL_CAMPAIGN_STEP=12", "--", "true"], "-D go with --family"),
    (["--family", "deadlock", "-D", "1BAD=2", "--binary", "/bin/true"], "-D/--define: not a macro name"),
    (["--family", "deadlock", "-D", "MKL_CAMPAIGN_STEP=", "--binary", "/bin/true"], "has no value"),
    (["--family", "deadlock", "-D", ",", "--binary", "/bin/true"], "-D/--define: an empty item"),
    (["--", "/no/such/program"], "command not found"),
    (["--names", "/no/such/names.json", "--", "true"], "cannot read names file"),
])
def test_bad_input_is_one_line_and_nonzero(tmp_path: Path, args: list[str], message: str) -> None:
    store = tmp_path / "r.db"
    r = repro(*args, store=store)
    assert r.returncode == 2
    assert r.stderr.startswith("hazards: error: ") and message in r.stderr
    assert "Traceback" not in r.stderr
    assert not store.exists()
