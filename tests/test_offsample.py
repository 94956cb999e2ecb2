"""The sampled off-CPU collector's lock-wait estimates and their stated error, on numbers
made by hand (no target): a futex row's share of its thread's looks, capped at the
exact total of its stratum; the switch timer's stretches scaled to the time they stand
for and spread over the looks' stacks; and the ±90 % the report states from them."""

from __future__ import annotations

import math

import pytest

from kvprof.analysis.tables import LOOK_BIAS, STRETCH_BIAS, Z90, sampling_error_ns
from kvprof.collect import OFFCPU_TIMED_EVERY_S, OFFCPU_TIMED_S
from kvprof.collect.offsample import Stretches, stratum_share
from kvprof.model.delta import delta
from kvprof.model.profile import FutexWait, OffCpu, Profile, Target

MS = 1_000_000


def test_share_of_the_looks_stands_for_that_share_of_the_time() -> None:
    """A row found by 30 of 300 looks of 10 ms, on a thread watched for 6 s, is 0.6 s,
    with the binomial variance of a share of 0.1 over 300 looks."""
    ns, var = stratum_share(30 * 10 * MS, 30, 30 * 10 * MS, 300 * 10 * MS, 2.0, None)
    assert ns == pytest.approx(600 * MS)
    assert math.sqrt(var) == pytest.approx(6000 * MS * math.sqrt(0.1 * 0.9 / 300))


def test_share_is_capped_at_the_stratum_exact_total() -> None:
    """Looks that found a thread asleep in a futex for 40 % of its time, when schedstat
    says it slept 10 % of it, give the sleep: split over the rows by their looks."""
    looked, scale = 1000 * 10 * MS, 1.0
    one, _ = stratum_share(300 * 10 * MS, 300, 400 * 10 * MS, looked, scale, 1000 * MS)
    other, _ = stratum_share(100 * 10 * MS, 100, 400 * 10 * MS, looked, scale, 1000 * MS)
    assert one + other == pytest.approx(1000 * MS)
    assert one == pytest.approx(3 * other)
    # under its total it is left alone
    ns, _ = stratum_share(50 * 10 * MS, 50, 50 * 10 * MS, looked, scale, 1000 * MS)
    assert ns == pytest.approx(500 * MS)


def test_no_looks_no_estimate() -> None:
    """A stratum no look found gives nothing, not a division by zero."""
    assert stratum_share(0, 0, 0, 0, 1.0, 5 * MS) == (0.0, 0.0)


def _row(tid: int, ns: int, samples: int, sd_ns: int = 0) -> FutexWait:
    return FutexWait(
        tid=tid, uaddr=0x1000, frames=["__lll_lock_wait"], waits=1, ns=ns, samples=samples, sd_ns=sd_ns
    )


def test_stated_error_adds_the_looks_bias_once_for_the_figure() -> None:
    """Rows with a standard deviation: their variances add, and the looks' bias is
    LOOK_BIAS of their sum (one error for the figure, not shrinking with more rows)."""
    rows = [_row(1, 400 * MS, 40, sd_ns=30 * MS), _row(2, 600 * MS, 60, sd_ns=40 * MS)]
    want = Z90 * math.sqrt((30 * MS) ** 2 + (40 * MS) ** 2 + (LOOK_BIAS * 1000 * MS) ** 2)
    assert sampling_error_ns(rows) == round(want)


def test_stated_error_of_rows_without_a_deviation_counts_the_looks() -> None:
    """A profile written before rows carried sd_ns: ns / sqrt(looks), no bias term; a
    timed row (no looks) states no error."""
    assert sampling_error_ns([_row(1, 900 * MS, 9)]) == round(Z90 * 300 * MS)
    assert sampling_error_ns([_row(1, 900 * MS, 0)]) is None


def test_delta_keeps_the_variance_of_what_came_since() -> None:
    """Between two reads of running estimates, the row's deviation is that of the
    difference: the variance added since the earlier read."""
    old = Profile(Target(1), offcpu=OffCpu(futex=[_row(1, 300 * MS, 30, sd_ns=30 * MS)]))
    new = Profile(Target(1), offcpu=OffCpu(futex=[_row(1, 800 * MS, 80, sd_ns=50 * MS)]))
    (row,) = delta(new, old).offcpu.futex
    assert row.ns == 500 * MS and row.samples == 50
    assert row.sd_ns == 40 * MS


def test_stretches_stand_for_the_time_a_lock_wait_was_seen() -> None:
    """Four stretches of 50 ms, each standing for 500 ms, timed 10, 20, 10 and 20 ms of
    one pair's waits: 100, 200, 100 and 200 ms, 600 ms in all. Its variance is four
    times the sample variance of those four, less the share of the time they covered."""
    st = Stretches()
    for ns in (10, 20, 10, 20):
        st.add(50 * MS, 500 * MS, {(7, 0x1000): (2, ns * MS)})
    waits, ns, var = st.estimate((7, 0x1000))
    assert ns == pytest.approx(600 * MS) and waits == pytest.approx(8 * 10)
    one = 4 * (50 * MS) ** 2 / 3  # each 50 ms off their mean of 150 ms: their sample variance
    assert var == pytest.approx(4 * one * (1 - 200 / 2000))


def test_each_stretch_adds_its_own_part() -> None:
    """A pair timed in one stretch of two counts 0 for the other; a stretch stands for no
    less than its own length; two reads differ by the stretches between them."""
    st = Stretches()
    st.add(50 * MS, 500 * MS, {(1, 0x10): (1, 10 * MS), (2, 0x10): (1, 10 * MS)})
    before = st.copy()
    st.add(50 * MS, 1500 * MS, {(1, 0x10): (1, 10 * MS)})
    st.add(50 * MS, 0, {(1, 0x10): (1, 10 * MS)})
    assert st.estimate((2, 0x10))[1] == pytest.approx(100 * MS)
    assert st.estimate((1, 0x10))[1] - before.estimate((1, 0x10))[1] == pytest.approx(310 * MS)


def test_timed_rows_spread_over_the_looks_stacks() -> None:
    """A timed pair's figure splits over the stacks its looks found, in their
    proportion, each with its share of the variance; a pair no look found keeps no
    frames (no stack says what it waits in: it is no lock wait)."""
    st = Stretches()
    for ns in (10, 30):
        st.add(50 * MS, 500 * MS, {(1, 0x10): (1, ns * MS), (2, 0x20): (1, 5 * MS)})
    lock, cond = ("__lll_lock_wait", "a"), ("__lll_lock_wait", "b")
    rows = st.rows({(1, 0x10): {lock: 300, cond: 100}}, {(1, 0x10, lock): 30, (1, 0x10, cond): 10})
    total, var = st.estimate((1, 0x10))[1:]
    assert rows[(1, 0x10, lock)][1] == round(total * 0.75) and rows[(1, 0x10, lock)][2] == 30
    assert rows[(1, 0x10, cond)][1] == round(total) - round(total * 0.75)
    assert rows[(1, 0x10, lock)][3] == pytest.approx(var * 0.75**2, rel=1e-3)
    assert (2, 0x20, ()) in rows


def test_timed_rows_state_their_spread_and_the_stretches_bias() -> None:
    """Rows timed in stretches: their variances add, and STRETCH_BIAS of their sum, not
    LOOK_BIAS (the looks only split them over stacks)."""
    share = OFFCPU_TIMED_S / OFFCPU_TIMED_EVERY_S
    rows = [
        FutexWait(1, 0x10, ["__lll_lock_wait"], 5, 400 * MS, samples=3, sd_ns=30 * MS, timed_share=share),
        FutexWait(2, 0x10, [], 5, 600 * MS, samples=0, sd_ns=40 * MS, timed_share=share),
    ]
    assert sampling_error_ns(rows) == round(Z90 * math.sqrt((50 * MS) ** 2 + (STRETCH_BIAS * 1000 * MS) ** 2))
