"""Rotary position embeddings (Su et al., 2021).

Each head vector is split into d_h/2 pairs; pair i of the token at position m is rotated by the
angle m·θ_i with θ_i = base^(-2i/d_h). Rotating q and k by their own positions makes the score
q_m·k_n depend on the offset n - m only, because R(a)ᵀR(b) = R(b - a).

Two layouts pair the dimensions differently, and weights trained with one only work with it:
  * half-split ("rotate half", Llama/Hugging Face): dimension i pairs with i + d_h/2;
  * interleaved (the RoFormer paper, Meta's original Llama code): dimension 2i pairs with 2i+1.
A fixed permutation of each head's q/k output rows converts one into the other.

RoPE scaling (context extension) changes only the frequencies θ_i, so that positions beyond the
trained context L₀ produce angles the model has (nearly) seen; each rule is one small function of
the frequencies below, and ``rope_cache(..., scaling=...)`` builds the table from it. A scaling is
given as Hugging Face's ``rope_parameters`` dict without ``rope_theta``, for example Llama 3.1's
``{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
"original_max_position_embeddings": 8192}``.
"""

import math

import torch
import torch.nn as nn

from .validate import even, non_negative_number, positive_int, positive_number


def rope_frequencies(dh: int, base: float = 10000.0) -> torch.Tensor:
    """θ_i = base^(-2i/dh) for i = 0 .. dh/2-1, in radians per token. Shape [dh/2]."""
    positive_int("dh", dh)
    even("dh", dh, "for RoPE (dimensions are rotated in pairs)")
    if not base > 1:
        raise ValueError(f"base must be > 1, got {base}")
    return 1.0 / (base ** (torch.arange(0, dh, 2, dtype=torch.float32) / dh))  # [dh/2]


# ---------------------------------------------------------------------------------------------
# RoPE scaling: new frequencies θ'_i for a context longer than the trained one (L₀)
# ---------------------------------------------------------------------------------------------
def linear_frequencies(theta: torch.Tensor, factor: float) -> torch.Tensor:
    """Position interpolation (Chen et al., 2023):  θ'_i = θ_i / s.

    Position m then turns pair i by m·θ_i/s = (m/s)·θ_i: positions 0 .. s·L₀ are squeezed into the
    angles of 0 .. L₀, so no angle is new, but neighbouring tokens sit s times closer in every pair.
    """
    return theta / factor  # [dh/2]


def dynamic_ntk_frequencies(dh: int, base: float, factor: float, seq_len, original_len: int) -> torch.Tensor:
    """Dynamic NTK-aware scaling (bloc97 and emozilla, 2023): a larger base once the sequence outgrows L₀.

        b' = b · (s·L/L₀ − (s − 1))^(d_h/(d_h − 2))    with L = max(seq_len, L₀),   θ'_i = b'^(−2i/d_h)

    The exponent is chosen so that the fastest pair (i = 0, θ = 1) keeps its frequency and the slowest
    one (i = d_h/2 − 1) is divided by exactly s·L/L₀ − (s − 1): high frequencies extrapolate, low ones
    interpolate. At L ≤ L₀ nothing changes; the frequencies depend on the length being processed.
    ``seq_len`` may be an int or a 0-dim tensor (then nothing leaves the device: see ``RotaryEmbedding``).
    """
    positive_int("dh", dh)
    even("dh", dh, "for RoPE (dimensions are rotated in pairs)")
    length = torch.as_tensor(seq_len, dtype=torch.float64).clamp(min=original_len)  # L, in float64 like Python
    new_base = base * (factor * length / original_len - (factor - 1)) ** (dh / (dh - 2))  # b', a 0-dim tensor
    exponents = torch.arange(0, dh, 2, dtype=torch.float32, device=length.device) / dh  # 2i/dh, [dh/2]
    return 1.0 / (new_base ** exponents)  # [dh/2], float32 (as rope_frequencies with base b')


def yarn_frequencies(dh: int, base: float, factor: float, original_len: int, beta_fast: float = 32.0,
                     beta_slow: float = 1.0, truncate: bool = True) -> torch.Tensor:
    """YaRN's frequencies, "NTK-by-parts" (Peng et al., 2023).

    Pair i turns r_i = L₀·θ_i / 2π times over the original context. Pairs that turn more than β_fast
    times keep θ_i (they already saw every angle); pairs that turn less than β_slow times are
    interpolated as in PI (θ_i/s); a linear ramp over the pair index blends the two in between:

        θ'_i = γ_i·θ_i + (1 − γ_i)·θ_i/s,    γ_i = clamp((i_slow − i) / (i_slow − i_fast), 0, 1)

    where i_β = d_h·ln(L₀ / (2π·β)) / (2·ln b) is the (fractional) pair index that turns β times,
    rounded outwards (floor for i_fast, ceil for i_slow) when ``truncate``.
    """
    theta = rope_frequencies(dh, base)  # [dh/2]

    def pair_turning(rotations):  # i_β
        return dh * math.log(original_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    i_fast, i_slow = pair_turning(beta_fast), pair_turning(beta_slow)
    if truncate:
        i_fast, i_slow = math.floor(i_fast), math.ceil(i_slow)
    i_fast, i_slow = max(i_fast, 0), min(i_slow, dh - 1)
    if i_slow == i_fast:
        i_slow += 0.001  # a step instead of a ramp, without dividing by zero
    i = torch.arange(dh // 2, dtype=torch.float32)
    gamma = 1 - ((i - i_fast) / (i_slow - i_fast)).clamp(0, 1)  # [dh/2]: 1 = keep θ_i, 0 = θ_i/s
    return (theta / factor) * (1 - gamma) + theta * gamma


def yarn_attention_factor(factor: float, mscale: float | None = None, mscale_all_dim: float | None = None) -> float:
    """YaRN's attention temperature, as a factor on q and k:  √(1/t) = 0.1·ln(s) + 1  (1 for s ≤ 1).

    Rotating q and k with tables multiplied by this factor multiplies every attention logit by its
    square, 1/t: stretched contexts flatten the softmax (more keys, smaller angles between them),
    and the factor sharpens it back. DeepSeek's variant divides two such terms,
    (0.1·mscale·ln s + 1) / (0.1·mscale_all_dim·ln s + 1).
    """
    def mscale_of(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if mscale and mscale_all_dim:
        return mscale_of(factor, mscale) / mscale_of(factor, mscale_all_dim)
    return mscale_of(factor)


def llama3_frequencies(theta: torch.Tensor, factor: float, low_freq_factor: float, high_freq_factor: float,
                       original_len: int) -> torch.Tensor:
    """Llama 3.1's piecewise rule, by wavelength λ_i = 2π/θ_i against the trained context L₀:

        λ_i < L₀/high_freq_factor   θ'_i = θ_i              (short waves: many turns in L₀, kept)
        λ_i > L₀/low_freq_factor    θ'_i = θ_i / s          (long waves: interpolated as in PI)
        otherwise                   θ'_i = (1 − a)·θ_i/s + a·θ_i,   a = (L₀/λ_i − low) / (high − low)

    The middle band blends smoothly: a is 1 at the short edge and 0 at the long one.
    Llama 3.1/3.2: s = 8 (32 for 3.2's 1B/3B), low = 1, high = 4, L₀ = 8192.
    """
    wavelength = 2 * math.pi / theta  # [dh/2], tokens per full turn
    low_wavelength, high_wavelength = original_len / low_freq_factor, original_len / high_freq_factor
    smooth = (original_len / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)  # [dh/2]
    blended = (1 - smooth) * theta / factor + smooth * theta
    return torch.where(wavelength < high_wavelength, theta,
                       torch.where(wavelength > low_wavelength, theta / factor, blended))


ROPE_SCALING_KEYS = {  # rope_type: (required keys, optional keys)
    "linear": ({"factor"}, set()),
    "dynamic": ({"factor", "original_max_position_embeddings"}, set()),
    "yarn": ({"factor", "original_max_position_embeddings"},
             {"beta_fast", "beta_slow", "truncate", "attention_factor", "mscale", "mscale_all_dim"}),
    "llama3": ({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}, set()),
}
ROPE_SCALING_TYPES = tuple(ROPE_SCALING_KEYS)


def check_rope_scaling(scaling) -> dict | None:
    """Validate a RoPE scaling dict (Hugging Face's ``rope_parameters`` without ``rope_theta``); a copy."""
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise TypeError(f"rope_scaling must be a dict such as {{'rope_type': 'linear', 'factor': 4.0}} or None, "
                        f"got {type(scaling).__name__}")
    kind = scaling.get("rope_type")
    if kind not in ROPE_SCALING_KEYS:
        raise ValueError(f"rope_scaling['rope_type'] must be one of {list(ROPE_SCALING_TYPES)}, got {kind!r}")
    required, optional = ROPE_SCALING_KEYS[kind]
    missing, unknown = required - set(scaling), set(scaling) - required - optional - {"rope_type"}
    if missing:
        raise ValueError(f"rope_scaling of type {kind!r} needs the keys {sorted(missing)}")
    if unknown:
        hint = " (the base is rope_base)" if "rope_theta" in unknown else ""
        raise ValueError(f"rope_scaling of type {kind!r} does not take {sorted(unknown)}{hint}")
    positive_number("rope_scaling['factor']", scaling["factor"])
    if "original_max_position_embeddings" in scaling:
        positive_int("rope_scaling['original_max_position_embeddings']", scaling["original_max_position_embeddings"])
    if kind == "llama3":
        for key in ("low_freq_factor", "high_freq_factor"):
            non_negative_number(f"rope_scaling[{key!r}]", scaling[key])
        if not scaling["high_freq_factor"] > scaling["low_freq_factor"] > 0:
            raise ValueError("rope_scaling needs high_freq_factor > low_freq_factor > 0, got "
                             f"{scaling['high_freq_factor']} and {scaling['low_freq_factor']}")
    for key in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim"):  # YaRN's: 0 or None means the default
        if scaling.get(key) is not None:
            non_negative_number(f"rope_scaling[{key!r}]", scaling[key])
    if scaling.get("attention_factor") is not None:  # None: computed from factor (and mscale)
        positive_number("rope_scaling['attention_factor']", scaling["attention_factor"])
    if not isinstance(scaling.get("truncate", True), bool):
        raise TypeError(f"rope_scaling['truncate'] must be True or False, got {scaling['truncate']!r}")
    return dict(scaling)


def scaled_frequencies(dh: int, base: float, scaling: dict | None, seq_len: int | None = None
                       ) -> tuple[torch.Tensor, float]:
    """(θ', attention factor) for a RoPE scaling dict; plain RoPE and 1.0 when ``scaling`` is None.

    ``seq_len`` (the length being processed) matters only for "dynamic"."""
    scaling = check_rope_scaling(scaling)
    theta = rope_frequencies(dh, base)  # [dh/2]
    if scaling is None:
        return theta, 1.0
    kind, s = scaling["rope_type"], scaling["factor"]
    if kind == "linear":
        return linear_frequencies(theta, s), 1.0
    original = scaling["original_max_position_embeddings"]  # L₀: the other rules all need it (checked above)
    if kind == "dynamic":
        return dynamic_ntk_frequencies(dh, base, s, seq_len or original, original), 1.0
    if kind == "llama3":
        return llama3_frequencies(theta, s, scaling["low_freq_factor"], scaling["high_freq_factor"], original), 1.0
    theta = yarn_frequencies(dh, base, s, original, scaling.get("beta_fast") or 32.0,
                             scaling.get("beta_slow") or 1.0, scaling.get("truncate", True))
    factor = scaling.get("attention_factor")
    if factor is None:
        factor = yarn_attention_factor(s, scaling.get("mscale"), scaling.get("mscale_all_dim"))
    return theta, float(factor)


def rope_cache(T: int, dh: int, base: float = 10000.0, device=None, *,
               scaling: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the angles m·θ_i for positions m = 0 .. T-1. Each of shape [T, dh/2].

    With ``scaling`` (a RoPE scaling dict) the frequencies are the scaled θ'_i, and both tables are
    multiplied by the attention factor (YaRN's temperature; 1 for the other types), which scales q
    and k alike. For "dynamic", T is taken as the length being processed.
    """
    positive_int("T", T)
    theta, attention_factor = scaled_frequencies(dh, base, scaling, seq_len=T)
    angles = torch.outer(torch.arange(T, dtype=torch.float32, device=device), theta.to(device))  # [T, dh/2]
    if attention_factor == 1.0:
        return angles.cos(), angles.sin()
    return angles.cos() * attention_factor, angles.sin() * attention_factor


class RotaryEmbedding(nn.Module):
    """RoPE's tables for a model: ``rope(positions)`` returns (cos, sin) of those positions, for every block.

    ``dim`` is the rotated size of a head (d_h, or MLA's d_R), ``max_len`` the longest sequence; ``scaling`` a
    RoPE scaling dict (see the module's docstring). Plain RoPE and the static scalings (linear, YaRN, Llama 3)
    compute the table of positions 0 .. max_len - 1 once (the buffers ``cos`` and ``sin``). Dynamic NTK's
    frequencies depend on the length processed so far (the largest position + 1, Hugging Face's rule), so it
    keeps no table and computes the angles of the asked positions on every call, from tensors only: no number
    leaves the device, and a compiled decoding step can run it.
    """

    cos: torch.Tensor  # the table's buffers, [max_len, dim/2] each (None with dynamic NTK, which never reads them)
    sin: torch.Tensor

    def __init__(self, dim: int, max_len: int, base: float = 10000.0, scaling: dict | None = None):
        super().__init__()
        positive_int("dim", dim)
        even("dim", dim, "for RoPE (dimensions are rotated in pairs)")
        positive_int("max_len", max_len)
        self.dim, self.base, self.scaling = dim, base, check_rope_scaling(scaling)
        self.dynamic = self.scaling is not None and self.scaling["rope_type"] == "dynamic"
        cos, sin = (None, None) if self.dynamic else rope_cache(max_len, dim, base, scaling=self.scaling)
        self.register_buffer("cos", cos, persistent=False)  # [max_len, dim/2]: computed, not learned, not saved
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [T] or [B, T] integers -> cos, sin: [T, dim/2] or [B, T, dim/2] each."""
        scaling = self.scaling
        if scaling is None or not self.dynamic:
            return self.cos[positions], self.sin[positions]  # rows of the table
        s, original = scaling["factor"], scaling["original_max_position_embeddings"]
        theta = dynamic_ntk_frequencies(self.dim, self.base, s, positions.max() + 1, original)  # [dim/2]
        angles = positions.float().unsqueeze(-1) * theta  # [..., dim/2]
        return angles.cos(), angles.sin()

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base:g}, scaling={self.scaling}"


def _broadcast_tables(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Check the tables against x and shape them to broadcast over heads; cast to x's dtype."""
    dh = x.shape[-1]
    even("the head dimension x.shape[-1]", dh, "for RoPE")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {list(cos.shape)} and {list(sin.shape)}")
    if cos.shape[-1] != dh // 2:
        raise ValueError(f"cos/sin last dim must be head_dim/2 = {dh // 2}, got {cos.shape[-1]}")
    if cos.dim() == 3 and x.dim() == 4:  # per-sequence tables [B, T, dh/2] -> [B, 1, T, dh/2]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    if cos.dtype != x.dtype:  # bf16/fp16 activations: rotate in their dtype, as Hugging Face does
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return cos, sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x in the half-split layout: pair (i, i + dh/2).

    x: [B, heads, T, dh]; cos, sin: [T, dh/2] (same positions for every sequence) or [B, T, dh/2].
    """
    cos, sin = _broadcast_tables(x, cos, sin)
    x1, x2 = x.chunk(2, dim=-1)  # [B, heads, T, dh/2] each
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # [B, heads, T, dh]


def apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x in the interleaved layout: pair (2i, 2i + 1). Same shapes as ``apply_rope``."""
    cos, sin = _broadcast_tables(x, cos, sin)
    x_even, x_odd = x[..., 0::2], x[..., 1::2]  # [B, heads, T, dh/2] each
    rotated = torch.stack([x_even * cos - x_odd * sin, x_even * sin + x_odd * cos], dim=-1)  # [..., dh/2, 2]
    return rotated.flatten(-2)  # [B, heads, T, dh]


def interleaved_to_half_split(dh: int) -> torch.Tensor:
    """Index permutation p with x_half = x_interleaved[..., p]: evens first, then odds. Shape [dh]."""
    positive_int("dh", dh)
    even("dh", dh, "for RoPE")
    return torch.cat([torch.arange(0, dh, 2), torch.arange(1, dh, 2)])


def permute_qk_weight(weight: torch.Tensor, n_heads: int, to: str = "half_split") -> torch.Tensor:
    """Reorder the output rows of a q or k projection (or its bias) between the RoPE layouts.

    weight: [n_heads * dh, d_in] (or [n_heads * dh] for a bias), laid out head after head.
    ``to="half_split"`` converts interleaved-trained weights for ``apply_rope``;
    ``to="interleaved"`` goes the other way. The attention scores are unchanged by the conversion.
    """
    positive_int("n_heads", n_heads)
    if to not in ("half_split", "interleaved"):
        raise ValueError(f"to must be 'half_split' or 'interleaved', got {to!r}")
    rows = weight.shape[0]
    if rows % n_heads:
        raise ValueError(f"weight.shape[0] ({rows}) must be divisible by n_heads ({n_heads})")
    dh = rows // n_heads
    perm = interleaved_to_half_split(dh).to(weight.device)
    if to == "interleaved":
        perm = torch.argsort(perm)
    per_head = weight.reshape(n_heads, dh, *weight.shape[1:])  # [n_heads, dh, ...]
    return per_head[:, perm].reshape(weight.shape)
