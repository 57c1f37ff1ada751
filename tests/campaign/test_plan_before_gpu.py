"""Plan before the GPU: `hazards soak` checks everything it was given (targets file, family
names) before it asks for a GPU, and `--dry-run` on soak and check prints the items, the
budget and what would be skipped, exit 0 (2 for bad input), with no GPU, no build, no store."""
from __future__ import annotations

import json
import sys

import pytest
from campaign_fakes import FAKE_SERVER, make_family

import hazards.families as families
import hazards.stress_family as stress_family
from hazards import checkrun, static_catalog
from hazards.cli import main
from hazards.engine.loop import WorkItem
from hazards.engine.store import Store

TARGETS = f"""
[[target]]
name = "fake-server"
kind = "server"
argv = ["{sys.executable}", "{FAKE_SERVER}"]
timeout = 10

[[target]]
name = "my-canary"
argv = ["{sys.executable}", "-c", "pass"]
expect = "detect"
timeout = 20
"""


@pytest.fixture
def no_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv("HZ_FAKE_GPUS", "")
    monkeypatch.setenv("HZ_LEASE_DIR", str(tmp_path / "leases"))


@pytest.fixture
def catalog(monkeypatch):
    """The fake family plus one without a launch server; building any of them is recorded
    (and must not happen in a plan)."""
    static_only = make_family("staticfam")
    static_only = type(static_only)(**{**static_only.__dict__, "binary": None})
    fams = {f.name: f for f in (make_family(), static_only)}
    built = []

    def build(fam, *args, **kw):
        built.append(fam.name)
        raise AssertionError("a plan built a family")

    monkeypatch.setattr(families, "all_families", lambda: list(fams.values()))
    monkeypatch.setattr(families, "get_family", lambda n: fams[n] if n in fams else _unknown(n, fams))
    monkeypatch.setattr(stress_family, "family_item", build)
    monkeypatch.setattr(checkrun, "run_static", lambda *a, **kw: pytest.fail("a plan ran the static checks"))
    monkeypatch.setattr(static_catalog, "static_family_names", lambda: ["staticfam"])
    return built


def _unknown(name, fams):
    from hazards.engine.errors import UserError

    raise UserError(f"no family {name!r} (known: {', '.join(fams)})")


def one_line_error(capsys, rc: int) -> str:
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("hazards: error: "), (rc, err)
    return err


@pytest.mark.parametrize("text, message", [
    ("[[target]]\nname = 'a'\n", "'argv' must be a non-empty list"),
    ("[[target]\n", "not valid TOML"),
])
def test_soak_with_a_broken_targets_file_says_what_is_wrong_with_it_not_that_it_needs_a_gpu(
        no_gpu, catalog, tmp_path, capsys, text, message):
    broken = tmp_path / "broken.toml"
    broken.write_text(text)
    err = one_line_error(capsys, main(["soak", "--targets", str(broken), "--store", str(tmp_path / "r.db")]))
    assert message in err and "GPU" not in err
    assert catalog == [] and not (tmp_path / "r.db").exists()


def test_soak_with_an_unknown_family_names_it_before_asking_for_a_gpu(no_gpu, catalog, tmp_path, capsys):
    err = one_line_error(capsys, main(["soak", "--families", "fakefam,nosuch", "--store", str(tmp_path / "r.db")]))
    assert "no family 'nosuch'" in err and "GPU" not in err
    assert catalog == []


def test_soak_resume_of_a_campaign_that_is_no_soak_says_so_before_asking_for_a_gpu(no_gpu, catalog, tmp_path,
                                                                                  capsys):
    db = tmp_path / "r.db"
    with Store(db) as s:
        run = s.create_campaign("run", {})
        s.set_campaign_status(run, "complete")
    err = one_line_error(capsys, main(["soak", "--resume", str(run), "--store", str(db)]))
    assert "is a 'run' campaign, not a soak" in err
    err = one_line_error(capsys, main(["soak", "--resume", "9", "--store", str(db)]))
    assert "no campaign 9" in err


def test_soak_dry_run_prints_items_budget_and_skips_without_a_gpu_a_build_or_a_store(no_gpu, catalog, tmp_path,
                                                                                    capsys):
    targets = tmp_path / "targets.toml"
    targets.write_text(TARGETS)
    rc = main(["soak", "--dry-run", "--budget", "10m", "--targets", str(targets), "--store", str(tmp_path / "r.db")])
    out = capsys.readouterr().out
    assert rc == 0, out
    for line in ("fakefam/broken: must be detected (canary)", "fakefam/fixed: must stay clean",
                 "fake-server: must stay clean; runs as server, timeout 10s", "my-canary: must be detected (canary)",
                 "10m00s in all", "2m00s (20%) to `hazards explore` on fakefam", "8m00s to the items by evidence",
                 "family staticfam: no launch server", "GPUs visible now: none"):
        assert line in out, (line, out)
    assert catalog == [] and not (tmp_path / "r.db").exists() and not (tmp_path / "leases").exists()


def test_soak_dry_run_json_and_uniform_allocation(no_gpu, catalog, tmp_path, capsys):
    rc = main(["soak", "--dry-run", "--json", "--budget", "90s", "--allocation", "uniform", "--explore", "0",
               "--families", "fakefam", "--store", str(tmp_path / "r.db")])
    plan = json.loads(capsys.readouterr().out)
    assert rc == 0 and plan["dry_run"] and plan["command"] == "soak"
    assert [i["key"] for i in plan["items"]] == ["fakefam/reference", "fakefam/fixed", "fakefam/broken"]
    assert plan["budget"][0] == "1m30s in all" and "about 30s per item" in plan["budget"][1]
    assert plan["gpus"] == [] and "needs a free GPU" in plan["without_gpu"]


def test_soak_dry_run_of_a_resume_shows_the_stored_items_and_the_budget_left(no_gpu, catalog, tmp_path, capsys):
    db = tmp_path / "r.db"
    item = WorkItem(target="stored-target", variant="", kind="command", argv=("true",), timeout_s=5.0,
                    expect="clean")
    with Store(db) as s:
        cid = s.create_campaign("soak", {"budget_s": 600.0, "items": [item.to_json()], "allocation": "uniform"})
        s.create_campaign("run", {})
    rc = main(["soak", "--dry-run", "--resume", str(cid), "--store", str(db)])
    out = capsys.readouterr().out
    assert rc == 0 and "stored-target: must stay clean" in out and "10m00s in all (what the resumed" in out
    assert f"resumes campaign {cid}" in out
    err = one_line_error(capsys, main(["soak", "--dry-run", "--resume", "2", "--store", str(db)]))
    assert "not a soak" in err
    one_line_error(capsys, main(["soak", "--dry-run", "--resume", "9", "--store", str(db)]))


def test_check_dry_run_lists_static_and_gpu_items_and_what_would_not_be_judged(no_gpu, catalog, tmp_path, capsys):
    rc = main(["check", "--dry-run", "--store", str(tmp_path / "r.db")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "fakefam/broken: must be detected (canary)" in out and "fakefam/fixed: must stay clean" in out
    assert "GPU checks of 3 variants: no usable GPU now: not judged (exit 3) unless --skip gpu" in out
    assert "static staticfam: its canaries must be found" in out
    assert "50s in all" in out and not (tmp_path / "r.db").exists() and catalog == []
    rc = main(["check", "--dry-run", "--static", "--json", "--store", str(tmp_path / "r.db")])
    plan = json.loads(capsys.readouterr().out)
    assert rc == 0 and not [i for i in plan["items"] if i["runs_as"] == "family launch server"]
    assert {"what": "GPU checks of 3 variants", "why": "--skip gpu: fakefam/reference, fakefam/fixed, "
            "fakefam/broken"} in plan["skipped"]


@pytest.mark.parametrize("args, message", [
    (["--families", "nosuch"], "no family 'nosuch'"),
    (["--skip", "gpu", "--skip", "static"], "leave nothing to check"),
    (["--skip", "nvcc9"], "--skip nvcc9: nothing of that name"),
    (["/no/such/folder"], "no such file or directory: /no/such/folder"),
])
def test_check_dry_run_refuses_bad_input_with_exit_2(no_gpu, catalog, tmp_path, capsys, args, message):
    err = one_line_error(capsys, main(["check", "--dry-run", *args, "--store", str(tmp_path / "r.db")]))
    assert message in err


def test_check_dry_run_names_a_missing_tool_per_target_and_a_skipped_one(no_gpu, catalog, tmp_path, capsys,
                                                                         monkeypatch):
    monkeypatch.setenv("HZ_CLANG", str(tmp_path / "no-clang"))
    rc = main(["check", "--dry-run", "--static", "--skip", "nvcc", "--store", str(tmp_path / "r.db")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "tool clang for gfx942: not found" in out and "tool clang for gfx950: not found" in out
    assert "unless --skip clang" in out and "tool nvcc: --skip" in out


def test_dry_runs_name_a_missing_launch_server_compiler_instead_of_skipping_nothing(no_gpu, catalog, tmp_path,
                                                                                   capsys, monkeypatch):
    # Without nvcc a real soak stops at its first build and a real check judges no variant:
    # a plan saying "skipped: nothing" would hide that.
    monkeypatch.setenv("HZ_NVCC", str(tmp_path / "no-nvcc"))
    rc = main(["soak", "--dry-run", "--families", "fakefam", "--store", str(tmp_path / "r.db")])
    out = capsys.readouterr().out
    assert rc == 0 and "launch servers of fakefam: cannot be built (nvcc not found" in out, out
    assert "a real soak stops with this error (exit 2)" in out
    rc = main(["check", "--dry-run", "--skip", "static", "--store", str(tmp_path / "r.db")])
    out = capsys.readouterr().out
    assert rc == 0 and "launch servers of fakefam: cannot be built (nvcc not found" in out, out
    assert "their variants are not judged (exit 3)" in out


def test_soak_dry_run_refuses_a_ray_address_the_soak_would_refuse(no_gpu, catalog, tmp_path, capsys):
    err = one_line_error(capsys, main(["soak", "--dry-run", "--executor", "ray", "--address", "garbage",
                                       "--store", str(tmp_path / "r.db")]))
    assert "Ray address 'garbage' is not HOST:PORT" in err


def test_check_dry_run_names_only_tools_the_static_part_would_miss(no_gpu, catalog, tmp_path, capsys, monkeypatch):
    # hipcc builds AMD launch servers, never a static check, and cuobjdump only stands in for
    # nvdisasm: the real check passes without them, so the plan must not predict exit 3.
    monkeypatch.setenv("HZ_HIPCC", str(tmp_path / "no-hipcc"))
    monkeypatch.setenv("HZ_CUOBJDUMP", str(tmp_path / "no-cuobjdump"))
    rc = main(["check", "--dry-run", "--static", "--store", str(tmp_path / "r.db")])
    out = capsys.readouterr().out
    assert rc == 0 and "tool hipcc" not in out and "tool cuobjdump" not in out, out
    monkeypatch.setenv("HZ_NVDISASM", str(tmp_path / "no-nvdisasm"))
    main(["check", "--dry-run", "--static", "--store", str(tmp_path / "r.db")])
    out = capsys.readouterr().out
    assert "tool nvdisasm: not found" in out, out  # neither disassembler: the SASS checks cannot run
