"""Stand-ins, in the grader, for the objects that live in the student's process.

The package's checks take the student's function or class and call it; here they get a stand-in that
forwards each call to the student's process and brings back plain data:

* ``RemoteObject``: a function, a class or any other object; calling it calls the real one there.
* ``RemoteModule``: an ``nn.Module`` built from the description of the student's module (the same
  parameter names, shapes, tying, buffers and their persistence, simple attributes), so a check reads,
  loads and compares weights locally; ``forward`` and ``to`` run in the student's process, after the
  stand-in's current parameter values have been sent there.

Arguments go by value: tensors, numbers, the package's own ``GQAttention``/``RMSNorm`` (rebuilt from
their weights), and dicts, lists and tensors the student's code changes in place come back changed.
"""

from __future__ import annotations

import keyword

import torch
import torch.nn as nn

from ...attention import GQAttention
from ...rmsnorm import RMSNorm
from .sandbox import Sandbox, SandboxLost
from .wire import Unsupported


class StudentError(Exception):
    """An exception the student's code raised in its own process (the class is named after it)."""


_ERROR_CLASSES: dict[str, type] = {}


def student_error(name, message) -> Exception:
    if name == "NotImplementedError":
        return NotImplementedError(message)
    name = name if isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name) else "Error"
    cls = _ERROR_CLASSES.setdefault(name, type(name, (StudentError,), {}))
    return cls(message)


class Link:
    """The grader's side of one submission's process: requests under a deadline, and the names of the
    package's functions the student's code entered while the checks called it."""

    def __init__(self, sandbox: Sandbox, deadline: float):
        self.sandbox, self.deadline = sandbox, deadline
        self.entered: set[str] = set()
        self.proxies: dict[int, object] = {}

    def request(self, message: dict) -> dict:
        return self.sandbox.request(message, self.deadline)

    def get(self, names: list[str]) -> dict:
        """The student's values for ``names`` (a name that is not defined maps to ``MISSING``)."""
        values = self.request({"op": "get", "names": list(names)}).get("values")
        if not isinstance(values, dict):
            raise SandboxLost("garbled", "a malformed reply to 'get'")
        return {n: MISSING if values.get(n) == {"__missing__": True} else self.decode(values.get(n)) for n in names}

    def call(self, number: int, method: str | None, args: tuple, kwargs: dict, push: dict | None = None):
        reply = self.request({"op": "call", "target": number, "method": method, "args": self.encode(list(args)),
                              "kwargs": self.encode(kwargs), "push": push})
        entered, error, back = reply.get("entered"), reply.get("error"), reply.get("writeback")
        if not (isinstance(entered, list) and all(isinstance(e, str) for e in entered)) or not (
                error is None or (isinstance(error, list) and len(error) == 2)) or not isinstance(back, dict):
            raise SandboxLost("garbled", "a malformed reply to a call")
        self.entered.update(entered[:200])
        _write_back(list(args), back.get("args"), self.decode)
        _write_back_kwargs(kwargs, back.get("kwargs"), self.decode)
        if error is not None:
            raise student_error(*(str(e) for e in error))
        return self.decode(reply.get("value"))

    # ---- values -----------------------------------------------------------------------------------------

    def encode(self, value):
        """What the grader sends: data, a reference to a student's object, or a package module's recipe."""
        if isinstance(value, (RemoteObject, RemoteModule)):
            return {"__ref__": value._number}
        if isinstance(value, (GQAttention, RMSNorm)):
            return _package_module(value)
        if isinstance(value, nn.Module):
            raise TypeError(f"the grader cannot send a {type(value).__name__} to the student's process")
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
        if isinstance(value, list):
            return [self.decode(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self.decode(v) for v in value)
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
            raise SandboxLost("garbled", f"an unusable description of an object ({err})") from None
        self.proxies[number] = proxy
        return proxy


class _Missing:
    def __repr__(self) -> str:
        return "<not defined>"


MISSING = _Missing()


def _package_module(module: nn.Module) -> dict:
    """The recipe the student's process rebuilds a package module from (same key: the same module)."""
    if isinstance(module, RMSNorm):
        args, kwargs = [module.weight.shape[0]], {"eps": module.eps}
    else:
        args, kwargs = [module.wq.in_features, module.h, module.kv], {"qk_norm": isinstance(module.q_norm, RMSNorm)}
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    dtype = next(module.parameters()).dtype
    return {"__package_module__": type(module).__name__, "key": id(module), "args": args, "kwargs": kwargs,
            "state": state, "dtype": str(dtype).removeprefix("torch.")}


def _write_back(args: list, back, decode) -> None:
    """Bring in-place changes the student's code made to dicts, lists and tensors into the grader's objects."""
    if not isinstance(back, list):
        return
    for original, new in zip(args, back, strict=False):
        _update(original, new, decode)


def _write_back_kwargs(kwargs: dict, back, decode) -> None:
    if isinstance(back, dict):
        for key, new in back.items():
            if key in kwargs:
                _update(kwargs[key], new, decode)


def _update(original, new, decode) -> None:
    if new is None:
        return
    if isinstance(original, dict) and isinstance(new, dict):
        original.clear()
        original.update(decode(new))
    elif isinstance(original, list) and isinstance(new, list):
        original[:] = decode(new)
    elif isinstance(original, torch.Tensor) and isinstance(new, torch.Tensor):
        if new.shape == original.shape and new.dtype == original.dtype and not torch.equal(new, original):
            with torch.no_grad():
                original.copy_(new)


class RemoteObject:
    """A student's object that stays in the student's process; calling it calls it there."""

    def __init__(self, link: Link, number: int, desc: dict):
        self.__dict__.update(_link=link, _number=number, _origin=_strings(desc.get("origin")))
        attrs = desc.get("attrs")
        for key, value in (attrs.items() if isinstance(attrs, dict) else ()):
            if isinstance(key, str) and key.isidentifier() and not key.startswith("_"):
                self.__dict__[key] = value

    def __call__(self, *args, **kwargs):
        return self._link.call(self._number, None, args, kwargs)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} in the student's process>"


_OBJECT_CLASSES: dict[str, type] = {}


def _remote_object(link: Link, number: int, desc: dict) -> RemoteObject:
    """A RemoteObject whose class carries the student's type name, so messages name it ("got float64")."""
    name = desc.get("type")
    name = name if isinstance(name, str) and name.isidentifier() else "object"
    cls = _OBJECT_CLASSES.setdefault(name, type(name, (RemoteObject,), {}))
    return cls(link, number, desc)


def _strings(value) -> list[str]:
    return [v for v in value if isinstance(v, str)][:50] if isinstance(value, list) else []


class RemoteModule(nn.Module):
    """An ``nn.Module`` stand-in with the student's module's parameters, buffers and attributes."""

    def __init__(self, link: Link, number: int, desc: dict):
        super().__init__()
        self.__dict__.update(_link=link, _number=number)
        self._rebuild(desc)

    def _rebuild(self, desc: dict) -> None:
        self.__dict__["_origin"] = _strings(desc.get("origin"))
        module = desc["module"]
        self._parameters.clear()
        self._buffers.clear()
        self._modules.clear()
        self._non_persistent_buffers_set.clear()
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
            if not part or part.startswith("_") or hasattr(nn.Module, part):
                raise ValueError(f"an unusable submodule name {dotted!r}")
            if part not in owner._modules:
                owner._modules[part] = nn.Module()
            owner = owner._modules[part]
        if not leaf or leaf.startswith("_") or "." in leaf or hasattr(nn.Module, leaf):
            raise ValueError(f"an unusable attribute name {dotted!r}")
        return owner, leaf

    def _state(self) -> dict:
        return {"params": {n: p.detach() for n, p in self.named_parameters(remove_duplicate=False)},
                "buffers": {n: b.detach() for n, b in self.named_buffers(remove_duplicate=False)}}

    def forward(self, *args, **kwargs):
        return self._link.call(self._number, None, args, kwargs, push=self._state())

    def to(self, *args, **kwargs):
        return self._link.call(self._number, "to", args, kwargs, push=self._state())


__all__ = ["Link", "MISSING", "RemoteModule", "RemoteObject", "StudentError", "Unsupported", "student_error"]
