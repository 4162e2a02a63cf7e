"""The decoder skeleton (modern_block/decoder.py): every language model is DecoderLM with its parts, the positions
reach the blocks the way the model says, and the LM asks its rotary module for the tables."""

import pytest
import torch
import torch.nn as nn

from modern_block import GPT2LM, DecoderLM, GPT2Block, KVCache, LlamaStyleLM, MLAConfig, RotaryEmbedding


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


class Keep(nn.Module):
    """A block that keeps the x it is handed and passes it through."""

    def __init__(self):
        super().__init__()
        self.x = None

    def residual_projections(self) -> list:
        return []

    def forward(self, x, *tables, cache=None):
        self.x = x
        return x


def test_the_head_is_its_own_matrix_unless_tied():
    emb = nn.Embedding(10, 8)
    untied = DecoderLM(emb, [], nn.Identity(), max_len=4)  # the default
    assert not untied.tied and untied.head.weight.shape == (10, 8) and untied.head.bias is None
    assert DecoderLM(nn.Embedding(10, 8), [], nn.Identity(), max_len=4, tie=True).tied


def test_dropout_after_the_embeddings_in_training_only():
    """With dropout p, the first block sees the embeddings with a fraction p zeroed and the rest scaled by 1/(1-p)
    while training; in eval mode, and with p = 0, it sees them unchanged."""
    torch.manual_seed(0)
    keep = Keep()
    model = DecoderLM(nn.Embedding(10, 64), [keep], nn.Identity(), max_len=32, dropout=0.5)
    idx = torch.randint(0, 10, (4, 32))
    emb = model.emb(idx).detach()
    model.eval()(idx)
    assert torch.equal(keep.x, emb)
    model.train()(idx)
    kept = keep.x != 0
    assert 0.4 < kept.float().mean() < 0.6
    torch.testing.assert_close(keep.x[kept], 2 * emb[kept])
    plain = DecoderLM(nn.Embedding(10, 64), [keep], nn.Identity(), max_len=32).train()
    plain(idx)
    assert torch.equal(keep.x, plain.emb(idx))


@pytest.mark.parametrize("build", [lambda: GPT2LM(50, d=32, n_layers=2, n_heads=4, max_len=8),
                                   lambda: LlamaStyleLM(50, d=32, n_layers=2, n_heads=4, d_ff=40, max_len=8)],
                         ids=["learned", "rope"])
def test_a_cache_cannot_carry_a_sequence_past_max_len(build):
    """The tokens a cache holds count towards max_len: refused by name, not by an index error in a position table."""
    model = build().eval()
    cache = KVCache(n_layers=2, capacity=16)  # room enough: max_len is the limit
    with torch.no_grad():
        model(torch.zeros(1, 6, dtype=torch.long), cache)
        with pytest.raises(ValueError, match=r"^sequence length 9 \(idx.shape\[1\]=3, cache offset 6\) exceeds "
                                             r"max_len=8$"):
            model(torch.zeros(1, 3, dtype=torch.long), cache)
        model(torch.zeros(1, 2, dtype=torch.long), cache)  # 8 fits


class Positions(nn.Module):
    """A rotary module that keeps the positions it is asked for."""

    def forward(self, positions):
        self.positions = positions
        return ()


def test_the_default_positions_are_made_on_the_tokens_device():
    """On a GPU, positions made on the CPU would fail in the position table; "meta" stands in for such a device."""
    rope = Positions()
    model = DecoderLM(nn.Embedding(10, 16), [Keep()], nn.Identity(), max_len=16, rope=rope)
    model(torch.zeros(2, 5, dtype=torch.long))
    assert torch.equal(rope.positions, torch.arange(5))
    model.to("meta")(torch.zeros(2, 5, dtype=torch.long, device="meta"))
    assert rope.positions.device.type == "meta"
