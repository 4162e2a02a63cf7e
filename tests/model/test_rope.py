"""RoPE: relative positions, norms, the two layouts and the permutation between them."""

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from modern_block import (
    RotaryEmbedding,
    apply_rope,
    apply_rope_interleaved,
    permute_qk_weight,
    rope_cache,
    rope_frequencies,
)

GiB, MiB, KiB = 2**30, 2**20, 2**10


def _score(q, k, cos, sin, m, n):
    qm = apply_rope(q, cos[m:m + 1], sin[m:m + 1])
    kn = apply_rope(k, cos[n:n + 1], sin[n:n + 1])
    return (qm * kn).sum().item()


def test_rope_chapter_relative_position_check():
    torch.manual_seed(0)
    dh = 8
    cos, sin = rope_cache(64, dh)
    q, k = torch.randn(1, 1, 1, dh), torch.randn(1, 1, 1, dh)
    assert cos.shape == sin.shape == (64, dh // 2)
    assert _score(q, k, cos, sin, 5, 2) == pytest.approx(_score(q, k, cos, sin, 40, 37), abs=1e-5)
    assert _score(q, k, cos, sin, 10, 10) == pytest.approx(_score(q, k, cos, sin, 0, 0), abs=1e-5)
    assert _score(q, k, cos, sin, 5, 2) != pytest.approx(_score(q, k, cos, sin, 5, 3), abs=1e-3)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 500), n=st.integers(0, 500), shift=st.integers(0, 500),
       half_dh=st.integers(1, 32), base=st.sampled_from([100.0, 10000.0, 500000.0, 1e6]), seed=st.integers(0, 99))
def test_rope_score_depends_only_on_offset(m, n, shift, half_dh, base, seed):
    dh = 2 * half_dh
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 1, 1, dh, generator=g, dtype=torch.float64), torch.randn(1, 1, 1, dh, generator=g,
                                                                                     dtype=torch.float64)
    cos, sin = (t.double() for t in rope_cache(1001, dh, base))
    a, b = _score(q, k, cos, sin, m, n), _score(q, k, cos, sin, m + shift, n + shift)
    # fp32 angles: the rounding of m·θ grows with the position, so allow ~1e-4 relative
    assert a == pytest.approx(b, abs=1e-4 * (1 + abs(a)) * dh)


@settings(max_examples=30, deadline=None)
@given(pos=st.integers(0, 4000), half_dh=st.integers(1, 64), base=st.sampled_from([10000.0, 500000.0, 1e6]))
def test_rope_preserves_norm(pos, half_dh, base):
    dh = 2 * half_dh
    x = torch.randn(2, 3, 1, dh)
    cos, sin = rope_cache(pos + 1, dh, base)
    for rope in (apply_rope, apply_rope_interleaved):
        y = rope(x, cos[pos:pos + 1], sin[pos:pos + 1])
        torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5, rtol=1e-5)


def test_rope_position_zero_is_identity_and_layouts_differ():
    x = torch.randn(1, 2, 3, 16)
    cos, sin = rope_cache(3, 16)
    torch.testing.assert_close(apply_rope(x, cos[:1], sin[:1]), x)
    assert not torch.allclose(apply_rope(x, cos, sin), apply_rope_interleaved(x, cos, sin), atol=1e-3)


def test_interleaved_and_half_split_scores_match_after_permuting_weights():
    torch.manual_seed(0)
    d, h, dh, T = 32, 4, 8, 10
    wq, wk = torch.randn(h * dh, d), torch.randn(h * dh, d)
    x = torch.randn(1, T, d)
    cos, sin = rope_cache(T, dh)

    def scores(wq, wk, rope):
        q = (x @ wq.T).view(1, T, h, dh).transpose(1, 2)
        k = (x @ wk.T).view(1, T, h, dh).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        return q @ k.transpose(-1, -2)  # [1, h, T, T]

    inter = scores(wq, wk, apply_rope_interleaved)  # weights "trained" for the interleaved layout
    half = scores(permute_qk_weight(wq, h), permute_qk_weight(wk, h), apply_rope)
    torch.testing.assert_close(half, inter, atol=1e-4, rtol=1e-5)
    mixed = scores(wq, wk, apply_rope)  # the pitfall: unpermuted weights in the other layout
    assert (mixed - inter).abs().max() > 1.0
    back = permute_qk_weight(permute_qk_weight(wq, h), h, to="interleaved")
    torch.testing.assert_close(back, wq)


def test_rope_table_mismatch_is_a_clear_error():
    x = torch.randn(1, 2, 4, 8)
    cos, sin = rope_cache(4, 6)
    with pytest.raises(ValueError, match="head_dim/2 = 4"):
        apply_rope(x, cos, sin)


def test_the_interleaved_layout_rotates_neighbouring_pairs():
    """Pair i is (x[2i], x[2i+1]), rotated by the angle m·θ_i: checked coordinate by coordinate."""
    torch.manual_seed(0)
    x = torch.randn(1, 1, 3, 8)  # positions 0..2, dh 8
    cos, sin = rope_cache(3, 8)  # [3, 4]
    out = apply_rope_interleaved(x, cos, sin)
    for m in range(3):
        for i in range(4):
            a, b = x[0, 0, m, 2 * i], x[0, 0, m, 2 * i + 1]
            c, s = cos[m, i], sin[m, i]
            torch.testing.assert_close(out[0, 0, m, 2 * i], a * c - b * s)
            torch.testing.assert_close(out[0, 0, m, 2 * i + 1], a * s + b * c)


def test_permute_qk_weight_refuses_bad_arguments_by_name():
    w = torch.zeros(16, 4)
    with pytest.raises(ValueError, match=r"^n_heads must be positive, got 0$"):
        permute_qk_weight(w, 0)
    with pytest.raises(ValueError, match=r"^to must be 'half_split' or 'interleaved', got 'halfsplit'$"):
        permute_qk_weight(w, 2, to="halfsplit")
    with pytest.raises(ValueError, match=r"^weight.shape\[0\] \(16\) must be divisible by n_heads \(3\)$"):
        permute_qk_weight(w, 3)


def test_the_default_base_is_10000():
    """θ_i = 10000^(-2i/d_h) (the RoPE paper's base) wherever the base is left out."""
    for dh in (8, 64):
        want = torch.tensor([10000.0 ** (-2 * i / dh) for i in range(dh // 2)], dtype=torch.float64)
        torch.testing.assert_close(rope_frequencies(dh).double(), want, rtol=1e-6, atol=0)
    cos, sin = rope_cache(16, 8)
    torch.testing.assert_close((cos, sin), rope_cache(16, 8, 10000.0), rtol=0, atol=0)
    rope = RotaryEmbedding(8, 16)
    torch.testing.assert_close((rope.cos, rope.sin), (cos, sin), rtol=0, atol=0)
    assert "base=10000" in repr(rope)


def test_any_base_above_one_is_accepted():
    for base in (1.5, 2.0, 500000.0):
        want = torch.tensor([base ** (-2 * i / 8) for i in range(4)], dtype=torch.float64)
        torch.testing.assert_close(rope_frequencies(8, base).double(), want, rtol=1e-6, atol=0)


_x8, _table = torch.zeros(1, 2, 5, 8), torch.zeros(5, 4)


@pytest.mark.parametrize("call, message", [
    (lambda: rope_frequencies(7), "dh must be even for RoPE (dimensions are rotated in pairs), got 7"),
    (lambda: rope_frequencies(8, 1.0), "base must be > 1, got 1.0"),
    (lambda: rope_frequencies(8, 0.5), "base must be > 1, got 0.5"),
    (lambda: RotaryEmbedding(0, 16), "dim must be positive, got 0"),
    (lambda: RotaryEmbedding(7, 16), "dim must be even for RoPE (dimensions are rotated in pairs), got 7"),
    (lambda: RotaryEmbedding(8, 0), "max_len must be positive, got 0"),
    (lambda: apply_rope(torch.zeros(1, 2, 5, 7), _table, _table),
     "the head dimension x.shape[-1] must be even for RoPE, got 7"),
    (lambda: apply_rope_interleaved(torch.zeros(1, 2, 5, 7), _table, _table),
     "the head dimension x.shape[-1] must be even for RoPE, got 7"),
    (lambda: apply_rope(_x8, _table, torch.zeros(3, 4)), "cos and sin must have the same shape, got [5, 4] and [3, 4]"),
    (lambda: apply_rope(_x8, torch.zeros(5, 3), torch.zeros(5, 3)), "cos/sin last dim must be head_dim/2 = 4, got 3"),
    (lambda: apply_rope_interleaved(_x8, torch.zeros(1, 5, 3), torch.zeros(1, 5, 3)),
     "cos/sin last dim must be head_dim/2 = 4, got 3"),
], ids=["odd-dh", "base-1", "base-0.5", "dim-0", "odd-dim", "max_len-0", "odd-x", "odd-x-interleaved",
        "cos-vs-sin", "last-dim", "last-dim-per-sequence"])
def test_bad_rope_arguments_are_refused_with_the_argument_and_the_rule(call, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call()


@pytest.mark.parametrize("dtype, tol", [(torch.bfloat16, 2e-2), (torch.float16, 2e-3), (torch.float64, 0.0)])
def test_x_is_rotated_in_its_own_dtype(dtype, tol):
    """float32 tables rotate bf16/fp16 (or fp64) activations in the activations' dtype, as Hugging Face does."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 8).to(dtype)
    cos, sin = rope_cache(5, 8)  # float32
    for rope in (apply_rope, apply_rope_interleaved):
        y = rope(x, cos, sin)
        assert y.dtype == dtype
        want = rope(x.double(), cos.double(), sin.double())  # the same rotation of the same x, in float64
        torch.testing.assert_close(y.double(), want, atol=tol, rtol=tol)


def test_the_tables_are_built_on_the_device_asked():
    """The meta device stands in for a GPU: a table computed on the CPU and left there would not come back on it."""
    cos, sin = rope_cache(16, 8, device="meta")
    assert cos.device.type == sin.device.type == "meta" and cos.shape == sin.shape == (16, 4)
    yarn = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=8)
    cos, sin = rope_cache(16, 8, device=torch.device("meta"), scaling=yarn)
    assert cos.device.type == sin.device.type == "meta" and cos.shape == (16, 4)
