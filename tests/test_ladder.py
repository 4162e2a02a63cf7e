"""The ladder's models: its ends are GPT2LM and LlamaStyleLM, every rung within 2% of GPT-2's parameters."""

import pytest
import torch
from training_setup import never_online, tiny  # noqa: F401 (never_online is an autouse fixture)

from modern_block import generate
from modern_block import train as T
from modern_block.ladder import RUNG_NAMES, ModelShape, build_model, ladder_model, size_table

RENAME = {"wte": "emb", "wpe": "pos", "ln1": "norm1", "ln2": "norm2", "mlp": "ffn", "ln_f": "norm",
          "attn_norm": "norm1", "ffn_norm": "norm2"}


def _ladder_name(name: str) -> str:
    return ".".join(RENAME.get(part, part) for part in name.split("."))


@pytest.mark.parametrize("rung, reference", [("gpt2", "gpt2"), ("untied", "llama")])
def test_ladder_ends_are_gpt2lm_and_llamastylelm(rung, reference):
    shape = ModelShape(d=48, n_layers=2, n_heads=6, n_kv_heads=2, block_size=32)
    torch.manual_seed(0)
    ref = build_model(reference, shape, 65)
    torch.manual_seed(0)
    lad = ladder_model(rung, shape, 65)
    assert lad.num_parameters() == ref.num_parameters()
    ref_state, lad_state = ref.state_dict(), lad.state_dict()
    assert sorted(map(_ladder_name, ref_state)) == sorted(lad_state)
    for name, value in ref_state.items():  # same seed, same draws in the same order: the same weights
        assert torch.equal(lad_state[_ladder_name(name)], value), name
    idx = torch.randint(0, 65, (2, 32))
    assert torch.equal(lad(idx), ref(idx))
    prompt = idx[:, :5]
    assert torch.equal(generate(lad, prompt, 8), generate(ref, prompt, 8)), "KV-cache decoding too"


@pytest.mark.parametrize("shape", [ModelShape(), T.quick_config().shape, ModelShape(32, 2, 4, 2, 16)],
                         ids=["gpu", "quick", "tiny"])
def test_every_rung_is_within_2_percent_of_gpt2(shape):
    rows = size_table(shape, 65)
    assert [r["rung"] for r in rows] == list(RUNG_NAMES)
    assert rows[0]["ratio"] == 1.0
    for row in rows:
        assert 0.98 <= row["ratio"] <= 1.02, row
    with torch.device("meta"):  # count without allocating
        assert build_model("llama", shape, 65).num_parameters() == rows[-1]["params"]
