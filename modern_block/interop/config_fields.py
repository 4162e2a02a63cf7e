"""Reading a config's fields as one family reads them: each value, the family's own default where a field is
absent, and every field the card cannot interpret, with the reason.

A field is read when it is one of the family's own (a field of its transformers config, ``DEFAULTS``), one every
config carries (``BOOKKEEPING``: names, token ids, dtypes), or an older spelling the glossary accepts for that family
at the values under which transformers builds the published model (``config_fields.json``'s ``accepted``: Qwen2.5's
``use_mrope: false``, Phi-4-mini's ``full_attn_mod: 1``, ...). Anything else is not interpreted; the card then
gives no totals (``ConfigRefused``), since such a field may change them.
"""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Any

from .config_families import ALIASES, DEFAULTS, FAMILIES, family_name

GLOSSARY = json.loads((Path(__file__).parent / "config_fields.json").read_text(encoding="utf-8"))
BOOKKEEPING = {  # fields of every transformers config -> the values a causal decoder can have (None: any)
    "_name_or_path": None, "architectures": None, "model_type": None, "transformers_version": None,
    "torch_dtype": None, "dtype": None, "quantization_config": None, "auto_map": None, "id2label": None,
    "label2id": None, "problem_type": None, "output_attentions": None, "output_hidden_states": None,
    "return_dict": None, "chunk_size_feed_forward": None, "is_encoder_decoder": [False],
    "tie_word_embeddings": None, "use_cache": None, "bos_token_id": None, "eos_token_id": None,
    "pad_token_id": None, "gguf_metadata": None, "gguf_weight_bytes": None, "gguf_embedding_bytes": None,
}
MISSING = object()
STATED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")  # a family default is no model


class ConfigRefused(ValueError):
    """The card cannot read this config: it names the family and each field it cannot interpret, and why."""

    def __init__(self, family: str, fields: dict[str, str], lines: tuple = ()):
        self.family, self.fields, self.lines = family, dict(fields), tuple(lines)
        by_reason: dict[str, list[str]] = {}
        for key, reason in self.fields.items():
            by_reason.setdefault(reason, []).append(repr(key))
        why = "; ".join(f"{', '.join(keys)} ({reason})" for reason, keys in by_reason.items())
        super().__init__(f"model_type {family!r}: the card cannot interpret {why}. "
                         "No totals are given: they could be wrong.")


def lesson_and_meaning(key: str) -> tuple[str, str] | None:
    """The glossary's (lesson, meaning) for a config.json field, or None if it has no line."""
    line = GLOSSARY["config.json"].get(key)
    return None if line is None else (line[0], line[1])


def _accepted(family: str, key: str, value: Any, cfg: dict) -> str | None:
    """None if an older or foreign spelling ``key: value`` is read for ``family`` (glossary's ``accepted``), else
    why not."""
    rule = GLOSSARY["accepted"].get(key)
    if rule is None or (rule["families"] != "*" and family not in rule["families"]):
        return f"not a field of {family}'s config"
    want = rule["values"]
    if want == "any":
        return None
    if isinstance(want, str) and want.startswith("same:"):
        other = want.removeprefix("same:")
        return None if value == cfg.get(other, DEFAULTS[family]["defaults"].get(other)) else (
            f"{value!r} differs from {other} ({cfg.get(other)!r}), the value {family} reads")
    if want == "d/h":
        d, h = cfg.get("hidden_size"), cfg.get("num_attention_heads")
        return None if isinstance(d, int) and isinstance(h, int) and h and value == d // h else (
            f"{value!r}: {family} reads no head_dim; only hidden_size / num_attention_heads is interpreted")
    return None if value in want else f"{value!r}: only {', '.join(map(json.dumps, want))} is interpreted"


class Fields:
    """The fields of one language-model config as its family reads them."""

    def __init__(self, cfg: dict):
        model_type = cfg.get("model_type")
        if not isinstance(model_type, str):
            raise TypeError(f"config field 'model_type' must be a string, got {type(model_type).__name__}")
        self.cfg, self.model_type = cfg, model_type
        self.family = family_name(model_type) or ""
        self.defaults: dict[str, Any] = {}
        self.aliases: dict[str, str] = {}  # a field name transformers maps to another (attribute_map)
        self.absent: dict[str, Any] = {}  # field -> the family default used for it
        self.problems: dict[str, str] = {}  # field -> why it is not interpreted
        if not self.family:
            self.problems = {"model_type": f"{model_type!r} is not a family this card reads (it reads "
                                           f"{', '.join(sorted(FAMILIES))})"}
            self.problems |= {k: "not interpreted" for k in cfg if lesson_and_meaning(k) is None
                              and k not in BOOKKEEPING}
            return
        own = DEFAULTS[self.family]
        self.defaults, self.aliases = own["defaults"], own["aliases"]
        for key, value in cfg.items():
            if key in self.defaults or key in self.aliases or key == "model_type":
                rule = GLOSSARY["values"].get(key)
                if rule is not None and value not in rule["values"]:
                    self.problems[key] = f"{value!r}: {rule['why']}"
                continue
            if key in BOOKKEEPING:
                allowed = BOOKKEEPING[key]
                if allowed is not None and value not in allowed:
                    self.problems[key] = f"{value!r}: a causal decoder has {allowed[0]!r}"
                continue
            why = _accepted(self.family, key, value, cfg)
            if why is not None:
                self.problems[key] = why

    @property
    def title(self) -> str:
        return FAMILIES[self.family].title if self.family else self.model_type

    @property
    def alias_note(self) -> str | None:
        return ALIASES[self.model_type][1] if self.model_type in ALIASES else None

    def names(self, key: str) -> list[str]:
        """The names a config may write a field under: its own, an alias transformers maps to it, and, for a
        common name the family stores under its own (GPT-2's ``n_embd`` for ``hidden_size``), that name."""
        own = self.aliases.get(key)
        return [key, *(alias for alias, target in self.aliases.items() if target == key), *([own] if own else [])]

    def has(self, key: str) -> bool:
        return any(name in self.cfg for name in self.names(key))

    def get(self, key: str, default: Any = MISSING) -> Any:
        """The config's value (under the field or an alias transformers maps to it), else the family default."""
        for name in self.names(key):
            if name in self.cfg:
                return self.cfg[name]
        for name in (key, self.aliases.get(key, key)):
            if name in self.defaults:
                self.absent.setdefault(name, self.defaults[name])
                return self.defaults[name]
        return None if default is MISSING else default

    def written(self, key: str) -> str:
        """The name the config uses for a field (an alias, or the family's own name, if that is what it wrote;
        the family's own name if it wrote neither)."""
        return next((name for name in self.names(key) if name in self.cfg),
                    key if key in self.defaults else self.aliases.get(key, key))

    def int(self, key: str, minimum: int = 1, default: Any = MISSING) -> int:
        value = self.get(key, default) if key not in STATED or self.has(key) else None
        name = self.written(key)
        if value is None:
            raise ValueError(f"config field {name!r} is missing; every {self.title} config must give it "
                             f"(an int >= {minimum})")
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"config field {name!r} must be an int, got {type(value).__name__} {value!r}")
        if value < minimum:
            raise ValueError(f"config field {name!r} must be >= {minimum}, got {value}")
        return value

    def optional_int(self, key: str) -> builtins.int | None:
        """An int field that may be absent or null (None then)."""
        return None if self.get(key) is None else self.int(key)

    def int_list(self, key: str) -> list[builtins.int] | None:
        """A list of ints (layer indices), or None if absent or null."""
        value = self.get(key)
        if value is not None and (not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value)):
            raise TypeError(f"config field {key!r} must be a list of layer indices, got {value!r}")
        return value

    def flag(self, key: str | bool, default: bool = False) -> bool:
        """A family's fixed choice (a bool) or the value of the field that sets it."""
        if isinstance(key, bool):
            return key
        value = self.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise TypeError(f"config field {key!r} must be true or false, got {type(value).__name__} {value!r}")
        return value

    def refuse_if_unreadable(self, lines: tuple = ()) -> None:
        if self.problems:
            raise ConfigRefused(self.model_type, self.problems, lines)
