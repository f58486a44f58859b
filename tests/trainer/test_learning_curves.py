"""The sample-efficiency figures of bench/models/sample_efficiency.py, checked against values worked
out by hand from small curves."""

from __future__ import annotations

import pytest

from asyncgrpo_trainer.learning_curves import (
    Reached,
    Spread,
    area_under,
    mean_curve,
    reached,
    spread,
    steps_to,
    verdict,
)


def test_steps_to_a_threshold_is_the_first_validated_step_at_or_above_it() -> None:
    curve = {20: 0.6, 0: 0.0, 10: 0.5, 30: 0.4}
    assert steps_to(curve, 0.5) == 10  # reached exactly, in step order whatever the dict's order
    assert steps_to(curve, 0.55) == 20
    assert steps_to(curve, 0.8) is None


def test_the_area_is_the_mean_accuracy_over_the_samples_trained() -> None:
    # Trapezoids over 0-100-300 samples: 100 x (0 + 0.5) / 2 + 200 x (0.5 + 1) / 2 = 25 + 150 = 175.
    assert area_under([(0, 0.0), (100, 0.5), (300, 1.0)]) == pytest.approx(175 / 300)
    assert area_under([(0, 1.0), (256, 1.0)]) == 1.0


def test_of_two_runs_ending_at_the_same_accuracy_the_one_that_learned_sooner_has_the_larger_area() -> None:
    early = [(0, 0.0), (100, 0.9), (200, 0.9)]
    late = [(0, 0.0), (100, 0.1), (200, 0.9)]
    assert area_under(early) == pytest.approx(0.675)  # (45 + 90) / 200
    assert area_under(late) == pytest.approx(0.275)  # (5 + 50) / 200


def test_an_area_needs_a_span_of_samples() -> None:
    with pytest.raises(ValueError, match="two or more points"):
        area_under([(0, 0.5)])


def test_the_mean_curve_averages_each_validated_step_over_the_runs() -> None:
    assert mean_curve([{0: 0.0, 10: 0.4}, {0: 0.1, 10: 0.8}]) == {
        0: pytest.approx(0.05),
        10: pytest.approx(0.6),
    }
    with pytest.raises(ValueError, match="different steps"):
        mean_curve([{0: 0.0, 10: 0.4}, {0: 0.0, 20: 0.4}])


def test_a_spread_over_seeds_is_the_mean_the_sample_deviation_and_the_lowest_seed() -> None:
    # Mean 0.6; squared deviations 0.04 + 0 + 0.04 over n - 1 = 2: variance 0.04, deviation 0.2.
    assert spread([0.4, 0.6, 0.8]) == Spread(mean=pytest.approx(0.6), std=pytest.approx(0.2), worst=0.4)
    assert spread([0.7]) == Spread(mean=0.7, std=0.0, worst=0.7)


def test_steps_to_a_threshold_over_seeds_names_the_slowest_seed_or_how_many_never_got_there() -> None:
    assert reached([30, 50, 40]) == Reached(mean=40.0, worst=50, missed=0)
    assert reached([30, None, 50]) == Reached(mean=40.0, worst=None, missed=1)
    assert reached([None, None]) == Reached(mean=None, worst=None, missed=2)


def test_a_mode_within_one_sync_deviation_on_its_mean_and_its_worst_seed_is_within_the_spread() -> None:
    sync = Spread(mean=0.60, std=0.05, worst=0.52)
    close = Spread(mean=0.56, std=0.02, worst=0.48)  # 0.04 and 0.04 below sync: within 0.05
    assert verdict(close, sync) == "within sync's seed spread (0.050): mean -0.040, worst seed -0.040"
    better = Spread(mean=0.70, std=0.01, worst=0.69)
    assert verdict(better, sync) == "within sync's seed spread (0.050): mean +0.100, worst seed +0.170"


def test_a_mode_beyond_syncs_spread_is_reported_worse_by_how_much_on_each_figure_that_misses() -> None:
    sync = Spread(mean=0.60, std=0.05, worst=0.52)
    low_worst = Spread(mean=0.58, std=0.10, worst=0.40)  # mean 0.02 below: within; worst 0.12 below
    assert verdict(low_worst, sync) == "worse than sync beyond its seed spread (0.050): worst seed by 0.120"
    low_both = Spread(mean=0.45, std=0.03, worst=0.41)
    assert verdict(low_both, sync) == (
        "worse than sync beyond its seed spread (0.050): mean by 0.150, worst seed by 0.110"
    )
