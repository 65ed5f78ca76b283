"""Messages between the processes of a job: JSON objects, each prefixed by its length.

JSON only (never pickle): a message from a stray or hostile connection can at worst be
refused. Values exchanged are small (flags, step numbers, checkpoint file lists).
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

#: Largest message accepted, in bytes; more means a confused or hostile peer.
MAX_MESSAGE = 16 * 1024 * 1024
_HEADER = struct.Struct(">I")

Message = dict[str, Any]


class WireError(Exception):
    """Internal: a peer sent something that is not a message of ours."""


def encode(message: Message) -> bytes:
    body = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    if len(body) > MAX_MESSAGE:
        raise ValueError(f"message of {len(body)} bytes is over the {MAX_MESSAGE} limit")
    return _HEADER.pack(len(body)) + body


def _decode(body: bytes) -> Message:
    try:
        message = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WireError(f"not JSON: {e}") from None
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise WireError("not a message (a JSON object with an 'op')")
    return message


class Framer:
    """Splits a byte stream into messages (for non-blocking readers)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        """Messages completed by ``data``.

        Raises:
            WireError: an oversized or malformed message.
        """
        self._buf += data
        out = []
        while len(self._buf) >= _HEADER.size:
            (n,) = _HEADER.unpack_from(self._buf)
            if n > MAX_MESSAGE:
                raise WireError(f"message of {n} bytes announced, over the limit")
            if len(self._buf) < _HEADER.size + n:
                break
            body = bytes(self._buf[_HEADER.size : _HEADER.size + n])
            del self._buf[: _HEADER.size + n]
            out.append(_decode(body))
        return out


def send(sock: socket.socket, message: Message) -> None:
    """Send one message (blocking).

    Raises:
        OSError: the connection is gone.
    """
    sock.sendall(encode(message))
