"""The server-target JSON-lines protocol, version 1 (docs/protocol.md): encoding and validation.

Pure functions, no I/O: the server target (stress/targets/server.py) reads and writes the
pipes; this module decides whether a line *is* the protocol. Every violation raises
`ProtocolError` with a short message that becomes the run's reason ("protocol error: ...").
"""
from __future__ import annotations

import json
from typing import Any

from .errors import ProtocolError

PROTOCOL_VERSION = 1
# Library banners a server may print on stdout before its handshake (docs/protocol.md).
MAX_BANNER_LINES = 100
# A line longer than this is garbage, not a reply: it bounds the supervisor's buffer.
MAX_LINE_BYTES = 1 << 20
REPLY_STATUSES = ("ok", "fault", "bad_reference", "bad_request", "unsupported")
# Shown in reasons and evidence: enough to recognise the garbage, bounded for the store.
_SHOWN_CHARS = 200

_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def shown(line: bytes | str) -> str:
    """A bounded, printable rendering of a raw line for reasons and evidence."""
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    text = text.rstrip("\n")
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def encode(obj: dict[str, Any]) -> bytes:
    """One protocol line: compact JSON, UTF-8, newline-terminated."""
    return (_encoder.encode(obj) + "\n").encode("utf-8")


def request(request_id: int, launches: int, params: dict[str, Any]) -> dict[str, Any]:
    """A request for one batch of `launches` launches with the family's run-time `params`."""
    return {"id": request_id, "launches": launches, "params": params}


def quit_request(request_id: int) -> dict[str, Any]:
    """The request that asks a server to exit 0."""
    return {"id": request_id, "cmd": "quit"}


def progress_request(request_id: int, label: Any) -> dict[str, Any]:
    """A server's progress line during request `request_id` (docs/stall.md)."""
    return {"id": request_id, "progress": label}


def progress_of(line: bytes) -> tuple[Any, str] | None:
    """(id, label) when `line` is a progress line ({"id": N, "progress": ...}, no status),
    else None. Cheap for replies: only a line that names "progress" is parsed here."""
    if b'"progress"' not in line:
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict) or "progress" not in obj or "status" in obj:
        return None
    label = obj["progress"]
    return obj.get("id"), label if isinstance(label, str) else json.dumps(label)


def is_banner(line: bytes) -> bool:
    """True for a pre-handshake line that is not protocol (does not start with `{`)."""
    return not line.lstrip().startswith(b"{")


def decode(line: bytes) -> dict[str, Any]:
    """Parse one complete line (with or without its newline) into a JSON object.

    Raises ProtocolError if it is not UTF-8, not JSON, or not a single JSON object.
    """
    if len(line) > MAX_LINE_BYTES:
        raise ProtocolError(f"line of {len(line)} bytes exceeds {MAX_LINE_BYTES}")
    try:
        obj = json.loads(line)
    except UnicodeDecodeError:
        raise ProtocolError(f"line is not UTF-8: {shown(line)!r}") from None
    except ValueError:
        raise ProtocolError(f"not JSON: {shown(line)!r}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"not a JSON object: {shown(line)!r}")
    return obj


def validate_handshake(obj: dict[str, Any]) -> dict[str, Any]:
    """Check a handshake object; return it. Raises ProtocolError on a missing or wrong version."""
    if "hz_protocol" not in obj:
        raise ProtocolError(f"handshake lacks hz_protocol: {shown(json.dumps(obj))!r}")
    version = obj["hz_protocol"]
    if type(version) is not int:
        raise ProtocolError(f"handshake hz_protocol is not an integer: {version!r}")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"server speaks hz_protocol {version}, this supervisor speaks {PROTOCOL_VERSION}")
    uuid = obj.get("gpu_uuid")
    if uuid is not None and not isinstance(uuid, str):
        raise ProtocolError(f"handshake gpu_uuid is not a string: {uuid!r}")
    return obj


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


COUNT_FIELDS = ("launches", "mismatched", "bad_elements")
NUMBER_FIELDS = ("max_rel_err", "kernel_ms")


def field_problem(obj: dict[str, Any]) -> str | None:
    """Why the judged fields of a reply or a command's result line have the wrong type, or
    None: one rule for both (docs/protocol.md). `status` must be a known status, `ok` true
    or false, counts non-negative integers, `max_rel_err` / `kernel_ms` numbers (or null),
    `message` a string and `metrics` an object. Other keys are metrics, stored as given."""
    if "status" in obj and obj["status"] not in REPLY_STATUSES:
        return f"unknown status {shown(json.dumps(obj['status']))}"
    if "ok" in obj and type(obj["ok"]) is not bool:
        return f"ok is not true or false: {shown(json.dumps(obj['ok']))}"
    for key in COUNT_FIELDS:
        if key in obj and not _is_count(obj[key]):
            return f"{key} is not a non-negative integer: {shown(json.dumps(obj[key]))}"
    for key in NUMBER_FIELDS:
        if key in obj and obj[key] is not None and not _is_number(obj[key]):
            return f"{key} is not a number: {shown(json.dumps(obj[key]))}"
    if "message" in obj and not isinstance(obj["message"], str):
        return f"message is not a string: {shown(json.dumps(obj['message']))}"
    if "metrics" in obj and not isinstance(obj["metrics"], dict):
        return "metrics is not an object"
    return None


def validate_reply(obj: dict[str, Any], expected_id: int) -> dict[str, Any]:
    """Check a reply object against the request it answers; return it.

    Raises ProtocolError for a wrong or missing id, a missing or unknown status, an `ok`
    reply without an integer `mismatched`, or fields of the wrong type (`field_problem`).
    """
    if obj.get("id") != expected_id or type(obj.get("id")) is not int:
        raise ProtocolError(f"reply id {obj.get('id')!r}, expected {expected_id}")
    if obj.get("status") is None:
        raise ProtocolError("reply has no status")
    problem = field_problem(obj)
    if problem:
        raise ProtocolError(f"reply {problem}")
    if obj["status"] == "ok" and "mismatched" not in obj:
        # Without it an ok reply cannot be judged; guessing 0 would count it clean.
        raise ProtocolError("ok reply has no 'mismatched' count")
    return obj
