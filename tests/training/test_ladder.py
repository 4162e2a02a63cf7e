"""The ladder's models: GPT2LM and LlamaStyleLM (tied and untied) among them, each model differs from its
neighbour in the switch it names, and every model is within 2% of GPT-2's parameters."""

import pytest
import torch
from training_setup import never_online, tiny  # noqa: F401 (never_online is an autouse fixture)

from modern_block import GPT2LM, DecoderLM, LlamaStyleLM, generate
from modern_block.training import config
from modern_block.training.ladder import (
    ABLATIONS,
    LADDER,
    LLAMA_END,
    MODEL_NAMES,
    ModelShape,
    Rung,
    build_model,
    get_rung,
    ladder_model,
    matched_d_ff,
    size_table,
)

EXACT = {"gpt2": "GPT2LM", "gpt2_untied": "GPT2LM(tie=False)", "llama": "LlamaStyleLM",
         "llama_tied": "LlamaStyleLM(tie=True)", "gpt2_nobias": "GPT2LM(bias=False)"}
SHAPE = ModelShape(d=48, n_layers=2, n_heads=6, n_kv_heads=2, block_size=32)


def _reference(rung: str, V: int = 65):
    s, d_ff = SHAPE, matched_d_ff(rung, SHAPE, V)
    return {"gpt2": lambda: build_model("gpt2", s, V),
            "gpt2_untied": lambda: GPT2LM(V, s.d, s.n_layers, s.n_heads, s.block_size, d_ff=d_ff, tie=False),
            "llama": lambda: build_model("llama", s, V),
            "llama_tied": lambda: LlamaStyleLM(V, s.d, s.n_layers, s.n_heads, s.n_kv_heads, d_ff, s.block_size,
                                               tie=True),
            "gpt2_nobias": lambda: GPT2LM(V, s.d, s.n_layers, s.n_heads, s.block_size, bias=False),
            }[rung]()


@pytest.mark.parametrize("rung", list(EXACT))
def test_ladder_ends_are_gpt2lm_and_llamastylelm(rung):
    torch.manual_seed(0)
    ref = _reference(rung)
    torch.manual_seed(0)
    lad = ladder_model(rung, SHAPE, 65)
    assert isinstance(lad, DecoderLM) and lad.num_parameters() == ref.num_parameters()
    ref_state, lad_state = ref.state_dict(), lad.state_dict()
    assert list(ref_state) == list(lad_state)  # the same parts, under the same names, in the same order
    for name, value in ref_state.items():  # same seed, same draws in the same order: the same weights
        assert torch.equal(lad_state[name], value), name
    assert (lad.head.weight is lad.emb.weight) == get_rung(rung).tie
    idx = torch.randint(0, 65, (2, 32))
    assert torch.equal(lad(idx), ref(idx))
    prompt = idx[:, :5]
    assert torch.equal(generate(lad, prompt, 8), generate(ref, prompt, 8)), "KV-cache decoding too"


def test_each_model_changes_what_it_says():
    steps = [rung.differences(prev) for prev, rung in zip(LADDER, LADDER[1:], strict=False)]
    # one change per rung; "attention": GPT-2's biased fused q/k/v -> Llama's bias-free wq, wk, wv, before RoPE
    assert steps == [["tie"], ["norm"], ["ffn"], ["attention"], ["positions"], ["gqa"], ["qk_norm"]]
    biases = {r: [n for n, _ in ladder_model(r, SHAPE, 65).named_parameters() if n.endswith("bias")]
              for r in ("swiglu", "bias_free", "gpt2_nobias")}
    assert biases["swiglu"] and all(".attn." in n for n in biases["swiglu"]), "only the attention keeps biases"
    assert biases["bias_free"] == [] and biases["gpt2_nobias"] == []
    llama = get_rung(LLAMA_END)
    assert [r.differences(llama) for r in ABLATIONS] == [["norm"], ["ffn"], ["positions"], ["qk_norm"], ["gqa"],
                                                         ["tie"]]


def test_no_rope_keeps_llama_attention_without_rotation():
    """With its position table zeroed, a one-layer no-RoPE model has no position signal at all: the last
    token's output does not change when the tokens before it are shuffled. The tied Llama (RoPE) does."""
    torch.manual_seed(0)
    one_layer = ModelShape(d=48, n_layers=1, n_heads=6, n_kv_heads=2, block_size=32)
    idx = torch.randint(0, 65, (1, 12))
    shuffled = torch.cat([idx[:, :-1].flip(1), idx[:, -1:]], dim=1)
    for rung, invariant in (("no_rope", True), (LLAMA_END, False)):
        model = ladder_model(rung, one_layer, 65)
        assert type(model.blocks[0].attn).__name__ == "GQAttention"
        if rung == "no_rope":
            cos, sin = model.rope(torch.arange(12))
            assert cos.shape == (12, 4) and bool((cos == 1).all()) and bool((sin == 0).all())
            with torch.no_grad():
                model.wpe.weight.zero_()
        with torch.no_grad():
            same = torch.allclose(model(idx)[:, -1], model(shuffled)[:, -1], atol=1e-5)
        assert same == invariant, rung


def test_post_norm_normalises_the_residual_stream():
    """Post-norm: every block's output is its second norm's output (unit RMS per position, before the scale);
    pre-norm's residual stream is not normalised. Otherwise the same model as Llama (the same weights)."""
    torch.manual_seed(0)
    post = ladder_model("post_norm", SHAPE, 65)
    torch.manual_seed(0)
    pre = ladder_model(LLAMA_END, SHAPE, 65)
    assert get_rung("post_norm").differences(get_rung(LLAMA_END)) == ["post_norm"]
    for (n1, p1), (n2, p2) in zip(post.state_dict().items(), pre.state_dict().items(), strict=True):
        assert n1 == n2 and torch.equal(p1, p2)
    x = post.emb(torch.randint(0, 65, (2, 16)))
    cos, sin = post.rope(torch.arange(16))
    out = post.blocks[0](x, cos, sin)
    rms = out.pow(2).mean(-1).sqrt()  # the norm's weight starts at 1
    assert torch.allclose(rms, torch.ones_like(rms), atol=1e-3)
    assert not torch.allclose(pre.blocks[0](x, cos, sin).pow(2).mean(-1).sqrt(), rms, atol=1e-2)
    with pytest.raises(ValueError, match="post_norm needs"):
        Rung("bad", post_norm=True)


def test_rung_switches_are_checked():
    with pytest.raises(ValueError, match="attention='llama'"):
        Rung("bad", positions="rope")
    with pytest.raises(ValueError, match="norm must be one of"):
        Rung("bad", norm="batchnorm")
    with pytest.raises(ValueError, match="rung must be one of"):
        get_rung("nope")


@pytest.mark.parametrize("shape", [ModelShape(), config.quick_config().shape, ModelShape(32, 2, 4, 2, 32),
                                   ModelShape(32, 2, 4, 2, 16)], ids=["gpu", "quick", "lesson", "tiny"])
@pytest.mark.parametrize("V", [65, 96], ids=["tinyshakespeare", "stdlib"])
def test_every_model_is_within_2_percent_of_gpt2(shape, V):
    rows = size_table(shape, V)
    assert [r["rung"] for r in rows] == list(MODEL_NAMES)
    assert rows[0]["ratio"] == 1.0 and rows[0]["d_ff"] == 4 * shape.d
    by_name = {r["rung"]: r for r in rows}
    for row in rows:  # nanoGPT's bias-free GPT-2 is taken as it is (d_ff = 4d): 2.5% below in the tiny shapes
        assert 0.98 <= row["ratio"] <= 1.02 or (row["rung"] == "gpt2_nobias" and row["ratio"] > 0.97), row
    assert by_name["gpt2_nobias"]["d_ff"] == 4 * shape.d
    assert by_name["gpt2_untied"]["d_ff"] < 4 * shape.d, "the untied head's V·d comes out of the MLP"
    assert by_name["rmsnorm"]["d_ff"] == by_name["gpt2_untied"]["d_ff"], "RMSNorm's saving is too small to move it"
    with torch.device("meta"):  # count without allocating
        assert build_model("llama", shape, V).num_parameters() == by_name[LLAMA_END]["params"]
