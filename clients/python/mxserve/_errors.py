"""MxserveError: what a call the daemon refused (or that never reached it) raises.

Both the client and its stream session raise it, so it lives below them both.
"""

from __future__ import annotations

import grpc

_STATUS_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}


class MxserveError(Exception):
    """A call failed. `code` is a grpc.StatusCode, `message` the daemon's words."""

    def __init__(self, code: grpc.StatusCode, message: str, rpc: str = ""):
        super().__init__(f"{rpc + ': ' if rpc else ''}{code.name}: {message}")
        self.code = code
        self.message = message
        self.rpc = rpc


def _status_code(value: int) -> grpc.StatusCode:
    return _STATUS_BY_VALUE.get(value, grpc.StatusCode.UNKNOWN)
