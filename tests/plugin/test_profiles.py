"""The hypothesis profiles: `ci` is deterministic, selectable by option or environment."""
from __future__ import annotations

import json
from pathlib import Path

from hazards import hypothesis_profiles

EXAMPLES_TEST = """
    import json, os
    from pathlib import Path
    from hypothesis import given, settings, strategies as st

    OUT = Path(os.environ["HZ_TEST_OUT"])

    def test_record_profile():
        db = "nodb" if settings.default.database is None else "db"
        OUT.with_suffix(".profile").write_text(f"{settings.get_current_profile_name()} {db}")

    @given(st.integers(), st.text(max_size=5))
    def test_record_examples(n, s):
        with OUT.open("a") as f:
            f.write(json.dumps([n, s]) + "\\n")
"""


def _examples(inner, tag, *args, env=None):
    out = inner.path / f"{tag}.jsonl"
    res = inner.run(*args, env={"HZ_TEST_OUT": str(out), **(env or {})})
    assert res.ret == 0, res.stdout + res.stderr
    return [json.loads(line) for line in out.read_text().splitlines()], res


def test_ci_profile_generates_the_same_examples_in_two_runs(inner):
    inner.write("test_examples.py", EXAMPLES_TEST)
    first, res = _examples(inner, "a", "--hypothesis-profile", "hazards-ci")
    second, _ = _examples(inner, "b", "--hypothesis-profile", "hazards-ci")
    assert first == second
    assert 1 < len(first) <= hypothesis_profiles.CI_MAX_EXAMPLES
    assert (inner.path / "a.profile").read_text() == "hazards-ci nodb"  # no example database in CI
    assert "hypothesis profile 'hazards-ci'" in res.stdout


def test_default_profile_is_random_so_the_determinism_check_can_fail(inner):
    inner.write("test_examples.py", EXAMPLES_TEST)
    first, _ = _examples(inner, "a", "-p", "no:randomly")
    second, _ = _examples(inner, "b")
    assert first != second


def test_environment_variable_selects_the_profile_and_the_option_wins(inner):
    inner.write("test_examples.py", EXAMPLES_TEST)
    by_env, res = _examples(inner, "env", env={"HZ_HYPOTHESIS_PROFILE": "hazards-ci"})
    by_opt, _ = _examples(inner, "opt", "--hypothesis-profile", "hazards-ci")
    assert by_env == by_opt
    assert "hypothesis profile 'hazards-ci' (from $HZ_HYPOTHESIS_PROFILE)" in res.stdout
    res = inner.run("-k", "test_record_profile", "--hypothesis-profile", "hazards-nightly",
                    env={"HZ_TEST_OUT": str(inner.path / "n.jsonl"), "HZ_HYPOTHESIS_PROFILE": "hazards-ci"})
    assert res.ret == 0, res.stdout
    assert (inner.path / "n.profile").read_text() == "hazards-nightly db"


def test_unknown_profile_in_environment_is_a_one_line_usage_error(inner):
    inner.write("test_ok.py", "def test_ok():\n    pass\n")
    res = inner.run(env={"HZ_HYPOTHESIS_PROFILE": "weekly"})
    assert res.ret == 4
    assert "unknown hypothesis profile 'weekly'" in res.stderr
    assert "Traceback" not in res.stderr


def test_nightly_keeps_its_example_database_under_dot_hazards(tmp_path, monkeypatch):
    from hypothesis import settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HZ_STORE", raising=False)
    hypothesis_profiles.register_profiles()
    db = settings.get_profile("hazards-nightly").database
    assert db is not None and str(db.path) == str(Path(".hazards") / "hypothesis")
    db.save(b"key", b"value")
    assert (tmp_path / ".hazards" / "hypothesis").is_dir()
    ci = settings.get_profile("hazards-ci")
    assert ci.derandomize and ci.deadline is None and ci.database is None


def test_nightly_shares_the_example_database_beside_the_results_store(tmp_path, monkeypatch):
    """One database per store: the nightly profile follows $HZ_STORE like `hazards explore`."""
    from hypothesis import settings

    monkeypatch.setenv("HZ_STORE", str(tmp_path / "night" / "results.db"))
    hypothesis_profiles.register_profiles()
    db = settings.get_profile("hazards-nightly").database
    assert str(db.path) == str(tmp_path / "night" / "hypothesis") == str(hypothesis_profiles.database_dir())


def test_profiles_owned_by_hypothesis_or_the_user_are_never_redefined():
    """Hypothesis' built-in `ci` profile keeps its settings, and a `hazards-nightly` that the
    user's conftest registered first is kept; only the project's own names are registered."""
    import subprocess
    import sys

    code = """
import json
from hypothesis import settings
from hypothesis.errors import InvalidArgument
try:
    before = settings.get_profile("ci").max_examples
except InvalidArgument:
    before = None
settings.register_profile("hazards-nightly", max_examples=3)
from hazards import hypothesis_profiles
hypothesis_profiles.register_profiles()
hypothesis_profiles.register_profiles()
try:
    after = settings.get_profile("ci").max_examples
except InvalidArgument:
    after = None
print(json.dumps([before, after, settings.get_profile("hazards-nightly").max_examples,
                  settings.get_profile("hazards-ci").max_examples]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    before, after, nightly, ci = json.loads(out)
    assert after == before  # hypothesis' (or nobody's) `ci`, untouched
    assert nightly == 3
    assert ci == hypothesis_profiles.CI_MAX_EXAMPLES
