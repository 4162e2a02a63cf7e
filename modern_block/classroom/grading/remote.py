"""Stand-ins, in the grader, for the objects that live in the student's process.

``RemoteObject`` forwards calls; ``RemoteModule`` is an ``nn.Module`` built from the description of the student's
module (names, shapes, tying, buffers), so a check loads and compares weights here, while ``forward`` and ``to``
run there on the stand-in's current values. What a stand-in holds is bounded (``MAX_MODULE_BYTES``); a
non-persistent buffer is kept as a ``meta`` tensor and never sent; stand-ins are held weakly. Arguments travel by
value and only declared outputs come back (``checks.core.Output``); student strings are put on one line, escaped.
"""

from __future__ import annotations

import keyword
import weakref
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn

from .grade_report import one_line
from .sandbox import Sandbox, SandboxLost

_MODULE_INTERNALS = frozenset(vars(nn.Module()))  # what nn.Module.__init__ sets up: rebuilt there, not sent
MAX_NAMES = 10_000  # parameters, buffers, submodules and attributes in one module's description
MAX_NAME = 300  # characters of one dotted name
MAX_PARTS = 32  # parts of one dotted name
MAX_SUBMODULES = 5_000  # submodules a stand-in may have
MAX_ATTRS = 100  # attributes of a plain object
MAX_MODULE_BYTES = 48 << 20  # a module's parameters, persistent buffers, tensor attributes (LlamaStyleLM(1000): 13 MB)
MAX_ERROR = 3000  # characters of a student's exception message


class StudentError(Exception):
    """An exception the student's code raised in its own process (the class is named after it)."""


_ERROR_CLASSES: dict[str, type] = {}


def student_error(name, message) -> Exception:
    message = one_line(str(message)[:MAX_ERROR])[:MAX_ERROR]
    if name == "NotImplementedError":
        return NotImplementedError(message)
    name = name if isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name) else "Error"
    cls = _ERROR_CLASSES.setdefault(name, type(name, (StudentError,), {}))
    return cls(message)


def _plain(value) -> bool:
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    return value is None or type(value) in (bool, int, float, str)


def module_spec(module: nn.Module) -> dict:
    """A module of the grader's, by value: its class (``module:qualname``), simple attributes, parameters,
    buffers and submodules. The student's process rebuilds a fresh one for every call."""
    cls = type(module)
    model_file = cls.__module__.startswith("modern_block.") and cls.__module__.count(".") == 1
    if not (cls.__module__.startswith("torch.nn.modules.") or model_file) or "." in cls.__qualname__:
        raise TypeError(f"the grader cannot send a {cls.__name__} to the student's process")
    return {"class": f"{cls.__module__}:{cls.__qualname__}",
            "attrs": {k: v for k, v in vars(module).items() if k not in _MODULE_INTERNALS and _plain(v)},
            "params": {k: None if p is None else p.detach().clone() for k, p in module._parameters.items()},
            "buffers": {k: [b.detach().clone(), k not in module._non_persistent_buffers_set]
                        for k, b in module._buffers.items() if b is not None},
            "children": {k: module_spec(c) for k, c in module._modules.items() if c is not None}}


class Link:
    """The grader's side of one submission's process: requests under a deadline."""

    def __init__(self, sandbox: Sandbox, deadline: float):
        self.sandbox, self.deadline = sandbox, deadline
        self.proxies: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()  # while a check holds them

    def get(self, names: list[str]) -> dict:
        """The student's values for ``names`` (a name that is not defined maps to ``MISSING``)."""
        values = self.sandbox.request({"op": "get", "names": list(names)}, self.deadline).get("values")
        if not isinstance(values, dict):
            raise SandboxLost("garbled", "a malformed reply to 'get'")
        return {n: MISSING if values.get(n) == {"__missing__": True} else self.decode(values.get(n)) for n in names}

    def call(self, number: int, method: str | None, args: list, kwargs: dict, push: dict | None = None,
             outputs: Sequence[int] = ()) -> tuple[object, dict[int, object]]:
        """Call object ``number`` (or its ``method``) there; its value, and the arguments ``outputs`` as the
        call left them."""
        reply = self.sandbox.request({"op": "call", "target": number, "method": method, "args": self.encode(list(args)),
                                      "kwargs": self.encode(kwargs), "push": push, "outputs": list(outputs)},
                                     self.deadline)
        error, back = reply.get("error"), reply.get("outputs")
        if not (error is None or (isinstance(error, list) and len(error) == 2)) or not isinstance(back, dict):
            raise SandboxLost("garbled", "a malformed reply to a call")
        if error is not None:
            raise student_error(*(str(e) for e in error))
        if any(str(i) not in back for i in outputs):
            raise SandboxLost("garbled", "a reply without the declared outputs")
        return self.decode(reply.get("value")), {i: self.decode(back[str(i)]) for i in outputs}

    def encode(self, value):
        """What the grader sends: data, a reference to a student's object, or one of its own modules."""
        if isinstance(value, (RemoteObject, RemoteModule)):
            return {"__ref__": value._number}
        if isinstance(value, nn.Module):
            return {"__module__": module_spec(value)}
        if isinstance(value, dict):
            return {k: self.encode(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            items = [self.encode(v) for v in value]
            return items if isinstance(value, list) else tuple(items)
        return value

    def decode(self, value):
        """What the grader receives: data as it is, a stand-in for an object kept in the student's process."""
        if isinstance(value, dict):
            number = value.get("__remote__")
            if isinstance(number, int):
                return self._proxy(number, value)
            return {k: self.decode(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            items = [self.decode(v) for v in value]
            return items if isinstance(value, list) else tuple(items)
        return value

    def _proxy(self, number: int, desc: dict):
        proxy = self.proxies.get(number)
        is_module = isinstance(desc.get("module"), dict)
        try:
            if isinstance(proxy, RemoteModule) and is_module:
                proxy._rebuild(desc)
            elif proxy is None or isinstance(proxy, RemoteModule) != is_module:
                proxy = RemoteModule(self, number, desc) if is_module else _remote_object(self, number, desc)
        except (TypeError, ValueError, KeyError, AttributeError, RuntimeError) as err:
            raise SandboxLost("garbled", f"an unusable description of an object ({one_line(str(err))})") from None
        self.proxies[number] = proxy
        return proxy


def checked_description(module) -> dict:
    """A module's description with its shape checked before any of it is walked or built: its four parts
    of the right types, at most ``MAX_NAMES`` names in all, each at most ``MAX_NAME`` characters and
    ``MAX_PARTS`` dotted parts. Raises ValueError."""
    kinds = {"params": list, "buffers": list, "modules": list, "attrs": dict}
    parts: dict[str, Any] = {k: module.get(k) for k in kinds} if isinstance(module, dict) else {}
    if not all(isinstance(parts.get(k), kind) for k, kind in kinds.items()):
        raise ValueError("a malformed module description")
    if sum(len(v) for v in parts.values()) > MAX_NAMES:
        raise ValueError(f"a module with more than {MAX_NAMES:,} names")
    shapes = [(parts["params"], 4), (parts["buffers"], 3)]
    if not all(isinstance(item, list) and len(item) == n and isinstance(item[0], str) for items, n in shapes
               for item in items):
        raise ValueError("a malformed parameter or buffer entry")
    names = [*(p[0] for p in parts["params"]), *(p[2] for p in parts["params"]), *(b[0] for b in parts["buffers"]),
             *parts["modules"], *parts["attrs"]]
    for name in names:
        if not isinstance(name, str) or len(name) > MAX_NAME or name.count(".") >= MAX_PARTS:
            raise ValueError(f"a name longer than {MAX_NAME} characters or {MAX_PARTS} parts")
    kept = [p[1] for p in parts["params"]] + [b[1] for b in parts["buffers"] if b[2]] + list(parts["attrs"].values())
    size = sum(t.numel() * t.element_size() for t in kept if isinstance(t, torch.Tensor))
    if size > MAX_MODULE_BYTES:
        raise ValueError(f"a module of {size / 2**20:,.0f} MB of parameters and buffers (the grader takes modules of "
                         f"at most {MAX_MODULE_BYTES >> 20} MB)")
    return parts


def _meta(value) -> torch.Tensor:
    """A non-persistent buffer as the stand-in keeps it: its shape and dtype on the ``meta`` device, from the
    tensor or from a ``(shape, dtype)`` pair the student's process sends instead of its data."""
    if isinstance(value, torch.Tensor):
        return torch.empty(value.shape, dtype=value.dtype, device="meta")
    if isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[1], torch.dtype) and \
            isinstance(value[0], (tuple, list)) and len(value[0]) <= 16 and \
            all(type(n) is int and 0 <= n < 1 << 40 for n in value[0]):
        return torch.empty(tuple(value[0]), dtype=value[1], device="meta")
    return torch.empty(0, device="meta")


class _Missing:
    def __repr__(self) -> str:
        return "<not defined>"


MISSING = _Missing()


class RemoteObject:
    """A student's object that stays in the student's process; calling it calls it there."""

    _link: Link  # set through __dict__: an object's own attributes are the student's
    _number: int

    def __init__(self, link: Link, number: int, desc: dict):
        self.__dict__.update(_link=link, _number=number)
        attrs = desc.get("attrs")
        for key, value in list(attrs.items() if isinstance(attrs, dict) else ())[:MAX_ATTRS]:
            if isinstance(key, str) and key.isidentifier() and not key.startswith("_"):
                self.__dict__[key] = value

    def __call__(self, *args, **kwargs):
        return self._link.call(self._number, None, list(args), kwargs)[0]

    def call_with_outputs(self, args: list, kwargs: dict, outputs: list[int]):
        return self._link.call(self._number, None, args, kwargs, outputs=outputs)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} in the student's process>"


_OBJECT_CLASSES: dict[str, type] = {}


def _remote_object(link: Link, number: int, desc: dict) -> RemoteObject:
    """A RemoteObject whose class carries the student's type name, so messages name it ("got float64")."""
    name = desc.get("type")
    name = name if isinstance(name, str) and name.isidentifier() else "object"
    cls = _OBJECT_CLASSES.setdefault(name, type(name, (RemoteObject,), {}))
    return cls(link, number, desc)


class RemoteModule(nn.Module):
    """An ``nn.Module`` stand-in with the student's module's parameters, buffers and attributes."""

    _link: Link  # set through __dict__, as RemoteObject's
    _number: int

    def __init__(self, link: Link, number: int, desc: dict):
        super().__init__()
        self.__dict__.update(_link=link, _number=number)
        self._rebuild(desc)

    def _rebuild(self, desc: dict) -> None:
        module = checked_description(desc["module"])
        self.__dict__["_room"] = MAX_SUBMODULES
        for table in (self._parameters, self._buffers, self._modules, self._non_persistent_buffers_set):
            table.clear()
        for key in [k for k in self.__dict__ if not k.startswith("_") and k != "training"]:
            del self.__dict__[key]
        for name in module["modules"]:
            self._owner(name + ".x")
        shared: dict[str, nn.Parameter] = {}
        for name, value, group, requires_grad in module["params"]:
            if name == group:
                if not isinstance(value, torch.Tensor):
                    raise ValueError(f"parameter {name} without a tensor")
                shared[name] = nn.Parameter(value, requires_grad=bool(requires_grad) and value.is_floating_point())
            owner, leaf = self._owner(name)
            owner.register_parameter(leaf, shared[group])
        for name, value, persistent in module["buffers"]:
            owner, leaf = self._owner(name)
            if not persistent:  # its name, shape and dtype; its data stays in the student's process
                value = _meta(value)
            owner.register_buffer(leaf, value, persistent=bool(persistent))
        for name, value in module["attrs"].items():
            owner, leaf = self._owner(name)
            if not hasattr(nn.Module, leaf) and leaf not in owner._parameters and leaf not in owner._buffers \
                    and leaf not in owner._modules:
                owner.__dict__[leaf] = value

    def _owner(self, dotted: str) -> tuple[nn.Module, str]:
        """The (sub)module that holds ``dotted``'s last part, creating empty containers on the way."""
        *path, leaf = dotted.split(".")
        owner: nn.Module = self
        for part in path:
            if not (part.isidentifier() or part.isdigit()) or part.startswith("_") or hasattr(nn.Module, part):
                raise ValueError(f"an unusable submodule name {dotted!r}")
            if part not in owner._modules:
                self.__dict__["_room"] -= 1
                if self.__dict__["_room"] < 0:
                    raise ValueError(f"more than {MAX_SUBMODULES:,} submodules")
                owner._modules[part] = nn.Module()
            owner = owner.get_submodule(part)
        if not (leaf.isidentifier() or leaf.isdigit()) or leaf.startswith("_") or hasattr(nn.Module, leaf):
            raise ValueError(f"an unusable attribute name {dotted!r}")
        return owner, leaf

    def _state(self) -> dict:
        """The values to send before a call: each parameter once (a tied one under its first name), and the
        persistent buffers."""
        persistent = set(self.state_dict())
        return {"params": {n: p.detach() for n, p in self.named_parameters()},
                "buffers": {n: b.detach() for n, b in self.named_buffers() if n in persistent}}

    def forward(self, *args, **kwargs):
        return self._link.call(self._number, None, list(args), kwargs, push=self._state())[0]

    def call_with_outputs(self, args: list, kwargs: dict, outputs: list[int]):
        return self._link.call(self._number, None, args, kwargs, push=self._state(), outputs=outputs)

    def to(self, *args, **kwargs):
        return self._link.call(self._number, "to", list(args), kwargs, push=self._state())[0]

