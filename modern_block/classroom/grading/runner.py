"""What runs inside the sandbox: execute the submission's cells, answer the grader's calls.

``boot`` imports what every submission needs, sets the per-process limits, says "ready" and serves. The student's
objects stay here; the grader gets only data: values, or a description of an object (for a module its
parameters, buffers and simple attributes). Nothing here is trusted by the grader.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import resource
import signal
import socket
from typing import Any

import torch
import torch.nn as nn

from . import wire

OUTPUT_LIMIT = 4000  # characters kept per cell: the first and the last half
FILE_LIMIT = 16 << 20  # bytes a submission may write into one file


class BoundedText:
    """A text stream that keeps the first and the last ``limit / 2`` characters and counts the rest."""

    def __init__(self, limit: int = OUTPUT_LIMIT):
        self.half, self.head, self.tail, self.dropped = limit // 2, "", "", 0

    def write(self, text) -> int:
        text = str(text)
        written = len(text)
        room = self.half - len(self.head)
        if room > 0:
            self.head += text[:room]
            text = text[room:]
        if len(text) >= self.half:  # a huge write: no copy of it is made
            self.dropped += len(self.tail) + len(text) - self.half
            self.tail = text[-self.half:]
        elif text:
            joined = self.tail + text
            self.dropped += max(0, len(joined) - self.half)
            self.tail = joined[-self.half:]
        return written

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def text(self) -> str:
        middle = f"\n[... {self.dropped:,} characters of output left out ...]\n" if self.dropped else ""
        return self.head + middle + self.tail


def error_of(err: BaseException) -> list[str]:
    try:
        text = str(err)
    except Exception:
        text = "(its message could not be shown)"
    return [type(err).__name__[:80], text[:3000]]


def _simple(value) -> bool:
    return value is None or type(value) in (bool, int, float) or (type(value) is str and len(value) < 200) or \
        type(value) in (torch.Tensor, nn.Parameter)


def build_module(spec: dict) -> nn.Module:
    """A module the grader passes by value (the package's GQAttention whose weights an exercise uses, say): an
    instance of its class made without running ``__init__`` (which may be hidden in this copy of the package),
    with the grader's parameters, buffers, submodules and simple attributes. A fresh one for every call."""
    module_name, _, qualname = str(spec["class"]).rpartition(":")
    model_file = module_name.startswith("modern_block.") and module_name.count(".") == 1
    if not (module_name.startswith("torch.nn.modules.") or model_file) or not qualname.isidentifier():
        raise ValueError(f"the grader does not pass modules of class {spec['class']!r}")
    cls = getattr(importlib.import_module(module_name), qualname)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ValueError(f"{spec['class']!r} is not a module class")
    module = cls.__new__(cls)
    nn.Module.__init__(module)
    for key, value in spec["attrs"].items():
        module.__dict__[key] = value
    for key, value in spec["params"].items():
        module.register_parameter(key, None if value is None else nn.Parameter(value, requires_grad=False))
    for key, (value, persistent) in spec["buffers"].items():
        module.register_buffer(key, value, persistent=persistent)
    for key, child in spec["children"].items():
        module.add_module(key, build_module(child))
    return module


class Runner:
    """The student's namespace (an IPython shell) and the objects handed to the grader, by number."""

    def __init__(self):
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config

        config = Config()
        config.HistoryManager.enabled = False
        config.InteractiveShell.colors = "nocolor"  # tracebacks in the report without terminal escapes
        self.shell = InteractiveShell.instance(config=config)
        self.objects: dict[int, object] = {}
        self.numbers: dict[int, int] = {}  # id(object) -> its number (the object is kept, so the id stays its own)

    def handle(self, msg: dict) -> dict:
        op = msg.get("op")
        if op == "exec":
            return self.run_cell(msg["source"])
        if op == "get":
            return {"values": {name: self.encode(self.shell.user_ns[name]) if name in self.shell.user_ns
                               else {"__missing__": True} for name in msg["names"]}}
        if op == "call":
            return self.call(msg)
        return {"error": ["ProtocolError", f"unknown request {op!r}"]}

    def run_cell(self, source: str) -> dict:
        out = BoundedText()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            result = self.shell.run_cell(source, store_history=False)
        err = result.error_before_exec or result.error_in_exec
        return {"error": error_of(err) if err is not None else None, "output": out.text()}

    def call(self, msg: dict) -> dict:
        """Call one of the student's objects on the arguments sent (fresh copies); send back its value and, for
        the arguments the check declared as outputs (a cache the function fills), their contents afterwards."""
        target = self.objects[msg["target"]]
        if msg.get("push"):
            self.load_state(target, msg["push"])
        fn: Any = getattr(target, msg["method"]) if msg.get("method") else target
        args, kwargs = self.decode(msg["args"]), self.decode(msg["kwargs"])
        out = BoundedText()
        value, error = None, None
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                value = fn(*args, **kwargs)
            except BaseException as err:  # SystemExit and KeyboardInterrupt too: the grader decides
                error = error_of(err)
        outputs = {str(i): self.encode(args[i]) for i in msg.get("outputs", []) if isinstance(i, int) and
                   0 <= i < len(args)} if error is None else {}
        return {"value": None if error else self.encode(value), "error": error, "outputs": outputs}

    def decode(self, value):
        if isinstance(value, dict):
            if "__ref__" in value:
                return self.objects[value["__ref__"]]
            if "__module__" in value:
                with torch.no_grad():
                    return build_module(value["__module__"])
            return {k: self.decode(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            items = [self.decode(v) for v in value]
            return items if isinstance(value, list) else tuple(items)
        return value

    @staticmethod
    def load_state(module, state: dict) -> None:
        """Copy the grader's current parameter and buffer values into the student's module."""
        if not isinstance(module, nn.Module):
            return
        with torch.no_grad():
            for kind, get in (("params", module.get_parameter), ("buffers", module.get_buffer)):
                for name, value in state.get(kind, {}).items():
                    try:
                        tensor = get(name)
                    except AttributeError:
                        continue
                    if tensor is not None and tensor.shape == value.shape:
                        tensor.copy_(value)

    def encode(self, value, depth: int = 0):
        """Data as it is; any other object is kept here and described."""
        if value is None or type(value) in (bool, int, float):
            return value
        if type(value) is str:
            return value[:wire.MAX_TEXT]
        if type(value) in (torch.Tensor, nn.Parameter):
            return value.detach()
        if depth < 20 and type(value) in (list, tuple):
            items = [self.encode(v, depth + 1) for v in value]
            return items if type(value) is list else tuple(items)
        if depth < 20 and type(value) is dict and all(type(k) is str for k in value):
            return {k: self.encode(v, depth + 1) for k, v in value.items()}
        return self.describe(value)

    def describe(self, obj) -> dict:
        number = self.numbers.get(id(obj))
        if number is None:
            number = self.numbers[id(obj)] = len(self.objects) + 1
            self.objects[number] = obj
        desc = {"__remote__": number, "type": type(obj).__name__[:80], "callable": callable(obj)}
        if isinstance(obj, nn.Module):
            desc["module"] = self.describe_module(obj)
        else:
            try:
                attrs = vars(obj) if not isinstance(obj, type) else {}
            except TypeError:
                attrs = {}
            desc["attrs"] = {k: v.detach() if isinstance(v, torch.Tensor) else v
                             for k, v in list(attrs.items())[:100] if not k.startswith("_") and _simple(v)}
        return desc

    @staticmethod
    def describe_module(module: nn.Module) -> dict:
        """Parameters (tied ones named once, with the name they share), buffers (persistent ones with their data,
        non-persistent ones by shape and dtype only: recomputed, never learned, and the grader keeps no more),
        the names of the submodules and their simple attributes (numbers, strings, tensors)."""
        first: dict[int, str] = {}
        params = []
        for name, p in module.named_parameters(remove_duplicate=False):
            shared = first.setdefault(id(p), name)
            params.append([name, p.detach() if shared == name else None, shared, bool(p.requires_grad)])
        persistent = set(module.state_dict())
        buffers = [[name, b.detach(), True] if name in persistent else [name, (tuple(b.shape), b.dtype), False]
                   for name, b in module.named_buffers(remove_duplicate=False)]
        submodules, attrs = [], {}
        for prefix, sub in module.named_modules(remove_duplicate=False):
            if prefix:
                submodules.append(prefix)
            for key, value in list(vars(sub).items())[:100]:
                if not key.startswith("_") and key != "training" and _simple(value):
                    attrs[f"{prefix}.{key}" if prefix else key] = value.detach() if isinstance(value, torch.Tensor) \
                        else value
        return {"params": params, "buffers": buffers, "modules": submodules, "attrs": attrs}


def serve(sock) -> None:
    """Answer the grader's requests until it closes the connection."""
    runner = Runner()
    wire.send(sock, {"ready": True})
    while True:
        try:
            msg = wire.receive(sock)
        except (EOFError, OSError):
            return
        try:
            reply = runner.handle(msg)
            wire.send(sock, reply)
        except BaseException as err:  # an answer that cannot be sent (say, an odd tensor type)
            wire.send(sock, {"error": ["GraderError", "the answer could not be sent: " + " ".join(error_of(err))]})


def set_limits(memory_mb: int, cpu_seconds: int, processes: int | None) -> None:
    """Limits on this process, inherited by every process it starts: address space (what it has loaded plus
    ``memory_mb``), CPU time, file size, no core dumps and, without a cgroup, a number of processes."""
    with open("/proc/self/status") as f:
        loaded = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    memory = loaded + memory_mb * (1 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if processes is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the file limit fails, it does not kill


def boot(config: dict) -> None:
    """The sandboxed process: import, limit, serve the grader on the inherited socket. Never returns."""
    try:
        import IPython.core.interactiveshell  # noqa: F401

        import modern_block  # noqa: F401  (the sandbox's copy)
        import modern_block.classroom.checks  # noqa: F401  (its stub: the forbidden torch functions raise)

        os.environ.update(config.get("env", {}))
        torch.set_num_threads(1)
        set_limits(config["memory_mb"], config["cpu_seconds"], config.get("processes"))
        os.chdir(config.get("workdir", "/tmp"))
        serve(socket.socket(fileno=config["fd"]))
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(0)
