"""Statistics for benchmark results: medians, CVs, t-tests and the verdict.

Pure functions over plain numbers, so every rule is unit-tested exactly.

The verdict of an interleaved bench is judged on the per-round ratios (round
i's new / reference), not on each variant's CV of ops/s: on a VM whose host
moves the vCPUs between cores that share a cache and cores that do not, a
whole round speeds up or slows down together, which the CV of ops/s counts as
noise and the ratio divides out (docs/bench-results.md has the runs that show it).

Throughput samples are ops/s (higher is better). The t-test is pyperf's: a
two-sample, two-tailed Student's t-test at 95 % on the values pyperf stores,
which here are seconds per operation (1 / ops/s), so that `kvprof bench` and
`python -m pyperf compare_to` agree on what is significant.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

UNSTABLE_CV = 0.10  # a comparison whose spread (CV) is above this cannot be judged
MIN_WATERLINE = 0.03  # changes smaller than this are noise even on a quiet machine

IMPROVEMENT = "IMPROVEMENT"
REGRESSION = "REGRESSION"
UNSTABLE = "UNSTABLE"
NO_CHANGE = "no change"

# Two-tailed 95 % critical values of Student's t by degrees of freedom, the
# table pyperf uses (df 0 unused); beyond it pyperf's steps down to 1.960.
_T95 = (
    0.0, 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262,
    2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093,
    2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045,
    2.042,
)  # fmt: skip
_T95_LARGE = ((200, 1.960), (100, 1.984), (80, 1.990), (60, 2.000), (50, 2.009), (40, 2.021))


def median(samples: Sequence[float]) -> float:
    """The median; raises ValueError on no samples."""
    if not samples:
        raise ValueError("no samples")
    return float(statistics.median(samples))


def cv(samples: Sequence[float]) -> float:
    """Coefficient of variation: sample standard deviation / mean (0.0 below 2 samples)."""
    if len(samples) < 2:
        return 0.0
    mean = statistics.fmean(samples)
    if mean == 0:
        return math.inf
    return statistics.stdev(samples) / abs(mean)


def t_critical_95(df: int) -> float:
    """Two-tailed 95 % critical value of Student's t for `df` degrees of freedom."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    for at_least, value in _T95_LARGE:
        if df >= at_least:
            return value
    return _T95[min(df, len(_T95) - 1)]


@dataclass(frozen=True)
class TTest:
    """Student's two-sample t-test with pooled variance."""

    t: float
    df: int
    critical: float

    @property
    def significant(self) -> bool:
        return abs(self.t) >= self.critical


def t_test(a: Sequence[float], b: Sequence[float]) -> TTest | None:
    """pyperf's significance test of a against b; None when either has < 2 samples.

    With equal sample sizes this is exactly pyperf's `is_significant`; unequal
    sizes use the general pooled-variance form. Two samples without any spread
    are significantly different exactly when their means differ.
    """
    n1, n2 = len(a), len(b)
    if n1 < 2 or n2 < 2:
        return None
    df = n1 + n2 - 2
    m1, m2 = statistics.fmean(a), statistics.fmean(b)
    squares = math.fsum((x - m1) ** 2 for x in a) + math.fsum((x - m2) ** 2 for x in b)
    error = math.sqrt(squares / df * (1 / n1 + 1 / n2))
    if error > 0:
        return TTest((m1 - m2) / error, df, t_critical_95(df))
    # no spread at all: different exactly when the means differ
    return TTest(0.0 if m1 == m2 else math.copysign(math.inf, m1 - m2), df, t_critical_95(df))


def paired_ratios(base: Sequence[float], new: Sequence[float]) -> list[float]:
    """new / base run by run: with interleaved runs, run i of each variant shared
    the machine's state of round i, so these ratios do not carry the drift between
    rounds that the CVs do. Empty when the run counts differ."""
    if len(base) != len(new):
        return []
    return [n / b for b, n in zip(base, new, strict=True) if b > 0]


def paired_t_test(ratios: Sequence[float]) -> TTest | None:
    """Paired t-test of the rounds: one-sample t-test of log(ratio) against 0
    (no change); None below 2 rounds. Logs make 2x and 0.5x equally far from 1."""
    if len(ratios) < 2 or any(r <= 0 for r in ratios):
        return None
    logs = [math.log(r) for r in ratios]
    df = len(logs) - 1
    mean = statistics.fmean(logs)
    error = statistics.stdev(logs) / math.sqrt(len(logs))
    if error > 0:
        return TTest(mean / error, df, t_critical_95(df))
    return TTest(0.0 if mean == 0 else math.copysign(math.inf, mean), df, t_critical_95(df))


def waterline(spread: float) -> float:
    """The smallest change that counts: max(3 %, the spread's CV)."""
    return max(MIN_WATERLINE, spread)


def verdict(change: float, spread: float, significant: bool | None) -> str:
    """The rule, for every comparison kvprof makes: UNSTABLE when the spread
    (a CV) is above 10 %; IMPROVEMENT / REGRESSION when the change is beyond
    max(3 %, the spread) and the test is significant at 95 %; else no change.

    For interleaved rounds the change is the median per-round ratio - 1, the
    spread the CV of the per-round ratios and the test the paired t-test on
    their logs (`compare`); for two separate result files the change is the
    ratio of the medians - 1, the spread the larger CV of ops/s and the test
    the two-sample one (`compare_unpaired`)."""
    if spread > UNSTABLE_CV:
        return UNSTABLE
    line = waterline(spread)
    if significant and change > line:
        return IMPROVEMENT
    if significant and change < -line:
        return REGRESSION
    return NO_CHANGE


@dataclass(frozen=True)
class Comparison:
    """A new variant against its reference, both as ops/s samples."""

    base_median: float
    new_median: float
    base_cv: float  # CV of ops/s, for information
    new_cv: float
    ratio: float  # what the verdict judges: the median per-round ratio (paired) or of the medians
    spread: float  # the CV the verdict judges: of the per-round ratios (paired) or the larger of ops/s
    paired: bool
    significant: bool | None  # None: too few runs to test
    verdict: str

    @property
    def change(self) -> float:
        return self.ratio - 1

    @property
    def waterline(self) -> float:
        return waterline(self.spread)


def compare(base_ops: Sequence[float], new_ops: Sequence[float]) -> Comparison:
    """Compare two variants' ops/s samples run by run (interleaved rounds:
    run i of each was measured in round i); unpaired when the counts differ."""
    ratios = paired_ratios(base_ops, new_ops)
    if len(ratios) < 2 or len(ratios) != len(base_ops):
        return compare_unpaired(base_ops, new_ops)
    return _judged(base_ops, new_ops, median(ratios), cv(ratios), paired_t_test(ratios), paired=True)


def compare_unpaired(base_ops: Sequence[float], new_ops: Sequence[float]) -> Comparison:
    """Two sets of runs not measured side by side (two result files): medians,
    the larger CV of ops/s, pyperf's two-sample t-test on seconds per op."""
    base_median, new_median = median(base_ops), median(new_ops)
    ratio = new_median / base_median if base_median else math.inf
    test = t_test([1 / x for x in base_ops], [1 / x for x in new_ops])
    return _judged(base_ops, new_ops, ratio, max(cv(base_ops), cv(new_ops)), test, paired=False)


def _judged(
    base_ops: Sequence[float],
    new_ops: Sequence[float],
    ratio: float,
    spread: float,
    test: TTest | None,
    paired: bool,
) -> Comparison:
    """The Comparison of a ratio and its spread, with the verdict on them."""
    significant = None if test is None else test.significant
    return Comparison(
        base_median=median(base_ops),
        new_median=median(new_ops),
        base_cv=cv(base_ops),
        new_cv=cv(new_ops),
        ratio=ratio,
        spread=spread,
        paired=paired,
        significant=significant,
        verdict=verdict(ratio - 1, spread, significant),
    )
