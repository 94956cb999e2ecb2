"""The sampled off-CPU collector's lock-wait estimate and its stated error, on numbers
made by hand (no target): a futex row's share of its thread's looks in a stratum
(asleep, or woken and waiting for a CPU) times the stratum's exact total, and the
±90 % the report states from it."""

from __future__ import annotations

import math

import pytest

from kvprof.analysis.tables import LOOK_BIAS, Z90, sampling_error_ns
from kvprof.collect.offsample import row_estimate, stratum_share
from kvprof.model.delta import delta
from kvprof.model.profile import FutexWait, OffCpu, Profile, Target

MS = 1_000_000


def test_share_of_the_stratum_looks_stands_for_that_share_of_its_exact_time() -> None:
    """A row found by 30 of the 300 looks of 10 ms that found its thread asleep, when
    schedstat says it slept 6 s, is 0.6 s, with the binomial variance of a share of 0.1
    over 300 looks."""
    ns, var = stratum_share(30 * 10 * MS, 30, 300 * 10 * MS, 6000 * MS)
    assert ns == pytest.approx(600 * MS)
    assert math.sqrt(var) == pytest.approx(6000 * MS * math.sqrt(0.1 * 0.9 / 300))


def test_looks_that_find_a_stratum_too_often_do_not_move_its_total() -> None:
    """Looks that found a thread asleep in a futex 400 times of 1000 when schedstat
    says it slept 1 s: the rows split that 1 s by their looks in the sleep, whatever
    the share of all looks (a look takes a CPU and finds threads asleep or runnable
    more often than they are)."""
    one, _ = stratum_share(300 * 10 * MS, 300, 400 * 10 * MS, 1000 * MS)
    other, _ = stratum_share(100 * 10 * MS, 100, 400 * 10 * MS, 1000 * MS)
    assert one + other == pytest.approx(1000 * MS)
    assert one == pytest.approx(3 * other)


def test_wait_for_a_cpu_is_split_by_the_looks_at_other_cpus() -> None:
    """A thread the looks found runnable 100 times on another CPU (30 of them woken
    from this futex wait) and 200 times on the look's own (a thread the look displaced
    among them: 20 woken) has 0.3 of its exact wait for a CPU in the row, plus its
    share of the sleep; the looks behind it are those two strata's."""
    # waits, ns and looks in the sleep, woken on another CPU, woken on the look's
    entry = [5, 10 * 10 * MS, 10, 30 * 10 * MS, 30, 20 * 10 * MS, 20]
    strata = (50 * 10 * MS, 100 * 10 * MS, 200 * 10 * MS)
    ns, var, looks = row_estimate(entry, strata, 500 * MS, 2000 * MS)
    assert ns == pytest.approx(0.2 * 500 * MS + 0.3 * 2000 * MS)
    assert looks == 40
    assert var > 0


def test_thread_never_runnable_elsewhere_is_split_by_the_look_cpu() -> None:
    """A thread the looks found runnable only on their own CPU (one CPU, or the others
    always busy): its wait for a CPU is split by those looks, not left out."""
    entry = [5, 0, 0, 0, 0, 20 * 10 * MS, 20]
    ns, _, looks = row_estimate(entry, (0, 0, 80 * 10 * MS), 0, 1000 * MS)
    assert ns == pytest.approx(250 * MS)
    assert looks == 20


def test_no_looks_no_estimate() -> None:
    """A stratum no look found gives nothing, not a division by zero."""
    assert stratum_share(0, 0, 0, 5 * MS) == (0.0, 0.0)
    assert row_estimate([0] * 7, (0, 0, 0), 5 * MS, 5 * MS) == (0.0, 0.0, 0)


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
