"""The architecture a config describes: the sizes every count needs, and what each layer is (full, sliding or
chunked attention; with or without RoPE; dense FFN or mixture of experts), read the way the config's family
reads it (``config_families``). A config the card cannot read raises ``ConfigRefused`` naming the fields."""

from dataclasses import dataclass
from typing import Any

from .config_families import FAMILIES, Family
from .config_fields import Fields

LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding", "chunked_attention": "chunked"}


@dataclass(frozen=True)
class Layer:
    attention: str = "full"  # full | sliding (keeps the last `window` tokens) | chunked (attends within chunks)
    window: int | None = None  # tokens a sliding or chunked layer keeps in its cache
    rope: bool = True  # False: a NoPE layer (no position encoding at all)
    moe: bool = False  # the FFN is a mixture of experts


@dataclass(frozen=True)
class Experts:
    n: int  # routed experts per MoE layer
    top_k: int  # experts each token runs
    width: int  # one expert's hidden width
    n_shared: int = 0  # experts every token runs
    shared_width: int = 0
    shared_gate: bool = False
    router_bias: bool = False
    expert_bias: bool = False


@dataclass(frozen=True)
class Architecture:
    model_type: str
    family: str  # the key of config_families.FAMILIES
    d: int
    n_layers: int
    vocab: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int | None  # the dense FFN's hidden width (None if every layer is a mixture of experts)
    tied: bool
    layers: tuple[Layer, ...]
    qk_norm_kind: str | None  # head | all_heads | weightless (config_families.Family.qk_norm)
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    head_bias: bool
    activation: str
    context: int | None = None  # max_position_embeddings: the longest context the config promises
    positions: int = 0  # learned position vectors (GPT-2's table of max_position_embeddings); 0 with RoPE
    mla: dict | None = None  # kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
    experts: Experts | None = None
    assumptions: tuple[str, ...] = ()

    @property
    def spec(self) -> Family:
        return FAMILIES[self.family]

    @property
    def qk_norm(self) -> bool:
        return self.qk_norm_kind is not None

    @property
    def moe_layers(self) -> int:
        return sum(layer.moe for layer in self.layers)

    @property
    def n_experts(self) -> int:
        return self.experts.n if self.experts else 0

    @property
    def top_k(self) -> int:
        return self.experts.top_k if self.experts else 0

    @property
    def d_expert(self) -> int:
        return self.experts.width if self.experts else 0

    @property
    def n_shared(self) -> int:
        return self.experts.n_shared if self.experts else 0

    @property
    def sliding_layers(self) -> int:
        """Layers whose cache stops growing at a window (sliding or chunked)."""
        return sum(layer.attention != "full" for layer in self.layers)

    @property
    def window(self) -> int | None:
        """The window of the local layers (the first one's, when several differ)."""
        return next((layer.window for layer in self.layers if layer.attention != "full"), None)

    @property
    def nope_layers(self) -> int:
        return sum(not layer.rope for layer in self.layers)


def _per_layer(f: Fields, key: str, n: int, kind: type) -> list | None:
    """A per-layer list the config gives (a family default's length is the default depth: never used)."""
    value = f.cfg.get(key)
    if value is None or value == []:
        return None
    if not isinstance(value, list) or len(value) != n or not all(isinstance(v, kind) for v in value):
        raise ValueError(f"config field {key!r} must list one {kind.__name__} per layer ({n}), got {value!r}")
    return value


def rope_layers(f: Fields, fam: Family, n: int) -> list[bool]:
    """Which layers rotate q and k (Llama 4 and SmolLM3 leave every ``no_rope_layer_interval``-th without; with
    learned positions none does)."""
    if fam.positions == "learned":
        return [False] * n
    if fam.rope_layers == "all":
        return [True] * n
    flags = _per_layer(f, "no_rope_layers", n, int)  # 1: the layer uses RoPE, 0: it does not (the field's sense)
    if flags is None:
        every = f.int("no_rope_layer_interval")
        flags = [int((i + 1) % every != 0) for i in range(n)]
    return [bool(x) for x in flags]


def _sliding_window(f: Fields) -> int | None:
    """The window a sliding layer keeps (None: the family turns it off)."""
    window = f.get("sliding_window")
    if "use_sliding_window" in f.defaults and not f.flag("use_sliding_window"):
        return None
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 0):
        raise TypeError(f"config field 'sliding_window' must be an int or null, got {window!r}")
    return window or None


def layer_kinds(f: Fields, fam: Family, n: int, rope: list[bool]) -> list[str]:
    """full / sliding / chunked for each layer: ``layer_types`` where the family reads it, else its own rule."""
    types = _per_layer(f, "layer_types", n, str) if "layer_types" in f.defaults else None
    if types is not None:
        unknown = sorted(set(types) - set(LAYER_TYPES))
        if unknown:
            f.problems["layer_types"] = f"layer types {unknown} are not attention layers this card models"
            return ["full"] * n
        return [LAYER_TYPES[t] for t in types]
    window, rule = _sliding_window(f), fam.windows
    if rule == "llama4":
        chunked = f.get("attention_chunk_size") is not None
        return ["chunked" if r and chunked else "full" for r in rope]
    if window is None or rule == "none":
        return ["full"] * n
    every = {"alternate": 2, "every4th": 4, "pattern6": 6, "pattern4": 4}.get(rule)
    if rule in ("pattern6", "pattern4", "exaone4"):
        every = f.get("sliding_window_pattern", f.get("_sliding_window_pattern", every))
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            f.problems["sliding_window_pattern"] = f"{every!r}: only an int n (every n-th layer global) is read"
            return ["full"] * n
    local = {
        "all": lambda i: True, "all_if_used": lambda i: True, "ministral": lambda i: True,
        "qwen2": lambda i: i >= f.int("max_window_layers", minimum=0),
        "qwen2_moe": lambda i: bool((i + 1) % 2) and i < f.int("max_window_layers", minimum=0),
        "smollm3": lambda i: not rope[i],
        "every4th_from0": lambda i: i % 4 != 0,  # CWM: layer 0 global, then three local per global
    }.get(rule, lambda i: bool((i + 1) % every))
    return ["sliding" if local(i) else "full" for i in range(n)]


def _moe_flags(f: Fields, fam: Family, n: int) -> list[bool]:
    moe = fam.moe
    if moe is None:
        return [False] * n
    if moe.layers == "all":
        return [True] * n
    if moe.layers == "qwen":
        step, dense = f.int("decoder_sparse_step"), set(f.int_list("mlp_only_layers") or [])
        return [i not in dense and (i + 1) % step == 0 for i in range(n)]
    if moe.layers == "first_k":
        first = f.int("first_k_dense_replace", minimum=0)
        return [i >= first for i in range(n)]
    listed = f.int_list("moe_layers")
    if listed is None:
        step = f.int("interleave_moe_layer_step")
        listed = list(range(step - 1, n, step))
    return [i in set(listed) for i in range(n)]


def _experts(f: Fields, fam: Family) -> Experts:
    moe = fam.moe
    assert moe is not None
    n_shared, shared_width = 0, 0
    if moe.shared == "count":
        n_shared, shared_width = f.int("n_shared_experts", minimum=0), f.int(moe.width)
    elif moe.shared is not None:
        n_shared, shared_width = 1, f.int(moe.shared, minimum=0)
    return Experts(f.int(moe.experts), f.int("num_experts_per_tok"), f.int(moe.width), n_shared, shared_width,
                   moe.shared_gate, moe.router_bias, moe.expert_bias)


def _head_dim(f: Fields, fam: Family, d: int, h: int) -> int:
    """head_dim where the config gives it (every family's attention reads it then), else d / h."""
    if f.get("head_dim") is not None:
        if fam.head_dim_read:
            return f.int("head_dim")
        if f.get("head_dim") != d // h:
            f.problems["head_dim"] = f"{f.get('head_dim')!r}: {fam.title} always uses hidden_size / heads ({d // h})"
    if d % h:
        raise ValueError(f"head_dim is missing and hidden_size ({d}) is not a multiple of num_attention_heads "
                         f"({h}): the head width is unknown")
    return d // h


def _mla(f: Fields) -> dict[str, Any]:
    mla: dict[str, Any] = {k: f.int(k) for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                                 "v_head_dim")}
    mla["q_lora_rank"] = None if f.get("q_lora_rank") is None else f.int("q_lora_rank")
    return mla


def read_architecture(f: Fields) -> Architecture:
    """The numbers of a language-model config its family reads; a missing field or a wrong type raises, naming it.
    Fields the card cannot interpret are collected in ``f.problems`` (the caller refuses on them)."""
    fam = FAMILIES[f.family]
    d, n = f.int("hidden_size"), f.int("num_hidden_layers")
    vocab, h = f.int("vocab_size"), f.int("num_attention_heads")
    kv = f.int("num_key_value_heads", default=h) if f.get("num_key_value_heads") is not None else h
    if h % kv:
        raise ValueError(f"num_attention_heads ({h}) must be a multiple of num_key_value_heads ({kv})")
    mla = _mla(f) if fam.mla else None
    head_dim = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"] if mla else _head_dim(f, fam, d, h)
    chunk = f.optional_int("attention_chunk_size") if "attention_chunk_size" in f.defaults else None
    rope = rope_layers(f, fam, n)
    kinds = layer_kinds(f, fam, n, rope)
    window = _sliding_window(f)
    moe = _moe_flags(f, fam, n)
    layers = tuple(Layer(kind if (kind != "sliding" or window) else "full",
                         {"sliding": window, "chunked": chunk}.get(kind), rope[i], moe[i])
                   for i, kind in enumerate(kinds))
    experts = _experts(f, fam) if any(moe) else None
    dense_key = fam.moe.dense_width if fam.moe else fam.ffn_width
    d_ff = None if all(moe) else 4 * d if fam.ffn_null_is_4d and f.get(dense_key) is None else f.int(dense_key)
    switch = fam.qk_norm_switch
    qk_norm = fam.qk_norm if fam.qk_norm and (switch is None or f.flag(switch)) else None
    activation = f.get(fam.act_field)
    if not isinstance(activation, str):
        raise TypeError(f"config field {fam.act_field!r} must be an activation's name, got {activation!r}")
    tied = f.flag("tie_word_embeddings")
    arch = Architecture(f.model_type, f.family, d, n, vocab, h, kv, head_dim, d_ff, tied, layers, qk_norm,
                        f.flag(fam.qkv_bias), f.flag(fam.o_bias), f.flag(fam.mlp_bias), f.flag(fam.head_bias),
                        activation, f.optional_int("max_position_embeddings"),
                        f.int("max_position_embeddings") if fam.positions == "learned" else 0, mla, experts)
    notes = [f"{key} absent: {fam.title}'s default, {value!r} (transformers' own)" for key, value in f.absent.items()
             if value is not None and key in ("tie_word_embeddings", "head_dim", "num_key_value_heads", "mlp_bias",
                                              "attention_bias", "sliding_window", "use_qk_norm", "qkv_bias",
                                              "use_bias")]
    if f.alias_note:
        notes.insert(0, f.alias_note)
    return Architecture(**{**arch.__dict__, "assumptions": tuple(notes)})
