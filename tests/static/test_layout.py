"""Barrier layout checker: the MoE barrier report's layouts, line/sector sizes, loaders, and a
brute-force oracle."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings

from hazards.static import layout
from hazards.static.layout import Layout, Slot
from hazards.strategies.static import layout_hazards, layouts
from static_helpers import DATA, failing_ids
from hazards.engine.errors import UserError


def ids(lay: Layout) -> set[str]:
    return failing_ids(layout.check_layout(lay))


def test_moe_barrier_before_the_fix_loses_releases():
    found = layout.check_layout_file(DATA / "moe_barrier_before.toml")
    wt = [f for f in found if f.check == "layout-wt-l2-line"]
    assert len(wt) == 2 and all(f.severity == "error" for f in wt)  # one per expert's line
    assert "release[0]" in wt[0].message and "arrivals" in wt[0].message
    assert "and 7 more slot pair(s)" in wt[0].message


def test_a_layout_with_many_slots_gives_one_finding_per_pair_of_barriers_not_per_pair_of_slots():
    # 16 barriers of 8 atomic words, two barriers per 64-B line: pairwise reporting gave
    # 8 x 8 slot pairs per line (512 findings); one per pair of barriers gives 8
    slots = tuple(Slot(f"b{k}[{w}]", 32 * k + 4 * w, 4, "atomic", f"b{k}") for k in range(16) for w in range(8))
    found = layout.check_layout(Layout(slots, "amd"))
    assert len(found) == 8 and "and 63 more slot pair(s)" in found[0].message
    assert all(f.check == "layout-false-sharing" and f.severity == "warning" for f in found)
    nvidia = layout.check_layout(Layout(slots, "nvidia"))
    assert nvidia and all(f.severity == "perf" and not f.fails for f in nvidia)


def test_moe_barrier_after_the_fix_is_clean():
    assert failing_ids(layout.check_layout_file(DATA / "moe_barrier_after.toml")) == set()


def test_amd_lines_are_64_bytes_and_nvidia_lines_128():
    pair = (Slot("flag", 0, 4, "write_through"), Slot("ctr", 64, 4, "atomic"))
    assert ids(Layout(pair, "amd")) == set()
    nv = layout.check_layout(Layout(pair, "nvidia"))
    assert [(f.check, f.severity) for f in nv] == [("layout-wt-l2-line", "warning")]


def test_false_sharing_between_unrelated_barriers_names_the_sector_on_nvidia():
    a, b = Slot("a", 0, 4, "atomic", "A"), Slot("b", 40, 4, "atomic", "B")
    (f,) = layout.check_layout(Layout((a, b), "nvidia"))
    assert f.check == "layout-false-sharing" and "32-B sector" not in f.message
    (g,) = layout.check_layout(Layout((a, Slot("b", 28, 4, "atomic", "B")), "nvidia"))
    assert "32-B sector" in g.message
    assert ids(Layout((a, Slot("b", 0 + 128, 4, "atomic", "B")), "nvidia")) == set()


def test_same_barrier_atomics_in_one_line_are_fine():
    assert ids(Layout((Slot("a", 0, 4, "atomic"), Slot("b", 4, 4, "atomic")))) == set()


def test_overlapping_and_misaligned_slots_are_errors():
    assert ids(Layout((Slot("a", 0, 8, "plain"), Slot("b", 4, 4, "plain")))) == {"layout-overlap"}
    assert ids(Layout((Slot("a", 62, 4, "atomic"),))) == {"layout-misaligned"}


def test_smaller_base_alignment_means_may_share():
    pair = (Slot("flag", 0, 4, "write_through"), Slot("ctr", 60, 4, "atomic"))
    assert ids(Layout(pair, "amd")) == {"layout-wt-l2-line"}
    far = (Slot("flag", 4, 4, "write_through"), Slot("ctr", 64, 4, "atomic"))
    assert ids(Layout(far, "amd", base_align=4)) == {"layout-wt-l2-line"}
    assert ids(Layout(far, "amd", base_align=64)) == set()


def test_json_layouts_load_like_toml(tmp_path):
    p = tmp_path / "b.json"
    p.write_text(json.dumps({"platform": "amd", "slots": [
        {"name": "rel", "offset": 0, "size": 4, "count": 8, "stride": 4, "access": "write_through"},
        {"name": "ctr", "offset": 32, "size": 4, "access": "atomic"}]}))
    assert failing_ids(layout.check_layout_file(p)) == {"layout-wt-l2-line"}


@pytest.mark.parametrize("text,msg", [
    ("platform = 'amd'\n", "non-empty `slot`"),
    ("[[slot]]\nname='a'\noffset=0\nsize=4\naccess='weird'\n", "access must be one of"),
    ("[[slot]]\nname='a'\nsize=4\naccess='plain'\n", "lacks offset"),
    ("platform = 'tpu'\n[[slot]]\nname='a'\noffset=0\nsize=4\naccess='plain'\n", "platform must be"),
    ("this is = = not toml", "cannot parse"),
])
def test_bad_layout_files_are_one_line_user_errors(refuses_file, text, msg):
    refuses_file(layout.check_layout_file, text, msg)


def test_missing_layout_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no such layout file"):
        layout.load_layout(tmp_path / "none.toml")


def test_layout_tables_read_back_from_compiler_output():
    amd = "_ZL17hz_barrier_layout:\n\t.long\t0\n\t.long\t4\n\t.long\t1\n\t.long\t0\n\t.size x\n"
    assert layout.table_from_amdgcn(amd) == [(0, 4, 1, 0)]
    ptx = ".global .align 4 .b8 hz_barrier_layout[8] = {32, 0, 0, 0, 4, 0, 0, 0};"
    assert layout.table_from_ptx(ptx) == [] and layout.table_from_ptx(ptx.replace("[8]", "[16]")
                                                                      .replace("0};", "0, 0, 0, 0, 0, 1, 0, 0, 0};")) == [(32, 4, 0, 1)]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(layouts())
def test_checker_agrees_with_a_byte_level_oracle(lay):
    assert ids(lay) == layout_hazards(lay)
