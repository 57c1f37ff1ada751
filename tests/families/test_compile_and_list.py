"""Both runtime families compile for sm_90a, and the binaries agree with the Python side.

Compile-only on CPU machines (skipped with a reason when nvcc is absent): `--list` and bad
requests are answered without touching a GPU, so they are checked here too.
"""
from __future__ import annotations

import json
import subprocess

import pytest

from hazards.families import get_family

FAMILIES = ("pipeline", "ordering")


def list_json(exe) -> dict:
    out = subprocess.run([str(exe), "--list"], capture_output=True, text=True, timeout=30, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("name", FAMILIES)
def test_family_compiles_for_sm90a_and_lists_its_variants(family_binaries, name):
    listing = list_json(family_binaries[name])
    assert listing["hz_protocol"] == 1 and listing["family"] == name
    fam = get_family(name)
    assert [v["name"] for v in listing["variants"]] == [v.name for v in fam.variants]
    assert [v["role"] for v in listing["variants"]] == [v.role for v in fam.variants]


@pytest.mark.parametrize("name", FAMILIES)
def test_python_defaults_and_presets_match_the_binary(family_binaries, name):
    import importlib

    mod = importlib.import_module(f"hazards.families.{name}")
    listing = list_json(family_binaries[name])
    assert {p["name"]: p["default"] for p in listing["params"]} == mod.DEFAULTS
    assert set(mod.RUNTIME_PARAMS) == set(mod.DEFAULTS)
    for v in listing["variants"]:
        assert v["params"] == mod._BY_NAME[v["name"]].params, v["name"]


@pytest.mark.parametrize("request_json, fragment", [
    ('{"launches": 2, "params": {"variant": "no_such_variant"}}', "unknown variant"),
    ('{"launches": 2, "params": {"no_such_param": 1}}', "unknown parameter"),
    ('{"launches": 2, "params": {"variant": "fixed", "stages": 9}}', "outside [1, 4]"),
    ('{"launches": 2, "params": {"copy": "tma"}}', "not one of the allowed values"),
    ('{"launches": 2, "params": {"war_barrier": 1}}', "must be true or false"),
    ("{not json", "request is not JSON"),
])
def test_bad_request_exits_2_with_a_result_line_before_touching_the_gpu(family_binaries, request_json, fragment):
    out = subprocess.run([str(family_binaries["pipeline"]), "--once", request_json],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("HZ_RESULT "))
    payload = json.loads(line[len("HZ_RESULT "):])
    assert payload["status"] == "bad_request" and fragment in payload["message"]


def test_once_reads_params_from_the_environment_like_a_command_target(family_binaries):
    env = {"HZ_PARAMS": json.dumps({"variant": "nope"}), "HZ_LAUNCHES": "3", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([str(family_binaries["ordering"]), "--once"], capture_output=True, text=True,
                         timeout=30, env=env)
    assert out.returncode == 2 and "unknown variant 'nope'" in out.stdout


def test_usage_error_exits_2(family_binaries):
    out = subprocess.run([str(family_binaries["ordering"]), "--bogus"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "usage:" in out.stderr
