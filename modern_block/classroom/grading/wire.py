"""Messages between the grader and the student's process: no pickle, no compression, every size checked.

A frame is its length in 8 bytes (big-endian), then a safetensors buffer: tensor ``message`` (the JSON, ``U8``)
and tensors ``0``, ``1``, ...; the JSON holds a tensor as ``{"T": i}``, a tuple ``{"t": [...]}``, a dict
``{"d": {...}}``, a dtype ``{"dt": ...}``, a device ``{"dv": ...}``, an unused value ``{"u": ...}``. The frame,
header and tensor count are bounded before the library parses it; names, dtypes, elements and the JSON's values
before anything is built. A broken frame raises ``ProtocolError``.
"""

from __future__ import annotations

import json
import math
import select
import socket
import struct
import time

import torch
from safetensors import SafetensorError, deserialize

MAX_FRAME = 96 << 20  # bytes per message
MAX_HEADER = 8 << 20  # bytes of JSON per message (the safetensors header, and the message)
MAX_ELEMENTS = 1 << 25  # tensor elements per message, all tensors together
MAX_TENSORS = 10_000
MAX_NODES = 200_000  # values per message
MAX_DEPTH = 40
MAX_TEXT = 200_000  # characters per string
MAX_DIGITS = 78  # an int of more than 256 bits is no exercise's answer
DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
          "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8,
          "BOOL": torch.bool}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}
_HEADER = struct.Struct(">Q")
_ST_HEADER = struct.Struct("<Q")
MESSAGE = "message"  # the tensor holding the message's JSON


class ProtocolError(Exception):
    """The other side sent something that is not a valid message."""


class Unsupported:
    """A value the student's process sent that the grader does not use; ``what`` describes it."""

    def __init__(self, what: str):
        self.what = what

    def __repr__(self) -> str:
        return f"<unsupported value: {self.what}>"


def encode(message) -> bytearray:
    """The payload of one frame, its tensors' bytes copied once, straight into it (raises ProtocolError for a
    message over the limits)."""
    tensors: list[torch.Tensor] = []
    budget = {"nodes": MAX_NODES, "elements": MAX_ELEMENTS}
    tree = json.dumps(_encode(message, 0, budget, tensors), separators=(",", ":")).encode()
    header: dict = {MESSAGE: {"dtype": "U8", "shape": [len(tree)], "data_offsets": [0, len(tree)]}}
    offset = len(tree)
    for i, t in enumerate(tensors):
        size = t.numel() * t.element_size()
        header[str(i)] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    start = _ST_HEADER.size + len(text)
    if len(text) > MAX_HEADER or len(tree) > MAX_HEADER or start + offset > MAX_FRAME:
        raise ProtocolError(f"a message of {start + offset:,} bytes is over the limits")
    data = bytearray(start + offset)
    view = memoryview(data)  # (a bytearray's own slice assignment would copy the source first)
    view[:start] = _ST_HEADER.pack(len(text)) + text
    view[start:start + len(tree)] = tree
    for i, t in enumerate(tensors):
        begin, end = header[str(i)]["data_offsets"]
        if end > begin:
            view[start + begin:start + end] = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().data
    view.release()
    return data


def _encode(v, depth: int, budget: dict, tensors: list):
    budget["nodes"] -= 1
    if budget["nodes"] < 0 or depth > MAX_DEPTH:
        raise ProtocolError("a message nested too deep or with too many values")
    if type(v) is int and v.bit_length() > 256:
        return {"u": "an int with more than 256 bits"}
    if v is None or type(v) in (bool, int, float, str):
        return v[:MAX_TEXT] if type(v) is str else v
    if type(v) is list:
        return [_encode(x, depth + 1, budget, tensors) for x in v]
    if type(v) in (tuple, torch.Size):
        return {"t": [_encode(x, depth + 1, budget, tensors) for x in v]}
    if isinstance(v, torch.dtype):
        return {"dt": str(v).removeprefix("torch.")}
    if isinstance(v, torch.device):
        return {"dv": str(v)}
    if type(v) is dict:
        if not all(type(k) is str and len(k) <= 1000 for k in v):
            raise ProtocolError("a dict key that is not a short string")
        return {"d": {k: _encode(x, depth + 1, budget, tensors) for k, x in v.items()}}
    if isinstance(v, Unsupported):
        return {"u": v.what[:200]}
    if isinstance(v, torch.Tensor):
        if type(v) not in (torch.Tensor, torch.nn.Parameter) or v.layout != torch.strided or v.device.type != "cpu" \
                or v.is_quantized:
            return {"u": f"a {type(v).__name__} with layout {v.layout} on {v.device}"}
        if v.dtype not in _NAMES:
            return {"u": f"a {str(v.dtype).removeprefix('torch.')} tensor"}
        budget["elements"] -= v.numel()  # before any copy: an expanded view counts what it claims
        if budget["elements"] < 0:
            raise ProtocolError(f"tensors of more than {MAX_ELEMENTS:,} elements in one message")
        tensors.append(v)
        return {"T": len(tensors) - 1}
    raise ProtocolError(f"a {type(v).__name__} cannot be sent")


def send(sock: socket.socket, message, timeout: float | None = None) -> None:
    data = encode(message)
    sock.settimeout(timeout)
    sock.sendall(_HEADER.pack(len(data)))
    sock.sendall(data)


def _read(sock: socket.socket, n: int, deadline: float | None) -> bytearray:
    buf = bytearray(n)  # n is checked against the limits before this
    view, got = memoryview(buf), 0
    while got < n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([sock], [], [], remaining)[0]:
                raise TimeoutError("no reply in time")
        sock.settimeout(None)
        k = sock.recv_into(view[got:], min(n - got, 1 << 20))
        if not k:
            raise EOFError("the other side closed the connection")
        got += k
    return buf


def receive(sock: socket.socket, deadline: float | None = None):
    """The next message; ``deadline`` is a ``time.monotonic()`` value for the wait and the decoding alike.
    Raises TimeoutError, EOFError or ProtocolError."""
    (n,) = _HEADER.unpack(_read(sock, _HEADER.size, deadline))
    if n > MAX_FRAME:
        raise ProtocolError(f"a message announced as {n:,} bytes is over the {MAX_FRAME:,}-byte limit")
    frame = bytes(_read(sock, n, deadline))  # what the library reads (the received buffer let go)
    parsed = _parse(frame)
    del frame  # the tensors are built on the library's copies alone
    message = _build(*parsed)
    if deadline is not None and time.monotonic() > deadline:
        raise TimeoutError("the reply took too long to read")
    return message


def _int(text: str):
    return int(text) if len(text.lstrip("-")) <= MAX_DIGITS else Unsupported("an int with more than 256 bits")


def decode(data: bytes | bytearray):
    """The message in one frame's payload (see the module's docstring for the checks)."""
    return _build(*_parse(bytes(data)))


def _parse(data: bytes) -> tuple[bytes, list[tuple[torch.dtype, list[int], bytearray]]]:
    """The message's JSON text and each tensor's (dtype, shape, bytes), as the safetensors library reads them,
    bounded before and checked after."""
    if len(data) < _ST_HEADER.size:
        raise ProtocolError("a message shorter than its header")
    (h,) = _ST_HEADER.unpack_from(data)
    if h > MAX_HEADER or _ST_HEADER.size + h > len(data):
        raise ProtocolError(f"a header announced as {h:,} bytes (the limit: {MAX_HEADER:,}, the frame: {len(data):,})")
    if data.count(b"{", _ST_HEADER.size, _ST_HEADER.size + h) > MAX_TENSORS + 2:  # each tensor's entry has one
        raise ProtocolError(f"a header naming more than {MAX_TENSORS:,} tensors")
    try:
        entries = dict(deserialize(data))
    except SafetensorError as err:
        raise ProtocolError(f"not a valid safetensors frame ({' '.join(str(err).split())[:200]})") from None
    names = {str(i) for i in range(len(entries) - 1)} | {MESSAGE}
    if set(entries) != names:
        raise ProtocolError("tensors other than the message and 0, 1, 2, ...")
    text = entries.pop(MESSAGE)
    if text["dtype"] != "U8" or len(text["shape"]) != 1 or len(text["data"]) > MAX_HEADER:
        raise ProtocolError("a message that is not JSON text of at most 8 MB")
    plan, elements = [], 0
    for i in range(len(entries)):
        entry = entries.pop(str(i))
        if entry["dtype"] not in DTYPES or len(entry["shape"]) > 16:
            raise ProtocolError(f"tensor {i}: a dtype the grader does not take ({str(entry['dtype'])[:20]}) or "
                                "more than 16 dimensions")
        elements += math.prod(entry["shape"])
        if elements > MAX_ELEMENTS:
            raise ProtocolError(f"tensors of more than {MAX_ELEMENTS:,} elements in one message")
        plan.append((DTYPES[entry["dtype"]], entry["shape"], entry["data"]))
    return bytes(text["data"]), plan


def _build(text: bytes, plan: list[tuple[torch.dtype, list[int], bytearray]]):
    """The message from its parsed parts: each tensor on the library's copy of its bytes (no further copy)."""
    if text.count(b"[") + text.count(b"{") + text.count(b",") > 4 * MAX_NODES:
        raise ProtocolError("a message with too many values")
    try:
        tree = json.loads(text, parse_int=_int)
    except RecursionError:
        raise ProtocolError("a message nested too deep") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise ProtocolError(f"a message that is not valid JSON ({str(err)[:200]})") from None
    tensors = [torch.frombuffer(data, dtype=dtype).reshape(shape) if len(data) else torch.zeros(shape, dtype=dtype)
               for dtype, shape, data in plan]
    return _decode(tree, 0, {"nodes": MAX_NODES}, tensors)


def _decode(v, depth: int, budget: dict, tensors: list):
    budget["nodes"] -= 1
    if budget["nodes"] < 0 or depth > MAX_DEPTH:
        raise ProtocolError("a message nested too deep or with too many values")
    if v is None or type(v) in (bool, int, float) or isinstance(v, Unsupported):
        return v
    if type(v) is str:
        return v if len(v) <= MAX_TEXT else v[:MAX_TEXT] + " [...]"
    if type(v) is list:
        return [_decode(x, depth + 1, budget, tensors) for x in v]
    if type(v) is dict and len(v) == 1:
        (tag, body), = v.items()
        if tag == "t" and type(body) is list:
            return tuple(_decode(x, depth + 1, budget, tensors) for x in body)
        if tag == "d" and type(body) is dict:
            if not all(len(k) <= 1000 for k in body):
                raise ProtocolError("a dict key that is not a short string")
            return {k: _decode(x, depth + 1, budget, tensors) for k, x in body.items()}
        if tag == "T" and type(body) is int and 0 <= body < len(tensors):
            return tensors[body]
        if tag == "u" and type(body) is str:
            return Unsupported(body[:200])
        if tag == "dt" and type(body) is str and isinstance(getattr(torch, body[:40], None), torch.dtype):
            return getattr(torch, body)
        if tag == "dv" and type(body) is str and len(body) < 40:
            try:
                return torch.device(body)
            except RuntimeError:
                return Unsupported(f"a device {body!r}")
    raise ProtocolError("a value that is not part of the format")


def clean(value):
    """``value`` as the other side receives it: sent through the format (a checked copy, tensors in storage of
    their own)."""
    return decode(encode(value))
