"""Loopback only: tests, benches and scripts talk to 127.0.0.1 (or ::1), never
another address, not even a documentation range "nothing routes to".

Two guards share what counts as loopback here:
- `find_off_loopback` scans source text for IPv4/IPv6 literals off loopback, and for the
  unspecified address (0.0.0.0) used anywhere but a bind or listen line
  (`tests/test_loopback_only.py` runs it over SCANNED);
- `guard_connects` makes every Python-level connect of the test process to an address off
  loopback (or a name lookup that would ask a DNS server) raise `OffLoopback` and records
  it, so that the test fails even where the code under test swallowed the error
  (`tests/conftest.py` installs it for the whole session).

Neither sees traffic that does not go through Python's `socket` module in this process:
Ray's C++ and gRPC, a subprocess (`python3 -m hazards ...`), a compiled program. Those are
kept on loopback by their arguments (`ray start --node-ip-address 127.0.0.1`, ...) and by
the source scan.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import socket
from pathlib import Path

from hazards.engine.executors.ray_executor import is_loopback_host as is_loopback

SCANNED = ("tests", "bench", "ci", "scripts", "stress", "hazards")

# Literals that appear in the scanned folders as documentation and are never connected to:
# {path relative to the repository root: {literal: why}}. Keep it short; each entry says why.
_GUARD_EXAMPLE = "an example the guard's own test parses; never connected to"
ALLOWED: dict[str, dict[str, str]] = {
    "tests/test_loopback_only.py": {lit: _GUARD_EXAMPLE for lit in (
        "10.0.0.5", "192.168.1.20", "0.0.0.0", "2001:db8::1", "fe80::1", "10.1.2.3")},
}
ALLOWED["tests/loopback.py"] = {lit: "named in ALLOWED" for listed in list(ALLOWED.values()) for lit in listed}

# A dotted quad not inside a longer dotted or word token (a version 1.2.3.4.5 is not one).
_IPV4 = re.compile(r"(?<![\w.])(\d{1,3}(?:\.\d{1,3}){3})(?![\w]|\.\d)")
# Colon-separated hex groups, not inside a word or a C++ scope (`std::`, `<unnamed>::f`);
# one with a dotted IPv4 tail (::ffff:a.b.c.d) is judged by its IPv4 part.
_IPV6 = re.compile(r"(?<![\w:.])((?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4})(?![\w:.])")
_BINDS = re.compile(r"bind|listen", re.IGNORECASE)
_SKIPPED_DIRS = {"__pycache__", "node_modules"}
_MAX_BYTES = 4 << 20


def _looks_like_ipv6(text: str) -> bool:
    """A colon-hex token that is meant as an IPv6 address, not a Python slice (`x[1::2]`,
    `x[10::20]`), a cgroup line (`0::/`) or a C++ scope (`<unnamed>::f`): it must parse, and
    have a group of 3 or more hex digits or at least 3 groups."""
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    groups = [g for g in text.split(":") if g]
    return bool(groups) and (max(len(g) for g in groups) >= 3 or len(groups) >= 3)


@dataclasses.dataclass(frozen=True)
class Finding:
    """An address literal off loopback at path:line."""

    path: str
    line: int
    literal: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.literal} ({self.why})"


def literals_off_loopback(text: str) -> list[tuple[int, str, str]]:
    """(line number, literal, why) of each address literal in `text` that is off loopback,
    or is the unspecified address on a line that neither binds nor listens."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in _IPV4.finditer(line):
            lit = m.group(1)
            try:
                ip = ipaddress.IPv4Address(lit)
            except ValueError:
                continue  # an octet over 255: not an address
            if ip.is_unspecified:
                if not _BINDS.search(line):
                    found.append((n, lit, "the unspecified address used as a destination"))
            elif not ip.is_loopback:
                found.append((n, lit, "an IPv4 address off loopback"))
        for m in _IPV6.finditer(line):
            lit = m.group(1)
            if _looks_like_ipv6(lit) and not is_loopback(lit):
                found.append((n, lit, "an IPv6 address off loopback"))
    return found


def find_off_loopback(root: Path, folders: tuple[str, ...] = SCANNED,
                      allowed: dict[str, dict[str, str]] | None = None) -> list[Finding]:
    """Every address literal off loopback in the text files under `root/<folder>` (hidden
    and cache folders skipped, binary files skipped), less those in `allowed`."""
    allowed = ALLOWED if allowed is None else allowed
    out: list[Finding] = []
    for folder in folders:
        for dirpath, dirnames, filenames in os.walk(root / folder):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in _SKIPPED_DIRS
                                 and not d.endswith(".egg-info"))
            for name in sorted(filenames):
                path = Path(dirpath) / name
                try:
                    if path.is_symlink() or path.stat().st_size > _MAX_BYTES:
                        continue
                    data = path.read_bytes()
                except OSError:
                    continue
                if b"\0" in data:
                    continue  # binary
                rel = path.relative_to(root).as_posix()
                for line, lit, why in literals_off_loopback(data.decode("utf-8", errors="replace")):
                    if lit not in allowed.get(rel, {}):
                        out.append(Finding(rel, line, lit, why))
    return out


class OffLoopback(RuntimeError):
    """A test tried to reach an address off loopback (or to resolve a name through DNS)."""


_REAL: dict[str, object] = {}
attempts: list[str] = []  # what was refused since the last `take_attempts`


def _refuse(what: str) -> None:
    message = (f"{what}: off loopback; tests, benches and scripts talk to 127.0.0.1 only "
               "(tests/loopback.py)")
    attempts.append(message)
    raise OffLoopback(message)


def _check_address(sock: socket.socket, address: object) -> None:
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return  # a unix socket, netlink, ...: local by nature
    host = address[0] if isinstance(address, tuple) and address else None
    if not isinstance(host, str) or not is_loopback(host):
        _refuse(f"connect to {address!r}")


def _connect(self: socket.socket, address: object) -> None:
    _check_address(self, address)
    return _REAL["connect"](self, address)


def _connect_ex(self: socket.socket, address: object) -> int:
    _check_address(self, address)
    return _REAL["connect_ex"](self, address)


def _create_connection(address: tuple, *args: object, **kwargs: object) -> socket.socket:
    if not is_loopback(address[0]):
        _refuse(f"create_connection to {address!r}")
    return _REAL["create_connection"](address, *args, **kwargs)


def _getaddrinfo(host: object, *args: object, **kwargs: object) -> list:
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if host is None or is_loopback(host):
        return _REAL["getaddrinfo"](host, *args, **kwargs)
    try:
        ipaddress.ip_address(host.strip("[]").split("%")[0])
        return _REAL["getaddrinfo"](host, *args, **kwargs)  # a literal: no lookup; a connect to it is judged
    except ValueError:
        pass
    if host.lower().rstrip(".").endswith(".invalid"):
        # RFC 6761: never resolves. Answered here, as a resolver must, without asking one.
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    _refuse(f"name lookup of {host!r} (a DNS query)")
    raise AssertionError("unreachable")


def guard_connects() -> None:
    """Route socket.socket.connect/connect_ex, socket.create_connection and socket.getaddrinfo
    of this process through the loopback check (idempotent)."""
    if _REAL:
        return
    _REAL.update(connect=socket.socket.connect, connect_ex=socket.socket.connect_ex,
                 create_connection=socket.create_connection, getaddrinfo=socket.getaddrinfo)
    socket.socket.connect = _connect
    socket.socket.connect_ex = _connect_ex
    socket.create_connection = _create_connection
    socket.getaddrinfo = _getaddrinfo


def unguard_connects() -> None:
    """Put the real functions back."""
    if not _REAL:
        return
    socket.socket.connect = _REAL["connect"]
    socket.socket.connect_ex = _REAL["connect_ex"]
    socket.create_connection = _REAL["create_connection"]
    socket.getaddrinfo = _REAL["getaddrinfo"]
    _REAL.clear()


def take_attempts() -> list[str]:
    """What was refused since the last call (and forget it)."""
    out = list(attempts)
    attempts.clear()
    return out
