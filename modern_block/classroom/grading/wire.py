"""Messages between the grader and the student's process: no pickle, no compression, every size checked.

A frame is its length in 8 bytes (big-endian), then a safetensors buffer: an 8-byte little-endian header
length, a JSON header naming each tensor's dtype, shape and byte range, then the tensors' raw bytes. The
message itself (nested dicts, lists, tuples, str, int, float, bool, None) is JSON in the header's
``__metadata__``, each tensor standing there as ``{"T": index}``; a tuple is ``{"t": [...]}``, a dict
``{"d": {...}}``, a dtype ``{"dt": "float32"}``, a device ``{"dv": "cpu"}``, a value the grader does not use (a
complex tensor) ``{"u": "what it was"}``.

Reading is bounded before anything is allocated or walked: the frame (``MAX_FRAME``) and the header
(``MAX_HEADER``) by their announced lengths, the tensors by their declared dtypes, shapes and offsets, which
must tile the data exactly (so their total is the bytes received, never more); the JSON by an upper bound of
its values counted in its text, digits per integer (``parse_int``), then depth and values while it is turned
into the message. Nothing is ever decompressed or unpickled, so no reply costs the grader more than a small
multiple of its own length, and decoding (linear in that length) is checked against the same deadline as
the wait. A frame that breaks any rule raises ``ProtocolError``; a value the grader will not use becomes
``Unsupported``.
"""

from __future__ import annotations

import json
import math
import select
import socket
import struct
import time

import torch

MAX_FRAME = 96 << 20  # bytes per message
MAX_HEADER = 8 << 20  # bytes of JSON per message
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


class ProtocolError(Exception):
    """The other side sent something that is not a valid message."""


class Unsupported:
    """A value the student's process sent that the grader does not use; ``what`` describes it."""

    def __init__(self, what: str):
        self.what = what

    def __repr__(self) -> str:
        return f"<unsupported value: {self.what}>"


# ---- writing ---------------------------------------------------------------------------------------------


def encode(message) -> bytearray:
    """The payload of one frame, its tensors' bytes copied once, straight into it (raises ProtocolError for a
    message over the limits)."""
    tensors: list[torch.Tensor] = []
    budget = {"nodes": MAX_NODES, "elements": MAX_ELEMENTS}
    tree = _encode(message, 0, budget, tensors)
    header: dict = {"__metadata__": {"message": json.dumps(tree, separators=(",", ":"))}}
    offset = 0
    for i, t in enumerate(tensors):
        size = t.numel() * t.element_size()
        header[str(i)] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    start = _ST_HEADER.size + len(text)
    if len(text) > MAX_HEADER or start + offset > MAX_FRAME:
        raise ProtocolError(f"a message of {start + offset:,} bytes is over the limits")
    data = bytearray(start + offset)
    view = memoryview(data)  # (a bytearray's own slice assignment would copy the source first)
    view[:start] = _ST_HEADER.pack(len(text)) + text
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


# ---- reading ---------------------------------------------------------------------------------------------


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
    message = decode(_read(sock, n, deadline))
    if deadline is not None and time.monotonic() > deadline:
        raise TimeoutError("the reply took too long to read")
    return message


def _int(text: str):
    return int(text) if len(text.lstrip("-")) <= MAX_DIGITS else Unsupported("an int with more than 256 bits")


def _json(text: bytes, what: str):
    if text.count(b"[") + text.count(b"{") + text.count(b",") > 4 * MAX_NODES:
        raise ProtocolError(f"{what} with too many values")
    try:
        return json.loads(text, parse_int=_int)
    except RecursionError:
        raise ProtocolError(f"{what} nested too deep") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise ProtocolError(f"{what} that is not valid JSON ({str(err)[:200]})") from None


def decode(data: bytes | bytearray):
    """The message in one frame's payload (see the module's docstring for the checks)."""
    if isinstance(data, bytes):
        data = bytearray(data)  # torch.frombuffer wants a writable buffer
    if len(data) < _ST_HEADER.size:
        raise ProtocolError("a message shorter than its header")
    (h,) = _ST_HEADER.unpack_from(data)
    if h > MAX_HEADER or _ST_HEADER.size + h > len(data):
        raise ProtocolError(f"a header announced as {h:,} bytes (the limit: {MAX_HEADER:,}, the frame: {len(data):,})")
    header = _json(bytes(data[_ST_HEADER.size:_ST_HEADER.size + h]), "a header")
    if not isinstance(header, dict) or not isinstance(header.get("__metadata__"), dict) or \
            not isinstance(header["__metadata__"].get("message"), str):
        raise ProtocolError("a header without the message")
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    if len(entries) > MAX_TENSORS or set(entries) != {str(i) for i in range(len(entries))}:
        raise ProtocolError("tensors not numbered 0, 1, 2, ... or too many of them")
    start, end, elements = _ST_HEADER.size + h, _ST_HEADER.size + h, 0
    plan = []
    for i in range(len(entries)):
        entry = entries[str(i)]
        if not isinstance(entry, dict) or entry.get("dtype") not in DTYPES or not isinstance(entry.get("shape"), list) \
                or not isinstance(entry.get("data_offsets"), list) or len(entry["data_offsets"]) != 2:
            raise ProtocolError(f"tensor {i}: a malformed entry")
        shape, (begin, stop) = entry["shape"], entry["data_offsets"]
        if len(shape) > 16 or not all(type(s) is int and 0 <= s < 1 << 40 for s in shape + [begin, stop]):
            raise ProtocolError(f"tensor {i}: a malformed shape or byte range")
        count = math.prod(shape)
        elements += count
        dtype = DTYPES[entry["dtype"]]
        if elements > MAX_ELEMENTS or start + begin != end or stop - begin != count * dtype.itemsize:
            raise ProtocolError(f"tensor {i}: its byte range does not follow the previous one or match its shape")
        end = start + stop
        plan.append((dtype, shape, start + begin, count))
    if end != len(data):
        raise ProtocolError("tensors that do not cover the message's data exactly")
    tensors = [torch.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape).clone()
               if count else torch.zeros(shape, dtype=dtype) for dtype, shape, offset, count in plan]
    tree = _json(header["__metadata__"]["message"].encode(), "a message")
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
