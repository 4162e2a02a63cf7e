"""RoPE: relative positions, norms, the two layouts and the permutation between them."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from modern_block import (
    apply_rope,
    apply_rope_interleaved,
    permute_qk_weight,
    rope_cache,
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
