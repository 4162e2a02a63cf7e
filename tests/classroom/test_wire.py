"""The messages between the grader and the student's process (``grading.wire``): safetensors frames read by the
safetensors library, the message as JSON text in a tensor of its own, nothing unpickled or decompressed, every
size checked before anything is allocated or walked; and the module descriptions read from them, bounded before
they are built."""

import json
import os
import pickle
import socket
import threading
import time
import tracemalloc

import pytest
import torch
import torch.nn as nn

from modern_block.classroom.grading import wire
from modern_block.classroom.grading.remote import RemoteModule


def test_the_wire_refuses_what_it_must_not_use():
    huge_view = torch.zeros(1).expand(1 << 26)  # a 4-byte storage that claims 67 M elements
    assert isinstance(wire.clean(torch.zeros(2, dtype=torch.complex64)), wire.Unsupported)
    with pytest.raises(wire.ProtocolError, match="more than"):
        wire.clean([huge_view])
    nested = []
    for _ in range(100):
        nested = [nested]
    with pytest.raises(wire.ProtocolError, match="nested too deep"):
        wire.clean(nested)
    out = wire.clean({"p": nn.Parameter(torch.ones(2)), "n": 2**300, "t": torch.arange(6).view(2, 3).T})
    assert type(out["p"]) is torch.Tensor and isinstance(out["n"], wire.Unsupported)
    assert out["t"].is_contiguous() and out["t"].tolist() == [[0, 3], [1, 4], [2, 5]]
    a, b = socket.socketpair()
    evil = pickle.dumps(os.system, protocol=2)  # a payload that would run code if it were unpickled freely
    a.sendall(wire._HEADER.pack(len(evil)) + evil)
    with pytest.raises(wire.ProtocolError, match="header announced"):  # never unpickled: not the format
        wire.receive(b, time.monotonic() + 5)
    a.sendall(wire._HEADER.pack(wire.MAX_FRAME + 1))
    with pytest.raises(wire.ProtocolError, match="over the"):
        wire.receive(b, time.monotonic() + 5)
    with pytest.raises(TimeoutError):
        wire.receive(b, time.monotonic() + 0.2)


def test_the_wire_is_safetensors_with_the_message_as_json_and_nothing_to_unpack():
    from safetensors.torch import load

    message = {"x": torch.arange(6.0).view(2, 3), "pair": (1, "a"), "flags": [True, None, 2.5],
               "h": torch.ones(2, dtype=torch.bfloat16), "empty": torch.zeros(0, 4), "scalar": torch.tensor(3)}
    data = wire.encode(message)
    tensors = load(bytes(data))  # the library reads the frame's payload as it is
    assert torch.equal(tensors["0"], message["x"]) and tensors["2"].shape == (0, 4)
    assert json.loads(tensors["message"].numpy().tobytes())["d"]["x"] == {"T": 0}
    out = wire.clean(message)
    assert out["pair"] == (1, "a") and out["flags"] == [True, None, 2.5] and out["scalar"].item() == 3
    assert all(torch.equal(out[k], message[k]) for k in ("x", "h", "empty"))
    out["x"].add_(1)  # a received tensor owns its bytes: writable, shared with nothing
    assert torch.equal(out["x"], message["x"] + 1)
    assert isinstance(wire.clean({"n": 7**6000})["n"], wire.Unsupported)
    assert isinstance(wire.decode(_frame({}, message="7" * 5000)), wire.Unsupported)  # no int() of 5,000 digits


def _frame(header: dict, data: bytes = b"", message="null") -> bytes:
    """A frame by hand: the message's text first, then ``data``, whose tensors' offsets ``header`` gives
    from the end of the message."""
    text = message.encode()
    entries = {"message": {"dtype": "U8", "shape": [len(text)], "data_offsets": [0, len(text)]}}
    for name, entry in header.items():
        entries[name] = {**entry, "data_offsets": [len(text) + o for o in entry["data_offsets"]]}
    head = json.dumps(entries).encode()
    return wire._ST_HEADER.pack(len(head)) + head + text + data


def _entry(dtype: str, shape: list[int], begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


@pytest.mark.parametrize("name, payload, error", [
    ("a tensor claiming more bytes than sent", _frame({"0": _entry("F32", [1 << 30], 0, 4 << 30)}, b"\0" * 16),
     "not a valid safetensors frame"),
    ("a shape that does not match its bytes", _frame({"0": _entry("F32", [3], 0, 8)}, b"\0" * 8),
     "not a valid safetensors frame"),
    ("overlapping tensors", _frame({"0": _entry("U8", [4], 0, 4), "1": _entry("U8", [4], 0, 4)}, b"\0" * 4),
     "not a valid safetensors frame"),
    ("bytes no tensor owns", _frame({}, b"\0" * 64), "not a valid safetensors frame"),
    ("a header longer than the frame", wire._ST_HEADER.pack(1 << 40) + b"{}", "header announced"),
    ("a header naming 20,000 tensors", _frame({str(i): _entry("U8", [0], 0, 0) for i in range(20_000)}),
     "more than 10,000 tensors"),
    ("a tensor that is not numbered", _frame({"x": _entry("U8", [1], 0, 1)}, b"\0"), "other than the message"),
    ("no message", wire._ST_HEADER.pack(8) + b"{}      ", "other than the message"),
    ("a million empty lists", _frame({}, message="[" + "[]," * 1_000_000 + "[]]"), "too many values"),
    ("deep nesting", _frame({}, message="[" * 100_000 + "]" * 100_000), "nested too deep"),
    ("a dtype that is not allowed", _frame({"0": _entry("C64", [1], 0, 8)}, b"\0" * 8), "dtype the grader"),
    ("an 8-bit float", _frame({"0": _entry("F8_E4M3", [8], 0, 8)}, b"\0" * 8), "dtype the grader"),
    ("too many elements", _frame({"0": _entry("U8", [(1 << 25) + 1], 0, (1 << 25) + 1)}, bytes((1 << 25) + 1)),
     "elements"),
    ("an object outside the format", _frame({}, message='{"__reduce__": 1, "x": 2}'), "not part of the format"),
])
def test_the_wire_checks_every_size_before_it_allocates(name, payload, error):
    started = time.perf_counter()
    with pytest.raises(wire.ProtocolError, match=error):
        wire.decode(payload)
    assert time.perf_counter() - started < 2.0, name


def test_a_module_description_is_bounded_before_it_is_built():
    desc = {"params": [], "buffers": [], "attrs": {}, "modules": [".".join(["a"] * 20_000)] * 500}
    started = time.perf_counter()
    with pytest.raises(ValueError, match="parts"):
        RemoteModule(link=None, number=1, desc={"module": desc})
    desc = {"params": [], "buffers": [], "attrs": {f"x{i}": 1 for i in range(20_000)}, "modules": []}
    with pytest.raises(ValueError, match="more than"):
        RemoteModule(link=None, number=1, desc={"module": desc})
    desc = {"params": [], "buffers": [], "attrs": {}, "modules": [f"m{i}.a.b" for i in range(3000)]}
    with pytest.raises(ValueError, match="submodules"):
        RemoteModule(link=None, number=1, desc={"module": desc})
    assert time.perf_counter() - started < 5.0


def test_a_frame_is_built_with_one_copy_of_its_tensors():
    """Sending 40 MB of tensors allocates the frame once (no joined copy, no length-prefixed copy)."""
    a, b = socket.socketpair()
    big = torch.ones(10_000_000)  # 40 MB
    sink = bytearray(48 << 20)  # the reader's buffer, allocated before memory is traced
    got = [0]

    def drain():
        view = memoryview(sink)
        while k := b.recv_into(view[got[0]:]):
            got[0] += k

    reader = threading.Thread(target=drain)
    reader.start()
    tracemalloc.start()
    try:
        wire.send(a, {"x": big, "y": [big[:10]]})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        a.close()
        reader.join()
    assert peak < 1.1 * big.numel() * 4, peak
    message = wire.decode(sink[wire._HEADER.size:got[0]])
    assert torch.equal(message["x"], big) and message["y"][0].shape == (10,)


def test_a_frame_received_costs_twice_its_length_at_most():
    """The received 40 MB frame and the library's copy of its tensors' bytes; the tensors are built on that copy."""
    a, b = socket.socketpair()
    big = torch.ones(10_000_000)  # 40 MB
    sender = threading.Thread(target=wire.send, args=(a, {"x": big}))
    sender.start()
    tracemalloc.start()
    try:
        message = wire.receive(b, time.monotonic() + 60)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        sender.join()
        a.close()
        b.close()
    assert torch.equal(message["x"], big)
    assert peak < 2.1 * big.numel() * 4, peak
