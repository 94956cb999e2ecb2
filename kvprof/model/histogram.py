"""Log2 histograms, as the BPF programs count them and the profile stores them.

Slot i counts values in [2^i, 2^(i+1)); slot 0 also counts 0 (kvcached's
`stats timings` convention). Lock waits and request latencies are in ns,
cache-line updates in TSC cycles. This is the one place that reads a
percentile or a sum out of such a histogram: the collectors, the deltas of
the live views and the analysis tables all use it.
"""

from __future__ import annotations

import math


def log2_slot(value: int) -> int:
    """The slot of `value`: i for [2^i, 2^(i+1)), 0 also for 0."""
    return max(value.bit_length() - 1, 0)


def slot_bounds(i: int) -> tuple[int, int]:
    """[low, high) of slot i."""
    return (0 if i == 0 else 1 << i), 1 << (i + 1)


def hist_percentile(hist: list[int], q: float) -> int:
    """The q-quantile (0..1) of a log2 histogram as the largest value its slot
    holds (2^(i+1) - 1): a bound the true quantile does not exceed. A log2 slot
    spans a factor of two, so a value inside it would claim a precision the
    histogram does not have. 0 for an empty histogram."""
    total = sum(hist)
    if total == 0:
        return 0
    rank, seen = max(1, round(q * total)), 0
    for i, n in enumerate(hist):
        seen += n
        if seen >= rank:
            return slot_bounds(i)[1] - 1
    return 0


def hist_sum_estimate(hist: list[int]) -> float:
    """The sum of the values counted, each slot at its geometric middle (within a factor of 1.42)."""
    return sum(n * (math.sqrt(2.0) * (1 << i) if i else 1.0) for i, n in enumerate(hist) if n)


def hist_add(a: list[int], b: list[int]) -> list[int]:
    """Two histograms counted together."""
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


def hist_minus(new: list[int], old: list[int]) -> list[int]:
    """What `new` counted after `old`: slot by slot (a histogram, a row of counts), both cumulative."""
    return [n - (old[i] if i < len(old) else 0) for i, n in enumerate(new)]
