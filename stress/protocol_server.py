"""The server side of the JSON-lines protocol (docs/protocol.md), for servers written in Python.

    def handler(request):                      # one batch: {"id", "launches", "params"}
        return {"status": "ok", "launches": request["launches"], "mismatched": 0}
More in docs/protocol.md.
"""
from __future__ import annotations

import json
import sys
from typing import Any, BinaryIO, Callable, Optional

from .protocol import PROTOCOL_VERSION, encode, progress_request

Reply = Optional[dict[str, Any]]
Handler = Callable[[dict[str, Any]], Reply]


_current: dict[str, Any] = {}  # the request being served and where to write: for `progress`


def progress(label: Any = "") -> None:
    """Report progress of the request being served (a no-op outside a handler)."""
    send = _current.get("send")
    if send is not None:
        send(progress_request(_current["id"], label))


class StopServing(Exception):
    """Raised by a handler: send `reply` (if any) for this request, then exit with `exit_code`."""

    def __init__(self, exit_code: int, reply: Reply = None) -> None:
        super().__init__(f"server stops with exit code {exit_code}")
        self.exit_code = exit_code
        self.reply = reply


def serve(handler: Handler, hello: Optional[dict[str, Any]], *,
          stdin: Optional[BinaryIO] = None, stdout: Optional[BinaryIO] = None) -> int:
    """Serve protocol-v1 requests from stdin on stdout; the exit code to end the process with.

    `hello` is the handshake (`hz_protocol` is added unless given; None sends none).
    `handler(request)` returns the reply without its id, or None to send nothing (a handler
    that wrote its own bytes). Returns 0 at a quit request or EOF, or `StopServing.exit_code`.
    """
    inp = stdin if stdin is not None else sys.stdin.buffer
    out = stdout if stdout is not None else sys.stdout.buffer

    def send(obj: dict[str, Any]) -> None:
        out.write(encode(obj))
        out.flush()

    if hello is not None:
        send({"hz_protocol": PROTOCOL_VERSION, **hello})
    for raw in inp:
        request = json.loads(raw)
        if request.get("cmd") == "quit":
            return 0
        _current.update(send=send, id=request.get("id"))
        try:
            reply = handler(request)
        except StopServing as stop:
            if stop.reply is not None:
                send({"id": request.get("id"), **stop.reply})
            return stop.exit_code
        finally:
            _current.clear()
        if reply is not None:
            send({"id": request.get("id"), **reply})
    return 0
