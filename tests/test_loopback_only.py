"""Loopback only: no address off loopback in tests, benches, CI, scripts or the
engine's source, and no Python-level connect off loopback during the test run."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

import loopback
from loopback import OffLoopback, find_off_loopback, literals_off_loopback

REPO = Path(__file__).resolve().parents[1]
# Built at run time so that this file does not carry the literal it checks the guard finds.
TEST_NET_3 = ".".join(("203", "0", "113", "1"))


def test_no_address_off_loopback_in_tests_benches_ci_scripts_or_the_engine():
    found = find_off_loopback(REPO)
    assert not found, "addresses off loopback (make the case on 127.0.0.1, or allow-list a documentation " \
                      "string in tests/loopback.py ALLOWED):\n" + "\n".join(map(str, found))


def test_every_allow_listed_literal_is_still_there():
    """An allow-list entry whose literal left its file is stale: remove it."""
    for rel, literals in loopback.ALLOWED.items():
        text = (REPO / rel).read_text(errors="replace")
        for lit, why in literals.items():
            assert lit in text and why, f"{rel}: allow-listed {lit} is no longer there"


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_the_guard_finds_a_test_net_address_put_back_into_a_test(tmp_path):
    root = _tree(tmp_path, {
        "tests/ray/test_address.py": f'probe_address("{TEST_NET_3}:6379", timeout=1.0)\n',
        "tests/ok.py": 'probe_address("127.0.0.1:6379"); x[1::2]; y[10::20]; std::vector<int> v;\n'
                       'srv.bind(("0.0.0.0", 0))  # listening on every interface sends nothing\n',
        "docs/elsewhere.md": f"{TEST_NET_3} is outside the scanned folders\n",
    })
    found = find_off_loopback(root)
    assert [(f.path, f.line, f.literal) for f in found] == [("tests/ray/test_address.py", 1, TEST_NET_3)]
    assert "off loopback" in str(found[0])


@pytest.mark.parametrize("line, literal", [
    ('ray.init(address="10.0.0.5:6379")', "10.0.0.5"),
    ("ssh 192.168.1.20 nvidia-smi", "192.168.1.20"),
    ('connect(("0.0.0.0", 80))', "0.0.0.0"),
    ('host = "[2001:db8::1]:6379"', "2001:db8::1"),
    ("curl http://[fe80::1]/", "fe80::1"),
    ('addr = "::ffff:10.1.2.3"', "10.1.2.3"),
])
def test_the_guard_finds_each_form_of_address_off_loopback(line, literal):
    assert [lit for _, lit, _ in literals_off_loopback(line)] == [literal]


@pytest.mark.parametrize("line", [
    "127.0.0.1:6379", "127.1.2.3", "[::1]:6379", "::ffff:127.0.0.1", "version 2.60.0.1.4", "x[0::2], x[1::2]",
    "12:00:01", "0::/system.slice", "999.1.1.1", 'sock.bind(("0.0.0.0", 0))', "std::vector", "asm(\"\" :: \"r\"(a))",
])
def test_the_guard_lets_loopback_and_look_alikes_pass(line):
    assert literals_off_loopback(line) == []


def test_an_allow_listed_documentation_string_passes_and_only_in_its_file(tmp_path):
    text = f'EXAMPLE = "{TEST_NET_3}:6379"  # shown in --help, never connected to\n'
    root = _tree(tmp_path, {"hazards/cli/x.py": text, "hazards/cli/y.py": text})
    found = find_off_loopback(root, allowed={"hazards/cli/x.py": {TEST_NET_3: "a --help example"}})
    assert [f.path for f in found] == ["hazards/cli/y.py"]


def test_the_scan_skips_binary_files_and_hidden_or_cache_folders(tmp_path):
    root = _tree(tmp_path, {"bench/.venv/x.py": f"'{TEST_NET_3}'", "bench/__pycache__/x.py": f"'{TEST_NET_3}'"})
    (root / "bench" / "blob.bin").write_bytes(b"\0" + TEST_NET_3.encode())
    assert find_off_loopback(root) == []


# The session fixture (tests/conftest.py). UDP sockets: a connect sends no packet, so these
# tests leave loopback even if the guard were missing.

def _udp() -> socket.socket:
    return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)


def test_a_connect_off_loopback_fails_loudly_and_fails_the_test_even_if_caught():
    with _udp() as s, pytest.raises(OffLoopback, match=f"{TEST_NET_3}.*off loopback"):
        s.connect((TEST_NET_3, 6379))
    with _udp() as s, pytest.raises(OffLoopback):
        s.connect_ex((TEST_NET_3, 6379))
    # Caught by the code under test or not, the attempt is recorded for the test's teardown.
    assert len(loopback.take_attempts()) == 2


def test_a_connect_to_loopback_goes_through():
    with _udp() as s:
        s.connect(("127.0.0.1", 9))
        assert s.connect_ex(("127.0.0.1", 9)) == 0
    assert loopback.take_attempts() == []


def test_create_connection_off_loopback_is_refused_before_any_packet(monkeypatch):
    assert socket.create_connection is not loopback._REAL["create_connection"], "the session guard is not on"
    reached = []
    monkeypatch.setitem(loopback._REAL, "create_connection", lambda *a, **k: reached.append(a))
    with pytest.raises(OffLoopback):
        socket.create_connection((TEST_NET_3, 6379), timeout=0.1)
    assert reached == []
    loopback.take_attempts()


def test_a_name_lookup_is_refused_except_loopback_names_and_dot_invalid():
    with pytest.raises(OffLoopback, match="DNS"):
        socket.getaddrinfo("example.com", 80)
    loopback.take_attempts()
    with pytest.raises(socket.gaierror):  # RFC 6761: answered here, no resolver asked
        socket.getaddrinfo("no-such-host.invalid", 80)
    assert socket.getaddrinfo("localhost", 80)
    assert loopback.take_attempts() == []
