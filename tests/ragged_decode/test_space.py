"""The ragged-decode megakernel target's configuration space (hazards.ragged_decode.space):
lengths from a distribution, the static model of the mishandlings, strategy points the
server accepts, and the server building the arena a request names (no GPU)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hazards.explore import explorable
from hazards.ragged_decode import space
from hazards.ragged_decode.check import handle
from hazards.ragged_decode.reference import CONTRACT_LENS


def test_lengths_come_from_the_distribution_and_its_seed():
    assert space.lens_of({}) == CONTRACT_LENS
    assert space.lens_of({"lens_scale": 8}) == [max(1, n // 8) for n in CONTRACT_LENS]
    assert space.lens_of({"dist": "equal", "batch": 3, "max_len": 100}) == [100, 100, 100]
    one = space.lens_of({"dist": "one_long", "batch": 5, "max_len": 9000, "lens_seed": 4})
    assert one[0] == 9000 and all(1 <= n <= 64 for n in one[1:])
    assert space.lens_of({"dist": "with_empty", "batch": 8, "lens_seed": 1})[3::4] == [0, 0]
    u = {"dist": "uniform", "batch": 10, "max_len": 500, "lens_seed": 9}
    assert space.lens_of(u) == space.lens_of(u) != space.lens_of({**u, "lens_seed": 10})


def test_the_model_calls_a_mishandling_hazardous_only_where_it_bites():
    assert not space.static_model({"variant": "reference"}).hazardous
    assert space.static_model({"variant": "clamp8192"}).rate == 1.0  # the contract holds 16k-64k requests
    short = {"variant": "clamp8192", "dist": "equal", "batch": 4, "max_len": 8192}
    assert not space.static_model(short).hazardous  # nothing above the clamp: clamping changes nothing
    assert space.static_model({**short, "max_len": 8193}).hazardous
    assert space.static_model({**short, "max_len": 8193, "lens_scale": 2}).hazardous is False  # clamp scales too
    lone = {"variant": "ignore_starts", "dist": "equal", "batch": 1}
    assert not space.static_model(lone).hazardous and space.static_model({**lone, "batch": 2}).rate == 1.0
    big = {"dist": "equal", "batch": 256, "max_len": 65536}
    assert "refuses" in space.static_model(big).reason and not space.static_model(big).hazardous


@given(st.data())
@settings(max_examples=60, deadline=None, database=None)
def test_strategy_points_resolve_and_get_a_rate(data):
    point = data.draw(space.strategy())
    verdict = space.static_model(point)
    assert verdict.expected_rate in (0.0, 1.0)
    item = space.item_for(point)
    assert item.params["mishandle"] in space.MISHANDLINGS and item.argv[-2:] == ("hazards.ragged_decode.check", "--serve")


class FakeChecker:
    def __init__(self) -> None:
        self.configs, self.calls = [], []

    def configured(self, config, lens_scale=1):
        self.configs.append((config, lens_scale))
        return self

    def batch(self, calls, seed, mishandle, repeat=1):
        self.calls.append((calls, seed, mishandle))
        return {"launches": calls, "mismatched": 0}


def test_the_server_builds_the_configuration_a_request_names():
    fake = FakeChecker()
    point = {"dist": "equal", "batch": 2, "max_len": 64, "grid": 7, "split_tokens": 512, "schedule": "guided"}
    reply = handle(fake, {"id": 1, "launches": 2, "params": {**point, "mishandle": "ignore_starts"}})
    assert reply["status"] == "ok" and fake.calls == [(2, 1, "ignore_starts")]
    assert fake.configs == [({"lens": [64, 64], "grid": 7, "split_tokens": 512, "schedule": "guided"}, 1)]


@pytest.mark.parametrize("params, says", [({"dist": "lognormal"}, "not one of the allowed values"),
                                          ({"dist": "equal", "batch": 256, "max_len": 65536}, "more than the server")])
def test_a_configuration_the_server_cannot_build_is_a_bad_request(params, says):
    fake = FakeChecker()
    reply = handle(fake, {"id": 1, "launches": 1, "params": params})
    assert reply["status"] == "bad_request" and says in reply["message"] and fake.calls == []


def test_explore_knows_the_target_by_name():
    fam, item_for = explorable("ragged_decode")
    assert fam is space.SPACE and item_for is space.item_for
