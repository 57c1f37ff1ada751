"""Every family table (`standalone/<family>/family.toml`) is valid, and the one resolver
follows the harness's rules. No compiler needed: this replaces the mirror tests that
compared hand-kept Python copies with the binaries (the binaries now embed the table; the
nvcc round trip is in test_compile_and_list.py).

Covers every family found by `all_families()`, so a new family is checked without a new
test."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hazards.families import all_families
from hazards.family import (HEADER_NAME, ORACLES, TABLE_FILE, BadPoint, Family, FamilyTableError,
                            StaticVerdict, family_from_table, read_table)
from hazards.kernel_sources import standalone_dir

FAMILIES = all_families()
IDS = [f.name for f in FAMILIES]


def test_every_kernel_folder_with_a_table_is_a_catalog_family_and_back():
    tables = {p.parent.name for p in standalone_dir().glob(f"*/{TABLE_FILE}")}
    assert tables == {f.source_dir for f in FAMILIES}
    assert {"pipeline", "ordering", "deadlock", "barrier_layout", "earlyclobber", "mfma_pipeline"} <= tables


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_table_is_valid_and_every_variant_preset_resolves(family: Family):
    read_table(family.table_path)  # raises FamilyTableError on any schema violation
    assert family.variants and family.canaries and family.clean_variants
    for v in family.variants:
        point = family.resolve({"variant": v.name})
        assert list(point) == [p.name for p in family.params]
        assert {k: point[k] for k in v.params} == v.params, v.name
        assert set(v.detected_by) <= set(ORACLES)
        assert bool(v.detected_by) is v.is_canary
        assert "\n" not in v.description


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_the_static_model_calls_exactly_the_canaries_hazardous(family: Family):
    for v in family.variants:
        verdict = family.static_model({"variant": v.name})
        assert verdict.hazardous is v.is_canary, (v.name, verdict.reason)


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_every_strategy_point_is_one_the_binary_would_accept(family: Family):
    @given(st.data())
    @settings(max_examples=40, deadline=None)
    def check(data):
        point = data.draw(family.strategy())
        family.resolve(point)  # BadPoint if the strategy left the table's domain
        assert isinstance(family.static_model(point).hazardous, bool)

    check()


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.binary], ids=[f.name for f in FAMILIES if f.binary])
def test_runtime_families_list_every_parameter_and_name_their_anomalies(family: Family):
    assert set(family.runtime_params) == {p.name for p in family.params}
    assert set(family.harness_anomalies) <= set(family.counters)
    header = family.table_header()
    assert header.count('R"hz_table(') == 1 and HEADER_NAME in header and "kFamilyTableJson" in header


@pytest.mark.parametrize("family", [f for f in FAMILIES if not f.binary],
                         ids=[f.name for f in FAMILIES if not f.binary])
def test_static_families_define_every_parameter_of_their_point_build(family: Family):
    assert family.params and all(p.define for p in family.params)
    for v in family.variants:
        assert set(family.defines({"variant": v.name})) == {p.define for p in family.params}
        assert family.build_label({"variant": v.name}).startswith(family.name + "-HZ_")


# ------------------------------------------------------------------- the resolver --
def _pipeline() -> Family:
    return next(f for f in FAMILIES if f.name == "pipeline")


def test_resolve_applies_defaults_then_the_variant_preset_then_the_request():
    fam = _pipeline()
    assert fam.resolve({})["stages"] == 1  # the first variant (reference) is the default
    p = fam.resolve({"variant": "fixed", "ktiles": 7, "seed": 3})
    assert (p["stages"], p["copy"], p["ktiles"], p["tail"]) == (3, "cp_async", 7, "parity")
    assert "seed" not in p and "variant" not in p
    # a resolved point resolves to itself: what a reply's metrics.resolved is judged as
    assert fam.resolve(p) == p


@pytest.mark.parametrize("params, fragment", [
    ({"variant": "no_such_variant"}, "unknown variant 'no_such_variant'"),
    ({"variant": 3}, "variant must be a string"),
    ({"no_such_param": 1}, "unknown parameter 'no_such_param' in request"),
    ({"stages": 9}, "outside [1, 4]"),
    ({"stages": True}, "must be an integer"),
    ({"stages": 2.5}, "must be an integer"),
    ({"copy": "tma"}, "not one of the allowed values"),
    ({"copy": 1}, "must be a string"),
    ({"war_barrier": 1}, "must be true or false"),
])
def test_resolve_refuses_what_the_harness_refuses(params, fragment):
    with pytest.raises(BadPoint) as exc:
        _pipeline().resolve(params)
    assert fragment in str(exc.value)


def test_resolve_takes_an_integral_float_as_the_integer_the_harness_reads():
    assert _pipeline().resolve({"stages": 2.0})["stages"] == 2


# --------------------------------------------------------------------- the schema --
GOOD = """
name = "toy"
summary = "a toy family"
counters = ["spins"]
harness_anomalies = ["spins"]

[params.n]
kind = "int"
default = 1
min = 0
max = 4
doc = "how many"

[params.mode]
kind = "str"
default = "a"
choices = ["a", "b"]
doc = "which"

[param_sets.shared]
params = { n = 2, mode = "b" }

[variants.fixed]
role = "fixed"
description = "the fix"

[variants.broken]
role = "broken"
description = "the bug"
param_sets = ["shared"]
params = { n = 3 }
detected_by = ["stress"]
"""


def _table(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "toy" / TABLE_FILE
    path.parent.mkdir(exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def _load(path: Path) -> Family:
    return family_from_table(path, static_model=lambda p: StaticVerdict(False, ""), strategy=lambda: None)


def test_a_good_table_loads_with_its_param_sets_under_the_variants_own_fields(tmp_path):
    fam = _load(_table(tmp_path, GOOD))
    assert fam.variant("broken").params == {"n": 3, "mode": "b"}
    assert fam.source_dir == "toy" and fam.binary is None and fam.runtime_params == {}
    assert fam.resolve({"variant": "broken"}) == {"n": 3, "mode": "b"}


@pytest.mark.parametrize("edit, fragment", [
    (lambda t: t.replace('kind = "int"', 'kind = "float"'), "kind must be one of"),
    (lambda t: t.replace("default = 1\n", "default = 9\n"), "outside [0, 4]"),
    (lambda t: t.replace('choices = ["a", "b"]\n', ""), "a str needs its choices"),
    (lambda t: t.replace('doc = "which"', 'doc = "which"\ncolour = "red"'), "unknown key(s) colour"),
    (lambda t: t.replace('detected_by = ["stress"]', 'detected_by = ["luck"]'), "luck not one of"),
    (lambda t: t.replace('detected_by = ["stress"]', ""), "names the oracle(s) that detect it"),
    (lambda t: t.replace('description = "the fix"', 'description = "the fix"\ndetected_by = ["stress"]'),
     "only a broken variant is detected"),
    (lambda t: t.replace("params = { n = 3 }", "params = { n = 7 }"), "variants.broken"),
    (lambda t: t.replace("params = { n = 3 }", "params = { m = 1 }"), "unknown parameter 'm'"),
    (lambda t: t.replace('param_sets = ["shared"]', 'param_sets = ["nope"]'), "no param_sets.nope"),
    (lambda t: t.replace('harness_anomalies = ["spins"]', 'harness_anomalies = ["spinz"]'),
     "spinz is not"),
    (lambda t: t.replace('role = "fixed"', 'role = "broken"\ndetected_by = ["stress"]'),
     "one reference or fixed variant"),
    (lambda t: t.replace('name = "toy"', 'name = "toy"\nbinary = "toy"'), "no toy.cu beside the table"),
    (lambda t: t.replace('summary = "a toy family"', "summary = 3"), "summary must be a non-empty string"),
    (lambda t: t.replace("[params.n]", "[params.n\n"), "not TOML"),
])
def test_a_table_that_breaks_the_schema_is_refused_naming_file_and_key(tmp_path, edit, fragment):
    path = _table(tmp_path, edit(GOOD))
    with pytest.raises(FamilyTableError) as exc:
        _load(path)
    assert str(path) in str(exc.value) and fragment in str(exc.value)
