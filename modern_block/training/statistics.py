"""How the course decides between two models: the paired t interval d̄ ± t_{(1+c)/2, n-1} · s_d / sqrt(n) of
their loss differences d_i = b_i - a_i over seeds (one seed, the same batches: less noise than two means), its
verdict, and the rate rule (chosen on some seeds, reported on others, where the choice flatters it less)."""

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95
LOWER, HIGHER, INCONCLUSIVE = "lower", "higher", "inconclusive at this scale"
HOLM_INCONCLUSIVE = "inconclusive after Holm's adjustment"
MAX_DF = 10_000  # the exact CDF sums df/2 terms (fast up to here); far more than any count of seeds


def _check_df(df) -> int:
    if isinstance(df, bool) or not isinstance(df, int) or not 1 <= df <= MAX_DF:
        raise ValueError(f"df must be an int in [1, {MAX_DF:,}], got {df!r}")
    return df


def _central_probability(t: float, df: int) -> float:
    """P(|T| <= t) for t >= 0: the finite series of Abramowitz & Stegun 26.7.3-4 in theta = atan(t / sqrt(df))."""
    theta = math.atan(t / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    c2 = c * c
    if df % 2 == 0:  # sin θ · (1 + 1/2 cos²θ + (1·3)/(2·4) cos⁴θ + ...), df/2 terms
        term = total = 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        return s * total
    if df == 1:
        return 2 * theta / math.pi
    term = total = c  # (2/π)(θ + sin θ · (cos θ + 2/3 cos³θ + (2·4)/(3·5) cos⁵θ + ...)), (df-1)/2 terms
    for k in range(1, (df - 1) // 2):
        term *= c2 * (2 * k) / (2 * k + 1)
        total += term
    return 2 / math.pi * (theta + s * total)


def t_quantile(p: float, df: int) -> float:
    """The t with P(T <= t) = p: bisection on the exact CDF to about 1e-12. ``t_quantile(0.975, n - 1)``
    is the multiplier of a two-sided 95% interval from n values (12.706 for n = 2, 2.571 for n = 6)."""
    _check_df(df)
    if not (isinstance(p, (int, float)) and 0 < p < 1):
        raise ValueError(f"p must be a probability strictly between 0 and 1, got {p!r}")
    if p == 0.5:
        return 0.0
    target = abs(2 * p - 1)  # P(|T| <= t) at the quantile
    low, high = 0.0, 1.0
    while _central_probability(high, df) < target:
        low, high = high, 2 * high
    for _ in range(200):
        mid = 0.5 * (low + high)
        if mid in (low, high):
            break
        low, high = (mid, high) if _central_probability(mid, df) < target else (low, mid)
        if high - low <= 1e-13 * high:
            break
    t = 0.5 * (low + high)
    return t if p > 0.5 else -t


def _finite_values(name: str, values) -> list[float]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a sequence of numbers, got {type(values).__name__}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{name} must hold numbers, got {v!r}")
        out.append(float(v))
    return out


@dataclass(frozen=True)
class Interval:
    """A mean over n values with its two-sided t interval: mean ± t_{(1+c)/2, n-1} · sd / sqrt(n)."""

    mean: float
    sd: float  # sample standard deviation (n - 1 in the denominator)
    n: int

    @property
    def df(self) -> int:
        return self.n - 1

    @property
    def se(self) -> float:
        return self.sd / math.sqrt(self.n)

    @property
    def t(self) -> float:
        """The multiplier t_{(1+c)/2, n-1} of a two-sided interval at the course's confidence c."""
        return t_quantile(0.5 + CONFIDENCE / 2, self.df)

    @property
    def half_width(self) -> float:
        return self.t * self.se if math.isfinite(self.mean) else math.nan

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    @property
    def next_value_range(self) -> tuple[float, float]:
        """Where one more value from the same spread falls, at the same confidence: mean ± t · sd · sqrt(1 + 1/n)
        (a prediction interval). Wider than the mean's interval: it is about one run, not about the mean."""
        half = self.t * self.sd * math.sqrt(1 + 1 / self.n)
        return self.mean - half, self.mean + half

    def format(self, digits: int = 4) -> str:
        """"2.4809 ± 0.0521" (the half-width of the interval, not the standard deviation)."""
        if not math.isfinite(self.mean):
            return "diverged"
        return f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f}"

    def __str__(self) -> str:
        return f"{self.format()} ({CONFIDENCE:.0%} interval, {self.n} seeds)"


def mean_interval(values) -> Interval:
    """The mean of ``values`` (at least 2) with its t interval; a non-finite value (a diverged run) makes it inf."""
    xs = _finite_values("values", values)
    if len(xs) < 2:
        raise ValueError(f"values must hold at least 2 numbers for an interval, got {len(xs)}")
    if not all(math.isfinite(x) for x in xs):
        return Interval(math.inf, math.nan, len(xs))
    mean = math.fsum(xs) / len(xs)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    return Interval(mean, sd, len(xs))


def verdict(low: float, high: float, digits: int = 4) -> str:
    """What an interval for b - a (a loss difference) supports: "lower" when it lies wholly below 0, "higher"
    when wholly above; otherwise "inconclusive at this scale (the interval holds 0; it could hide an effect of
    up to ±h)", h the farther end: an interval that holds zero is not evidence of equality."""
    if math.isnan(low) or math.isnan(high) or low > high:
        raise ValueError(f"low and high must be numbers with low <= high, got {low}, {high}")
    if high < 0:
        return LOWER
    if low > 0:
        return HIGHER
    return (f"{INCONCLUSIVE} (the interval holds 0; it could hide an effect of up to "
            f"±{max(-low, high):.{digits}f})")


@dataclass(frozen=True)
class PairedDifference:
    """b minus a, seed by seed: ``differences[i]`` = b's loss - a's loss on ``seeds[i]``."""

    seeds: tuple
    differences: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.differences)

    @property
    def diverged(self) -> bool:
        return not all(math.isfinite(d) for d in self.differences)

    @property
    def interval(self) -> Interval:
        return mean_interval(self.differences)

    @property
    def mean(self) -> float:
        return self.interval.mean

    @property
    def low(self) -> float:
        return self.interval.low

    @property
    def high(self) -> float:
        return self.interval.high

    @property
    def verdict(self) -> str:
        return "a run diverged" if self.diverged else verdict(self.low, self.high)

    @property
    def decided(self) -> bool:
        """The interval lies wholly on one side of zero."""
        return self.verdict in (LOWER, HIGHER)

    def format(self, digits: int = 4) -> str:
        """"-0.1360 ± 0.0070 [-0.1430, -0.1290]": the mean difference, the half-width and the interval."""
        if self.diverged:
            return "a run diverged"
        return (f"{self.mean:+.{digits}f} ± {self.interval.half_width:.{digits}f} "
                f"[{self.low:+.{digits}f}, {self.high:+.{digits}f}]")

    def __str__(self) -> str:
        if self.diverged:
            return f"a run diverged ({self.n} paired seeds)"
        return f"{self.format()} ({CONFIDENCE:.0%} interval, {self.n} paired seeds): {self.verdict}"


def paired_difference(a, b) -> PairedDifference:
    """b minus a over at least 2 paired seeds: mappings seed -> loss with the same seeds, or sequences of one
    length (paired by position); a loss of None is a diverged run."""
    if isinstance(a, Mapping) != isinstance(b, Mapping):
        raise TypeError("a and b must both be mappings seed -> loss, or both sequences")
    if isinstance(a, Mapping):
        if set(a) != set(b):
            raise ValueError(f"a and b must hold the same seeds to be paired, got {sorted(a)} and {sorted(b)}")
        seeds = tuple(sorted(a))
        xs, ys = [a[s] for s in seeds], [b[s] for s in seeds]
    else:
        xs, ys = list(a), list(b)
        if len(xs) != len(ys):
            raise ValueError(f"a and b must have the same length to be paired, got {len(xs)} and {len(ys)}")
        seeds = tuple(range(len(xs)))
    xs = _finite_values("a", [math.inf if v is None else v for v in xs])
    ys = _finite_values("b", [math.inf if v is None else v for v in ys])
    if len(xs) < 2:
        raise ValueError(f"a paired interval needs at least 2 seeds, got {len(xs)}")
    diffs = tuple(y - x if math.isfinite(x) and math.isfinite(y) else math.nan for x, y in zip(xs, ys, strict=True))
    return PairedDifference(seeds, diffs)


def p_value(d: PairedDifference) -> float:
    """The two-sided p-value of a paired difference: P(|T| >= |mean| / se) for Student's t with n - 1 degrees of
    freedom, the test whose 95% interval ``d`` reports (p < 0.05 exactly when the interval excludes 0)."""
    if d.diverged:
        raise ValueError("d must hold finite differences (a run diverged)")
    i = d.interval
    if i.sd == 0:
        return 0.0 if i.mean != 0 else 1.0
    return 1.0 - _central_probability(abs(i.mean) / i.se, i.df)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of m p-values, in their order: sort them ascending, multiply the k-th
    smallest (k from 0) by m - k, carry the running maximum up, cap at 1. Rejecting where the adjusted p is
    below alpha keeps the chance of any false "lower"/"higher" among the m at most alpha."""
    ps = _finite_values("p_values", p_values)
    if not ps or not all(0 <= p <= 1 for p in ps):
        raise ValueError(f"p_values must be a non-empty sequence of probabilities in [0, 1], got {list(ps)}")
    m, adjusted, running = len(ps), [0.0] * len(ps), 0.0
    for k, i in enumerate(sorted(range(m), key=lambda j: ps[j])):
        running = max(running, min(1.0, (m - k) * ps[i]))
        adjusted[i] = running
    return adjusted


def holm_verdicts(diffs: Sequence[PairedDifference], alpha: float = 1 - CONFIDENCE) -> list[str]:
    """The verdict of each difference after Holm's adjustment for all of them together: "lower" or "higher"
    where its adjusted p-value is below ``alpha``, else "inconclusive after Holm's adjustment"."""
    adjusted = holm([p_value(d) for d in diffs])
    return [adjusted_verdict(d, p, alpha) for d, p in zip(diffs, adjusted, strict=True)]


def adjusted_verdict(d: PairedDifference, p_adjusted: float, alpha: float = 1 - CONFIDENCE) -> str:
    """"lower" or "higher" where the adjusted p-value is below ``alpha``, else "inconclusive after Holm's
    adjustment"."""
    return (LOWER if d.mean < 0 else HIGHER) if p_adjusted < alpha else HOLM_INCONCLUSIVE


def band(curves: Sequence[Sequence[float]]) -> tuple[list, list, list]:
    """Per point of equally long curves (one per seed): the mean and the t interval's ends, for a plotted band."""
    curves = [_finite_values("curves[i]", c) for c in curves]
    if len(curves) < 2 or len({len(c) for c in curves}) != 1 or not curves[0]:
        raise ValueError(f"curves must be at least 2 non-empty sequences of one length, got lengths "
                         f"{[len(c) for c in curves]}")
    intervals = [mean_interval(column) for column in zip(*curves, strict=True)]
    return [i.mean for i in intervals], [i.low for i in intervals], [i.high for i in intervals]


@dataclass(frozen=True)
class Selection:
    """One model: the rate chosen on the selection seeds and its losses on the reported seeds."""

    model: str
    lr: float
    selection_seeds: tuple[int, ...]
    selection_losses: dict  # every rate tried -> {selection seed: loss} (inf: the run diverged)
    reported: dict  # reported seed -> loss at the chosen rate

    @property
    def selection_means(self) -> dict[float, float]:
        """Every rate tried -> mean loss over the selection seeds (inf if a run diverged): what chose the rate."""
        return {lr: math.fsum(runs.values()) / len(runs) for lr, runs in sorted(self.selection_losses.items())}

    @property
    def rates(self) -> list[float]:
        return sorted(self.selection_losses)

    @property
    def at_edge(self) -> bool:
        """The chosen rate is the lowest or highest tried: a wider sweep might do better."""
        return len(self.rates) > 1 and self.lr in (self.rates[0], self.rates[-1])

    @property
    def reported_seeds(self) -> tuple[int, ...]:
        return tuple(sorted(self.reported))

    @property
    def interval(self) -> Interval:
        """The reported losses' mean with its t interval."""
        return mean_interval([self.reported[s] for s in self.reported_seeds])


def choose_rate(means_by_rate: Mapping[float, float]) -> float:
    """The rate with the lowest mean loss over the selection seeds; a tie goes to the lower (safer) rate, and a
    non-finite mean (a run diverged) is never chosen unless every mean is, and then the lowest rate is."""
    if not means_by_rate:
        raise ValueError("means_by_rate must hold at least one rate and its mean loss")
    finite = {lr: mean for lr, mean in means_by_rate.items() if math.isfinite(mean)}
    if not finite:
        return min(means_by_rate)
    return min(finite, key=lambda lr: (finite[lr], lr))


def format_seeds(seeds: Sequence[int]) -> str:
    """"0-3" for a run of consecutive seeds, else "0, 2, 5"."""
    seeds = sorted(seeds)
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(str(s) for s in seeds)


def selection_row(sel: Selection, label: str | None = None, digits: int = 4) -> dict[str, str]:
    """One model's row of a results table: chosen rate, selection means, reported mean ± interval, seeds."""
    means = ", ".join(f"{lr:g}: " + (f"{m:.{digits}f}" if math.isfinite(m) else "diverged")
                      for lr, m in sorted(sel.selection_means.items()))
    return {"model": label or sel.model,
            "chosen lr": f"{sel.lr:g}" + (" (edge)" if sel.at_edge else ""),
            f"mean on selection seeds {format_seeds(sel.selection_seeds)}": means,
            f"reported, mean ± {CONFIDENCE:.0%} interval": sel.interval.format(digits),
            "reported seeds": format_seeds(sel.reported_seeds)}


def markdown_table(rows: Sequence[Mapping[str, str]]) -> str:
    """A Markdown table from rows with the same keys (the header)."""
    if not rows or any(list(r) != list(rows[0]) for r in rows):
        raise ValueError("rows must be a non-empty sequence of mappings with the same keys in the same order")
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(r[k]) for k in header) + " |" for r in rows]
    return "\n".join(lines)
