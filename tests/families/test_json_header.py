"""standalone/common/json.h: the harness's JSON reader/writer, driven from Python."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def driver(tmp_path_factory, request):
    import shutil

    cxx = shutil.which("g++") or shutil.which("clang++") or shutil.which("clang++-19")
    if cxx is None:
        pytest.skip("no host C++ compiler (g++/clang++) to build the JSON test driver")
    exe = tmp_path_factory.mktemp("json") / "json_driver"
    subprocess.run([cxx, "-std=c++17", "-O1", "-o", str(exe), str(HERE / "json_driver.cpp")], check=True,
                   capture_output=True, timeout=120)
    return exe


def roundtrip(driver, *lines: str) -> list[str]:
    out = subprocess.run([str(driver)], input="\n".join(lines) + "\n", capture_output=True, text=True,
                         timeout=30, check=True)
    return out.stdout.splitlines()


@pytest.mark.parametrize("text", [
    '{"id":17,"launches":1000,"params":{"variant":"broken_war","stages":2,"jitter":1}}',
    '{"a":[1,2,{"b":null}],"t":true,"f":false,"s":"x"}',
    '{"neg":-3,"frac":0.5,"exp":1.5e-07,"big":4503599627370496}',
    '{"esc":"quote \\" backslash \\\\ newline \\n tab \\t"}',
    '{"unicode":"\\u00e9\\u4e2d\\ud83d\\ude00"}',
    '{}',
])
def test_valid_json_round_trips_to_the_same_value(driver, text):
    (out,) = roundtrip(driver, text)
    assert json.loads(out) == json.loads(text)


@pytest.mark.parametrize("text, fragment", [
    ('{"a":1', "expected ',' or '}'"),
    ('{"a" 1}', "expected ':'"),
    ('{"a":1} x', "trailing characters"),
    ('{"a":"unterminated', "unterminated string"),
    ('{"a":tru}', "bad number"),
    ('{"a":"\\q"}', "bad escape"),
    ('[1 2]', "expected ',' or ']'"),
    ('{"a":1,}', "expected string"),
    ('[' * 40 + ']' * 40, "nesting too deep"),
    ('', "unexpected end of input"),
])
def test_invalid_json_is_rejected_with_a_reason(driver, text, fragment):
    (out,) = roundtrip(driver, text)
    assert out.startswith("ERR ") and fragment in out


def test_non_finite_numbers_are_written_as_null(driver):
    (out,) = roundtrip(driver, '{"x":1e999}')
    assert json.loads(out) == {"x": None}


def test_every_json_escape_is_read_as_the_byte_it_stands_for(driver):
    (out,) = roundtrip(driver, '["\\"\\\\\\/\\b\\f\\n\\r\\t"]')
    assert json.loads(out) == ['"\\/\b\f\n\r\t']


def test_the_writer_escapes_exactly_quote_backslash_newline_cr_tab_and_other_controls_as_u00xx(driver):
    every_ascii = "".join(chr(c) for c in range(128))
    (out,) = roundtrip(driver, json.dumps({"s": every_ascii}))
    short = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    written = "".join(short.get(ch) or (f"\\u{ord(ch):04x}" if ord(ch) < 0x20 else ch) for ch in every_ascii)
    assert out == '{"s":"' + written + '"}'
