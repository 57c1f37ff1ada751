"""On a GPU, through the plugin: a property test over family `pipeline` under the `ci` profile.

What it exercises end to end: the process's GPU lease (`hz_gpu`), a warm family launch
server on that GPU (`hz_family_server`, built and closed by the plugin), hypothesis
generating pipeline points under the `ci` profile (derandomized, few examples, no
deadline), `hypothesis.target` on each point's mismatch rate, and, should a point fail,
the plugin's failing-point report (rate re-measured at the point, `hazards repro` line).

The property: a point the static model calls safe runs clean (over SAFE_LAUNCHES
validated launches); no point is an `error` (every generated point is a valid request).

Run it on a GPU machine (the wall time is what the issue asks to report):
    PYTHONPATH=$PWD python3 -m pytest -p hazards.pytest_plugin --hypothesis-profile hazards-ci \\
        tests/plugin/test_family_property_gpu.py -v --hypothesis-show-statistics
(with the package installed, the `-p` is not needed: the pytest11 entry point loads it).
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings

from hazards.families import get_family
from hazards.hypothesis_profiles import CI_PROFILE, register_profiles
from hazards.engine.outcome import Outcome

FAMILY = get_family("pipeline")
SAFE_LAUNCHES = 200

pytestmark = pytest.mark.gpu


# The profile loaded by --hypothesis-profile / $HZ_HYPOTHESIS_PROFILE; `hazards-ci` when none
# was chosen (hypothesis' default profile has a 200 ms deadline, wrong for GPU batches).
register_profiles()
PROFILE_NAME = (settings.get_current_profile_name() if settings.get_current_profile_name() != "default"
                else CI_PROFILE)
PROFILE = settings.get_profile(PROFILE_NAME) if PROFILE_NAME == CI_PROFILE else settings.default


# Sharing the function-scoped warm server across examples is intended (the profiles say so too).
@settings(PROFILE, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(point=FAMILY.strategy())
def test_pipeline_points_the_static_model_calls_safe_run_clean(hz_gpu, hz_family_server, point):
    server = hz_family_server("pipeline", launches=SAFE_LAUNCHES)
    event(f"profile: {PROFILE_NAME}")
    result = server.run(point)
    assert result.outcome is not Outcome.ERROR, f"{point}: {result.reason}"
    # the static model judges the point the binary reports it ran (one resolver: the same one)
    ran = result.metrics.get("resolved")
    assert ran == FAMILY.resolve(point), f"{point}: the binary ran {ran}"
    verdict = FAMILY.static_model(ran)
    event("static model: " + ("hazardous" if verdict.hazardous else "safe"))
    if hz_gpu.startswith("GPU-") and server.target.gpu_uuid:
        assert server.target.gpu_uuid.lower() == hz_gpu.lower(), "the server must run on this process's leased GPU"
    server.target_rate(result)
    event(f"outcome: {result.outcome.value}")
    if not verdict.hazardous:
        assert result.outcome is Outcome.CLEAN, (f"static model says safe ({verdict.reason}) but the point gave "
                                                 f"{result.outcome.value}: {result.reason}; metrics {result.metrics}")
