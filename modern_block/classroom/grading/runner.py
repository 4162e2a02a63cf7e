"""What runs in the student's process: execute the submission's cells, answer the grader's calls.

It holds the student's objects and hands the grader only data: values (numbers, strings, tensors, lists,
dicts) or a description of an object it keeps (type, the package classes it derives from, and for a
module its parameters, buffers and simple attributes). Every call into student code runs with its
output captured (bounded) and with a profiler noting which functions of the course package it entered,
so the grader can report a submission that hands in the package's own implementation. Nothing here is
trusted by the grader: the student's code can change any of it, and only ever changes its own answers.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys

import torch
import torch.nn as nn

from . import wire

OUTPUT_LIMIT = 4000  # characters kept per cell: the first and the last half
CLASSROOM_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # modern_block/classroom
PACKAGE_DIR = os.path.dirname(CLASSROOM_DIR) + os.sep
NOT_TRACED = (os.path.join(CLASSROOM_DIR, "grading") + os.sep, os.path.join(CLASSROOM_DIR, "checks") + os.sep)
PACKAGE_MODULES = ("GQAttention", "RMSNorm")  # package modules the grader may pass as arguments


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


@contextlib.contextmanager
def captured(stream: BoundedText):
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = stream
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


@contextlib.contextmanager
def tracing(entered: set):
    """Note the qualified name of every course-package function called (the grader's parts excepted)."""

    def profile(frame, event, arg):
        if event == "call":
            path = frame.f_code.co_filename
            if path.startswith(PACKAGE_DIR) and not path.startswith(NOT_TRACED) and len(entered) < 200:
                entered.add(getattr(frame.f_code, "co_qualname", frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(None)


def error_of(err: BaseException) -> list[str]:
    try:
        text = str(err)
    except Exception:
        text = "(its message could not be shown)"
    return [type(err).__name__[:80], text[:3000]]


def origin(obj) -> list[str]:
    """Names of the course package's classes and functions that ``obj`` is, wraps or derives from."""
    names = []
    try:
        target = obj.func if isinstance(obj, functools.partial) else obj
        target = inspect.unwrap(target)
        target = getattr(target, "__func__", target)
        classes = target.__mro__ if isinstance(target, type) else type(target).__mro__
        candidates = list(classes) + ([target] if callable(target) and not isinstance(target, type) else [])
        for item in candidates:
            module = getattr(item, "__module__", "") or ""
            if module.startswith("modern_block.") and not module.startswith(("modern_block.classroom.grading",
                                                                            "modern_block.classroom.checks")):
                names.append(str(getattr(item, "__qualname__", getattr(item, "__name__", "?"))))
    except Exception:  # an object that resists inspection: nothing to report
        pass
    return names[:20]


def _simple(value) -> bool:
    return value is None or type(value) in (bool, int, float) or (type(value) is str and len(value) < 200) or \
        type(value) in (torch.Tensor, nn.Parameter)


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
        self.numbers: dict[int, int] = {}  # id(object) -> its number
        self.package_modules: dict[int, nn.Module] = {}  # the grader's key -> the module built from it

    # ---- from the grader -------------------------------------------------------------------------------

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
        with captured(out):
            result = self.shell.run_cell(source, store_history=False)
        err = result.error_before_exec or result.error_in_exec
        return {"error": error_of(err) if err is not None else None, "output": out.text()}

    def call(self, msg: dict) -> dict:
        target = self.objects[msg["target"]]
        if msg.get("push"):
            self.load_state(target, msg["push"])
        fn = getattr(target, msg["method"]) if msg.get("method") else target
        args, kwargs = self.decode(msg["args"]), self.decode(msg["kwargs"])
        entered: set = set()
        out = BoundedText()
        value, error = None, None
        with captured(out):
            try:
                with tracing(entered):
                    value = fn(*args, **kwargs)
            except BaseException as err:  # SystemExit and KeyboardInterrupt too: the grader decides
                error = error_of(err)
        mutable = (dict, list, torch.Tensor)
        return {
            "value": None if error else self.encode(value), "error": error, "entered": sorted(entered),
            "writeback": {"args": [self.encode(a) if isinstance(a, mutable) else None for a in args],
                          "kwargs": {k: self.encode(a) for k, a in kwargs.items() if isinstance(a, mutable)}},
        }

    def decode(self, value):
        if isinstance(value, dict):
            if "__ref__" in value:
                return self.objects[value["__ref__"]]
            if "__package_module__" in value:
                return self.package_module(value)
            return {k: self.decode(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            items = [self.decode(v) for v in value]
            return items if isinstance(value, list) else tuple(items)
        return value

    def package_module(self, spec: dict) -> nn.Module:
        """A module of the course package the grader passes as an argument (the same one for the same key,
        so attributes a student's function keeps on it between calls stay)."""
        import modern_block

        name = spec["__package_module__"]
        if name not in PACKAGE_MODULES:
            raise ValueError(f"the grader does not pass {name!r} modules")
        module = self.package_modules.get(spec["key"])
        if module is None:
            with torch.no_grad():
                module = getattr(modern_block, name)(*spec["args"], **spec["kwargs"])
            self.package_modules[spec["key"]] = module
        module.load_state_dict(spec["state"])
        return module.to(getattr(torch, spec["dtype"])).eval()

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

    # ---- to the grader ---------------------------------------------------------------------------------

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
        desc = {"__remote__": number, "type": type(obj).__name__[:80], "callable": callable(obj),
                "origin": origin(obj)}
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
        """Parameters (tied ones named once, with the name they share), buffers (persistent or not), the
        names of the submodules and their simple attributes (numbers, strings, tensors)."""
        first: dict[int, str] = {}
        params = []
        for name, p in module.named_parameters(remove_duplicate=False):
            shared = first.setdefault(id(p), name)
            params.append([name, p.detach() if shared == name else None, shared, bool(p.requires_grad)])
        persistent = set(module.state_dict())
        buffers = [[name, b.detach(), name in persistent] for name, b in module.named_buffers(remove_duplicate=False)]
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
