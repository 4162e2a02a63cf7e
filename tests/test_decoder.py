"""The decoder skeleton (modern_block/decoder.py): every language model is DecoderLM with its parts, the positions
reach the blocks the way the model says, and the LM asks its rotary module for the tables."""

import pytest
import torch
import torch.nn as nn

from modern_block import GPT2LM, DecoderLM, GPT2Block, LlamaStyleLM, MLAConfig, RotaryEmbedding


class Recorder(nn.Module):
    """A block that records what the skeleton hands it and passes x through."""

    def __init__(self, seen: list):
        super().__init__()
        self.seen = seen

    def residual_projections(self) -> list:
        return []

    def forward(self, x, *tables, cache=None):
        self.seen.append((x.shape, [t.shape for t in tables], cache))
        return x


def test_gpt2lm_is_the_skeleton_with_gpt2s_parts():
    torch.manual_seed(0)
    gpt2 = GPT2LM(50, d=32, n_layers=2, n_heads=4, max_len=16)
    torch.manual_seed(0)
    parts = DecoderLM(nn.Embedding(50, 32), [GPT2Block(32, 4) for _ in range(2)], nn.LayerNorm(32), max_len=16,
                      wpe=nn.Embedding(16, 32), tie=True)
    assert list(gpt2.state_dict()) == list(parts.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(gpt2.state_dict().values(), parts.state_dict().values(), strict=True))
    idx = torch.randint(0, 50, (2, 9))
    assert torch.equal(gpt2(idx), parts(idx)) and isinstance(gpt2, DecoderLM) and gpt2.tied


def test_blocks_get_the_rotary_tables_only_when_the_model_rotates():
    for rope, tables in ((None, []), (RotaryEmbedding(8, 16), [(5, 4), (5, 4)])):
        seen = []
        model = DecoderLM(nn.Embedding(10, 16), [Recorder(seen), Recorder(seen)], nn.Identity(), max_len=16,
                          rope=rope)
        model(torch.zeros(3, 5, dtype=torch.long))
        assert seen == [((3, 5, 16), tables, None)] * 2


def test_the_rotary_table_has_the_rotated_size_of_a_head():
    """The LM sizes its RoPE module from its own arguments, not from a block."""
    assert LlamaStyleLM(50, d=32, n_layers=1, n_heads=4, d_ff=40).rope.dim == 8
    assert LlamaStyleLM(50, d=32, n_layers=1, n_heads=4, d_ff=40, head_dim=12).rope.dim == 12
    mla = LlamaStyleLM(50, d=32, n_layers=1, n_heads=4, d_ff=40,
                       mla=MLAConfig(kv_latent_dim=16, rope_dim=6, nope_dim=8, v_head_dim=8))
    assert mla.rope.dim == 6 and mla.rope.cos.shape == (1024, 3)
    assert not any(k.startswith("rope") for k in mla.state_dict())  # computed, not learned: not saved


@pytest.mark.parametrize("build", [lambda: GPT2LM(50, d=32, n_layers=1, n_heads=4, max_len=16),
                                   lambda: LlamaStyleLM(50, d=32, n_layers=1, n_heads=4, d_ff=40, max_len=16)],
                         ids=["learned", "rope"])
def test_explicit_positions_reach_either_kind_of_positions(build):
    torch.manual_seed(0)
    model = build().eval()
    idx = torch.randint(0, 50, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(model(idx, positions=torch.arange(6)), model(idx), rtol=0, atol=0)
        per_sequence = torch.stack([torch.arange(6), torch.arange(0, 12, 2)])  # [B, T]: the second one spaced out
        out = model(idx, positions=per_sequence)
        torch.testing.assert_close(out[0], model(idx[:1])[0], rtol=0, atol=1e-6)
        torch.testing.assert_close(out[1], model(idx[1:], positions=torch.arange(0, 12, 2))[0], rtol=0, atol=1e-6)
        assert (out[1] - model(idx[1:])[0]).abs().max() > 1e-4  # the spacing is seen
    with pytest.raises(ValueError, match=r"positions must lie in \[0, max_len=16\)"):
        model(idx, positions=torch.arange(11, 17))


def test_bad_parts_are_refused():
    with pytest.raises(ValueError, match="max_len must be positive"):
        DecoderLM(nn.Embedding(10, 8), [], nn.Identity(), max_len=0)
    with pytest.raises(ValueError, match="dropout must be in"):
        DecoderLM(nn.Embedding(10, 8), [], nn.Identity(), max_len=4, dropout=-0.1)
    with pytest.raises(ValueError, match="n_heads must be positive"):
        GPT2LM(10, n_heads=0)
