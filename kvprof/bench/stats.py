"""Statistics for benchmark results: medians, CVs, a t-test and the verdict.

Pure functions over plain numbers, so every rule is unit-tested exactly.

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

UNSTABLE_CV = 0.10  # a variant whose CV is above this cannot be judged
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


@dataclass(frozen=True)
class Comparison:
    """A new variant against its reference, both as ops/s samples."""

    base_median: float
    new_median: float
    base_cv: float
    new_cv: float
    significant: bool | None  # None: too few runs to test
    verdict: str

    @property
    def ratio(self) -> float:
        """new / base median throughput: above 1 is faster."""
        return self.new_median / self.base_median if self.base_median else math.inf

    @property
    def change(self) -> float:
        return self.ratio - 1

    @property
    def waterline(self) -> float:
        return waterline(self.base_cv, self.new_cv)


def waterline(base_cv: float, new_cv: float) -> float:
    """The smallest change that counts: max(3 %, the larger CV)."""
    return max(MIN_WATERLINE, base_cv, new_cv)


def verdict(change: float, base_cv: float, new_cv: float) -> str:
    """Redis CE performance-automation style: UNSTABLE when either CV > 10 %,
    IMPROVEMENT / REGRESSION when the change exceeds the waterline, else no change."""
    if base_cv > UNSTABLE_CV or new_cv > UNSTABLE_CV:
        return UNSTABLE
    line = waterline(base_cv, new_cv)
    if change > line:
        return IMPROVEMENT
    if change < -line:
        return REGRESSION
    return NO_CHANGE


def compare(base_ops: Sequence[float], new_ops: Sequence[float]) -> Comparison:
    """Compare two variants' ops/s samples (one per run)."""
    base_median, new_median = median(base_ops), median(new_ops)
    base_cv, new_cv = cv(base_ops), cv(new_ops)
    test = t_test([1 / x for x in base_ops], [1 / x for x in new_ops])
    change = new_median / base_median - 1 if base_median else math.inf
    return Comparison(
        base_median=base_median,
        new_median=new_median,
        base_cv=base_cv,
        new_cv=new_cv,
        significant=None if test is None else test.significant,
        verdict=verdict(change, base_cv, new_cv),
    )
