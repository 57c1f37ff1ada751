"""The runtime families compile for sm_90a and embed their family table.

Compile-only on CPU machines (skipped with a reason when nvcc is absent): `--list` and bad
requests are answered without touching a GPU, so they are checked here too.
"""
from __future__ import annotations

import json
import subprocess

import pytest

from hazards.families import all_families

RUNTIME = [f for f in all_families() if f.binary]


def list_json(exe) -> dict:
    out = subprocess.run([str(exe), "--list"], capture_output=True, text=True, timeout=30, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("family", RUNTIME, ids=[f.name for f in RUNTIME])
def test_generated_table_header_round_trips_through_the_binary(family_binaries, family):
    """The binary parses the table the build embedded (hz_family_table.h) and lists it back:
    parameters, defaults, ranges, choices, docs, variants, presets and counters all equal
    the family.toml the Python Family was built from."""
    listing = list_json(family_binaries[family.name])
    assert listing == {"hz_protocol": 1, **family.harness_json()}


def _binary_resolve(exe, point: dict) -> tuple[int, dict]:
    out = subprocess.run([str(exe), "--resolve", json.dumps(point)], capture_output=True, text=True, timeout=30)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("HZ_RESOLVED "))
    return out.returncode, json.loads(line[len("HZ_RESOLVED "):])


def _bad_points(family, point: dict):
    """The point broken in each way the harness refuses: an unknown name, a value past an
    int's range, a wrong type."""
    yield {**point, "no_such_param": 1}, "unknown parameter 'no_such_param'"
    for p in family.params:
        if p.kind == "int":
            yield {**point, p.name: p.max + 1}, "outside ["
            yield {**point, p.name: True}, "must be an integer"
        elif p.kind == "bool":
            yield {**point, p.name: 1}, "must be true or false"
        else:
            yield {**point, p.name: "no-such-choice"}, "not one of the allowed values"


@pytest.mark.parametrize("family", RUNTIME, ids=[f.name for f in RUNTIME])
def test_python_resolves_every_point_exactly_as_the_binary_does(family_binaries, family):
    """The one resolver: on the family's own strategy points, Family.resolve gives the very
    point the binary reports it would run, and every broken variation of a point is refused
    by both with the same complaint."""
    from hypothesis import HealthCheck, given, settings

    from hazards.family import BadPoint

    exe = family_binaries[family.name]

    @given(family.strategy())
    @settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    def check(point):
        rc, reply = _binary_resolve(exe, point)
        assert rc == 0, reply
        assert reply["resolved"] == family.resolve(point)
        assert reply["variant"] == point.get("variant", family.variants[0].name)

    check()
    for bad, fragment in _bad_points(family, {"variant": family.variants[-1].name}):
        rc, reply = _binary_resolve(exe, bad)
        assert rc == 2 and reply["status"] == "bad_request" and fragment in reply["message"], (bad, reply)
        with pytest.raises(BadPoint) as exc:
            family.resolve(bad)
        assert fragment in str(exc.value)


def test_every_runtime_family_is_round_tripped():
    assert {"pipeline", "ordering", "deadlock", "barrier_layout"} <= {f.name for f in RUNTIME}


def test_a_binary_built_without_its_table_says_so_and_exits_2():
    from hazards.engine.build import build_family
    from hazards.kernel_sources import standalone_dir

    exe = build_family(standalone_dir(), "pipeline", "pipeline")  # the cache keys the missing table apart
    out = subprocess.run([str(exe), "--list"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "built without its family table" in out.stderr


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
