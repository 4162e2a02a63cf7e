"""Messages between the grader and the student's process.

A message is a ``torch.save`` payload (nested dicts, lists, tuples, str, int, float, bool, None and
tensors) prefixed by its length in 8 bytes. The grader reads it with ``torch.load(weights_only=True)``,
which builds no object of any other type, then ``clean`` checks every value against the limits below and
copies every tensor into storage of its own. A value the grader will not use (a complex tensor, an
enormous int) becomes ``Unsupported``; a frame that breaks the format raises ``ProtocolError``.
"""

from __future__ import annotations

import io
import select
import socket
import struct
import time

import torch

MAX_FRAME = 96 << 20  # bytes per message
MAX_ELEMENTS = 1 << 25  # tensor elements per message, all tensors together
MAX_NODES = 200_000  # values per message
MAX_DEPTH = 40
MAX_TEXT = 200_000  # characters per string
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64,
          torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool)
_HEADER = struct.Struct(">Q")


class ProtocolError(Exception):
    """The other side sent something that is not a valid message."""


class Unsupported:
    """A value the student's process sent that the grader does not use; ``what`` describes it."""

    def __init__(self, what: str):
        self.what = what

    def __repr__(self) -> str:
        return f"<unsupported value: {self.what}>"


def send(sock: socket.socket, message, timeout: float | None = None) -> None:
    buf = io.BytesIO()
    torch.save(message, buf)
    data = buf.getvalue()
    if len(data) > MAX_FRAME:
        raise ProtocolError(f"a message of {len(data):,} bytes is over the {MAX_FRAME:,}-byte limit")
    sock.settimeout(timeout)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _read(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    chunks, left = [], n
    while left:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([sock], [], [], remaining)[0]:
                raise TimeoutError("no reply in time")
        sock.settimeout(None)
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(sock: socket.socket, deadline: float | None = None):
    """The next message, raw (``torch.load`` with ``weights_only=True``); ``deadline`` is a
    ``time.monotonic()`` value. Raises TimeoutError, EOFError or ProtocolError."""
    (n,) = _HEADER.unpack(_read(sock, _HEADER.size, deadline))
    if n > MAX_FRAME:
        raise ProtocolError(f"a message announced as {n:,} bytes is over the {MAX_FRAME:,}-byte limit")
    data = _read(sock, n, deadline)
    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except Exception as err:  # anything torch's safe unpickler refuses
        raise ProtocolError(f"an unreadable message ({type(err).__name__}: {str(err)[:200]})") from None


def clean(value):
    """A checked copy of a received message: only the allowed types, within the limits, tensors as
    plain, contiguous CPU tensors in storage of their own."""
    budget = {"nodes": MAX_NODES, "elements": MAX_ELEMENTS}
    return _clean(value, 0, budget)


def _clean(v, depth: int, budget: dict):
    budget["nodes"] -= 1
    if budget["nodes"] < 0 or depth > MAX_DEPTH:
        raise ProtocolError("a message nested too deep or with too many values")
    if v is None or type(v) in (bool, float):
        return v
    if type(v) is int:
        return v if abs(v) < 1 << 256 else Unsupported("an int with more than 256 bits")
    if type(v) is str:
        if len(v) > MAX_TEXT:
            return v[:MAX_TEXT] + " [...]"
        return v
    if isinstance(v, torch.Tensor):
        return _clean_tensor(v, budget)
    if type(v) in (list, tuple):
        items = [_clean(x, depth + 1, budget) for x in v]
        return items if type(v) is list else tuple(items)
    if isinstance(v, dict):
        out = {}
        for key, item in v.items():
            if type(key) is not str or len(key) > 1000:
                raise ProtocolError("a dict key that is not a short string")
            out[key] = _clean(item, depth + 1, budget)
        return out
    return Unsupported(type(v).__name__)


def _clean_tensor(t: torch.Tensor, budget: dict):
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided or t.device.type != "cpu":
        return Unsupported(f"a {type(t).__name__} with layout {t.layout} on {t.device}")
    if t.is_quantized or t.dtype not in DTYPES:
        return Unsupported(f"a {str(t.dtype).removeprefix('torch.')} tensor")
    budget["elements"] -= t.numel()
    if budget["elements"] < 0:
        raise ProtocolError(f"tensors of more than {MAX_ELEMENTS:,} elements in one message")
    return t.detach().clone(memory_format=torch.contiguous_format)
