"""The one place intervals are made: paired bootstrap, Welch, the normal interval, flips."""

from __future__ import annotations

import random
import statistics

import pytest

from polygym.collect import statistics as stats


def test_identical_runs_interval_contains_zero_and_no_flips() -> None:
    rng = random.Random(1)
    base = {t: rng.random() for t in range(40)}
    est = stats.delta(base, dict(base))
    assert est.method == stats.PAIRED and est.mean == 0.0 and est.low == 0.0 and est.high == 0.0
    rewards = {t: [1.0, 0.0, 1.0] if t % 2 else [0.0] for t in range(40)}
    found = stats.flips(rewards, dict(rewards))
    assert found.lost == [] and found.gained == []


def test_noisy_identical_distributions_interval_straddles_zero() -> None:
    rng = random.Random(2)
    base = {t: float(rng.random() < 0.5) for t in range(60)}
    new = {t: float(rng.random() < 0.5) for t in range(60)}
    est = stats.delta(base, new)
    assert est.low is not None and est.high is not None and est.low < 0 < est.high


def test_clear_regression_interval_below_zero() -> None:
    base = {t: 1.0 if t % 10 else 0.0 for t in range(50)}  # 90% solved
    new = {t: 1.0 if t % 2 else 0.0 for t in range(50)}  # 50% solved
    est = stats.delta(base, new)
    assert est.mean == pytest.approx(-0.4) and est.high is not None and est.high < -0.2


def test_bootstrap_is_seeded_and_reproducible() -> None:
    diffs = {"a": [(-1.0) ** t * (t % 3) for t in range(30)]}
    one = stats.paired_bootstrap(diffs, resampler=stats.Resampler(500, seed=7))
    assert one == stats.paired_bootstrap(diffs, resampler=stats.Resampler(500, seed=7))
    assert one != stats.paired_bootstrap(diffs, resampler=stats.Resampler(500, seed=8))
    wider = stats.paired_bootstrap(diffs, confidence=0.99, resampler=stats.Resampler(500, seed=7))
    assert wider.low is not None and one.low is not None and wider.low <= one.low


def test_draws_are_shared_per_stratum_and_independent_across_strata() -> None:
    resampler = stats.Resampler(300, seed=1)
    values = [float(t % 2) for t in range(20)]
    assert resampler.means(values, "a") == resampler.means(values, "a")
    assert resampler.means(values, "a") != resampler.means(values, "b")
    # order-independent: a fresh resampler asked for "b" first gives "a" the same draws
    other = stats.Resampler(300, seed=1)
    other.means(values, "b")
    assert other.means(values, "a") == resampler.means(values, "a")


def test_strata_count_once_each() -> None:
    # a 2-task environment that dropped by 1 weighs as much as a 100-task one that did not move
    est = stats.paired_bootstrap(
        {"small": [-1.0, -1.0], "large": [0.0] * 100}, resampler=stats.Resampler(200)
    )
    assert est.mean == pytest.approx(-0.5) and est.n == 102


def test_welch_unpaired_matches_a_hand_computed_value() -> None:
    base, new = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0, 9.0, 10.0]
    # se^2 = 1.6667/4 + 11.2/5 = 2.65667; df = 5.378 (Welch-Satterthwaite); t(0.975, 5.378) = 2.5172
    est = stats.delta({("b", i): v for i, v in enumerate(base)}, {("n", i): v for i, v in enumerate(new)})
    assert est.method == stats.WELCH and est.mean == pytest.approx(3.7)
    assert est.high is not None and est.high - 3.7 == pytest.approx(4.1027, abs=1e-3)
    try:
        from scipy import stats as scipy_stats
    except ImportError:  # not a dependency: the hand-computed value above is the check then
        return
    ci = scipy_stats.ttest_ind(new, base, equal_var=False).confidence_interval(0.95)
    assert (est.low, est.high) == pytest.approx((ci.low, ci.high))


@pytest.mark.parametrize(("p", "df", "t"), [(0.975, 1, 12.7062), (0.975, 10, 2.2281), (0.025, 30, -2.0423)])
def test_t_quantile_matches_tables(p: float, df: float, t: float) -> None:
    assert stats.t_quantile(p, df) == pytest.approx(t, abs=1e-4)


def test_flips_both_ways_and_solved_rule() -> None:
    base = {0: [1.0, 1.0], 1: [0.0, 0.0], 2: [1.0, 0.0], 3: [1.0]}
    new = {0: [0.0, 0.0], 1: [1.0, 0.0], 2: [1.0, 0.0], 4: [1.0]}
    found = stats.flips(base, new)
    assert found.lost == [0] and found.gained == [1]  # half passing is solved; unshared tasks never flip
    assert not stats.solved([])


def test_small_samples_have_no_interval_and_bad_settings_raise() -> None:
    assert stats.delta({0: 1.0}, {0: 0.0}).low is None
    assert stats.welch([1.0], [0.0, 1.0]).low is None
    assert stats.mean_interval([]).mean is None
    with pytest.raises(ValueError, match="confidence"):
        stats.mean_interval([1.0, 2.0], confidence=1.0)
    with pytest.raises(ValueError, match="resamples"):
        stats.Resampler(0)


def test_mcnemar_exact_p_value_counts_only_the_flips() -> None:
    base = {i: i < 12 for i in range(40)}  # 12 pass
    new = {**base, 0: False, **{i: True for i in range(20, 29)}}  # 1 lost, 9 gained
    result = stats.mcnemar(base, new)
    assert (result.lost, result.gained, result.n) == (1, 9, 40)
    assert result.p_value == pytest.approx(22 / 1024)  # 2 * P(X <= 1), X ~ Binomial(10, 1/2)
    assert stats.mcnemar(base, base).p_value == 1.0  # nothing flipped
    balanced = stats.mcnemar({1: True, 2: True, 3: False, 4: False}, {1: False, 2: False, 3: True, 4: True})
    assert balanced.p_value == 1.0
    assert stats.mcnemar({1: True, 2: True}, {2: False, 3: True}).n == 1  # only shared tasks


def test_rollout_mean_interval_weighs_rollouts_and_takes_tasks_as_units() -> None:
    even = [[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [1.0, 0.0]]
    assert stats.rollout_mean_interval(even) == stats.mean_interval([0.5, 1.0, 0.0, 0.5])
    ragged = stats.rollout_mean_interval([[1.0] * 6, [0.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    assert ragged.mean == 8 / 12 and ragged.n == 4  # the metrics file's mean/reward, 4 tasks
    assert ragged.low is not None and ragged.high is not None and ragged.low < 8 / 12 < ragged.high


def test_numpy_and_pure_python_draws_estimate_the_same_spread() -> None:
    values = tuple(float(i % 7) for i in range(300))
    fast = stats._numpy_means(values, 5, 2000)
    slow = stats._python_means(values, 5, 2000)
    assert abs(statistics.fmean(fast) - statistics.fmean(slow)) < 0.05
    assert abs(statistics.stdev(fast) - statistics.stdev(slow)) < 0.02
