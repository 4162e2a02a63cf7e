"""Lesson 09b: RoPE scaling for a longer context (Llama 3's rule, the NTK-aware base)."""

from __future__ import annotations

import math
from functools import partial

import torch

from ...rope import rope_frequencies
from .core import Case, CheckRun, Mistake, exercise_check


def _llama3_64(dh, base, s, low, high, L0, *, mistake=None, exponent="2i/dh"):
    """Llama 3's rule in float64 from the plain frequencies of ``dh`` and ``base``, with one knob per mistake."""
    if exponent == "i/dh":
        theta = base ** (-torch.arange(dh // 2, dtype=torch.float64) / dh)
    else:
        theta = rope_frequencies(dh, base).double()
    wavelength = (1 / theta) if mistake == "no_2pi" else 2 * math.pi / theta
    if mistake == "frequency_as_wavelength":  # thresholds compared with θ itself
        wavelength = theta
    short_edge, long_edge = L0 / high, L0 / low
    if mistake == "bands_swapped":
        short_edge, long_edge = long_edge, short_edge
    turns = wavelength / L0 if mistake == "turns_inverted" else L0 / wavelength
    a = (turns - low) / (high - low)
    slow = theta * s if mistake == "multiplied" else theta / s
    blended = {"blend_reversed": a * slow + (1 - a) * theta, "middle_kept": theta,
               "middle_divided": slow}.get(mistake, (1 - a) * slow + a * theta)
    if mistake == "scale_all":
        return theta / s
    return torch.where(wavelength < short_edge, theta, torch.where(wavelength > long_edge, slow, blended))


LLAMA3_MISTAKES = [
    Mistake("every frequency was divided by the factor: that is position interpolation. Llama 3 keeps the short "
            "waves (wavelength < original_len / high_freq_factor) as they are and divides only the long ones "
            "(wavelength > original_len / low_freq_factor).", dict(mistake="scale_all")),
    Mistake("the middle band was left unscaled, as when the two thresholds are swapped (the wrong smoothing band): "
            "short waves are those with wavelength < original_len / high_freq_factor, long waves those with "
            "wavelength > original_len / low_freq_factor; the band in between is blended.",
            dict(mistake="bands_swapped")),
    Mistake("the frequencies came back unscaled: apply Llama 3's rule to θ_i = base^(-2i/dh). (Comparing θ itself "
            "with the wavelength thresholds, wavelength vs frequency, gives this too: every θ ≤ 1 then counts as a "
            "short wave. Convert first: wavelength = 2π / θ, in tokens per full turn.)",
            dict(mistake="frequency_as_wavelength")),
    Mistake("the wavelength was taken as 1/θ: a full turn is 2π radians, so the wavelength is 2π / θ tokens.",
            dict(mistake="no_2pi")),
    Mistake("the blend weight uses wavelength / original_len; it uses the number of turns in the original context, "
            "original_len / wavelength: a = (original_len / wavelength - low) / (high - low).",
            dict(mistake="turns_inverted")),
    Mistake("the blend is reversed: a = (original_len / wavelength - low) / (high - low) weights the unscaled θ "
            "(a = 1 at the short edge), and 1 - a weights θ / factor.", dict(mistake="blend_reversed")),
    Mistake("the middle band was divided like the long waves: between the two thresholds θ is blended, "
            "(1 - a)·θ/factor + a·θ.", dict(mistake="middle_divided")),
    Mistake("the long waves' frequencies were multiplied by the factor; divide them (a slower rotation stretches the "
            "wavelength so the longer context fits).", dict(mistake="multiplied")),
    Mistake("the exponent of the frequencies is i/dh: θ_i = base^(-2i/dh) for pair i = 0 .. dh/2-1.",
            dict(exponent="i/dh")),
]


def _llama3_case(what: str, dh: int, base: float, s: float, low: float, high: float, L0: int) -> Case:
    text = (f"llama3_frequencies({dh}, {base:g}, factor={s:g}, low_freq_factor={low:g}, high_freq_factor={high:g}, "
            f"original_len={L0}) ({what})")
    return Case(text, partial(_llama3_64, dh, base, s, low, high, L0), (dh, base, s, low, high, L0))


_LLAMA3_CASES = [  # (what, d_h, base, factor, low_freq_factor, high_freq_factor, original_len)
    ("Llama 3.1 8B", 128, 500000.0, 8.0, 1.0, 4.0, 8192),
    ("Llama 3.2 1B", 64, 500000.0, 32.0, 1.0, 4.0, 8192),
    ("a small head with all three bands", 32, 10000.0, 4.0, 2.0, 8.0, 256),
]


@exercise_check
def check_llama3_rope_scaling(run: CheckRun, llama3_frequencies_fn) -> str:
    """``llama3_frequencies(dh, base, factor, low_freq_factor, high_freq_factor, original_len)`` → a model's RoPE
    frequencies θ_i = base^(-2i/dh), float32 [dh/2], scaled by Llama 3.1's piecewise rule by wavelength."""

    def secret(g):  # a drawn context length, factor and band
        low, high = run.pick(g, [(1.0, 4.0), (1.0, 2.0), (2.0, 8.0)])
        return [_llama3_case("a drawn configuration", 64, run.pick(g, [10000.0, 500000.0]),
                             run.pick(g, [4.0, 8.0, 16.0]), low, high, run.pick(g, [2048, 4096, 16384]))]

    for case in run.cases([_llama3_case(*c) for c in _LLAMA3_CASES], secret, seed=9):
        got = run.call(case.text, llama3_frequencies_fn, *case.args)
        run.judge(case, got, LLAMA3_MISTAKES, rtol=1e-5, atol=0, dims=("pair",),
                  hint="compare with the rule: wavelength = 2π/θ; θ kept below original_len/high_freq_factor, divided "
                       "by the factor above original_len/low_freq_factor, blended in between.")
        run.require(getattr(got, "dtype", None) == torch.float32, case.text,
                    "the values are right but the output is not float32: return float32 frequencies.")
    return "3 configurations incl. Llama 3.1 8B and Llama 3.2 1B, every band populated"


def _ntk(base, dh, kappa, *, exponent="dh/(dh-2)", divide=False) -> float:
    e = {"dh/(dh-2)": dh / (dh - 2), "none": 1.0, "(dh-2)/dh": (dh - 2) / dh, "dh/2": dh / 2}[exponent]
    return base / kappa ** e if divide else base * kappa ** e


NTK_MISTAKES = [
    Mistake("the exponent d_h/(d_h - 2) is missing: with base·kappa the slowest pair is divided by only "
            "kappa^((d_h - 2)/d_h).", dict(exponent="none")),
    Mistake("the exponent is upside down: it is d_h/(d_h - 2), slightly above 1.", dict(exponent="(dh-2)/dh")),
    Mistake("the base must grow to slow the rotations down: multiply by kappa^(d_h/(d_h - 2)), do not divide.",
            dict(divide=True)),
    Mistake("kappa was raised to d_h/2: the exponent is d_h/(d_h - 2).", dict(exponent="dh/2")),
]


@exercise_check
def check_ntk_scaled_base(run: CheckRun, ntk_scaled_base_fn) -> str:
    """``ntk_scaled_base(base, dh, kappa)`` → b' = base · kappa^(dh/(dh-2)) as a float, the NTK-aware base that keeps
    the fastest pair and divides the slowest one's frequency by exactly kappa."""

    def case(base, dh, kappa):
        return Case(f"ntk_scaled_base({base:g}, {dh}, {kappa:g})", partial(_ntk, base, dh, kappa), (base, dh, kappa))

    def secret(g):
        return [case(run.pick(g, [10000.0, 100000.0, 1000000.0]), run.pick(g, [32, 64, 96]),
                     run.pick(g, [1.5, 3.0, 16.0]))]

    public = [case(10000.0, 128, 4.0), case(500000.0, 64, 2.0), case(10000.0, 16, 8.0)]
    run.judge_each(ntk_scaled_base_fn, run.cases(public, secret, seed=10), run.judge_number, NTK_MISTAKES, rel=1e-6,
                   kind=float, hint="the slowest pair's frequency is b^(-(d_h-2)/d_h); solve for the base that "
                                    "divides it by kappa.")
    return "3 cases: Llama 2-style, Llama 3-style and a 16-dimensional head"
