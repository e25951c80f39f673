"""The context policy and the series composites (data/series.py) on hand-made series whose answer
is known, and the policy's use by the samplers, the protocols and predict."""

import numpy as np
import pytest

from vcloud.data.series import COMPOSITES, choose_context, composites

DAYS = np.array([0, 10, 20, 30, 40, 50, 60, 100, 200])
COVER = np.array([0.0, 0.9, 0.5, 0.0, 0.02, 0.8, 0.0, 0.0, 0.0])  # date 3 is the target
USABLE = np.ones(9, dtype=bool)


def test_nearest_takes_the_dates_nearest_in_days_earlier_first_on_a_tie():
    chosen = choose_context(DAYS, COVER, USABLE, 3, 4, policy="nearest", window_days=30)
    # days 20 and 40 (10 d away), then day 10 before day 50 (both 20 d away)
    assert chosen.dates == (1, 2, 3, 4) and chosen.slot == 2 and chosen.fallback is None


def test_clearest_takes_the_least_cloud_within_the_window_nearer_first_among_equals():
    # within +-30 days of day 30: days 0..60; clear (one cover step): 0 (30 d), 40 (10 d), 60 (30 d)
    chosen = choose_context(DAYS, COVER, USABLE, 3, 4, policy="clearest", window_days=30)
    assert chosen.dates == (0, 3, 4, 6) and chosen.slot == 1 and chosen.fallback is None
    # two dates: the nearest of the clear ones
    assert choose_context(DAYS, COVER, USABLE, 3, 2, policy="clearest", window_days=30).dates == (3, 4)


def test_clearest_fills_from_beyond_the_window_and_says_so():
    chosen = choose_context(DAYS, COVER, USABLE, 3, 9, policy="clearest", window_days=10)
    assert chosen.fallback == "beyond_window"
    assert set(chosen.dates) == set(range(9))  # every date once: the window held 3 others, the rest by time


def test_too_few_dates_repeat_and_a_lone_target_repeats_itself():
    usable = np.array([False, False, True, True, False, False, False, False, False])
    chosen = choose_context(DAYS, COVER, usable, 3, 4, policy="clearest", window_days=30)
    assert chosen.fallback == "repeated" and chosen.dates == (2, 2, 2, 3) and chosen.slot == 3
    alone = choose_context(DAYS, COVER, usable & (np.arange(9) == 3), 3, 3, policy="nearest", window_days=30)
    assert alone.fallback == "target_only" and alone.dates == (3, 3, 3)


def test_random_needs_a_generator_and_ignores_time():
    with pytest.raises(ValueError, match="generator"):
        choose_context(DAYS, COVER, USABLE, 3, 4, policy="random", window_days=30)
    picks = {
        choose_context(DAYS, COVER, USABLE, 3, 2, policy="random", window_days=30, rng=np.random.default_rng(s)).dates
        for s in range(40)
    }
    assert (3, 8) in picks  # day 200 is drawn too: no window


@pytest.mark.parametrize("key, value", [("policy", "latest"), ("window_days", 0)])
def test_a_policy_that_cannot_be_met_names_its_key(key, value):
    kw = {"policy": "clearest", "window_days": 30, key: value}
    with pytest.raises(ValueError, match=f"data.context.{key}"):
        choose_context(DAYS, COVER, USABLE, 3, 4, **kw)


def _series():
    """Three dates of a 1-band 2x2 image around a target at day 50 (values chosen so each answer differs)."""
    s2 = np.array([[[[0.1, 0.1], [0.1, 0.1]]], [[[0.3, 0.3], [0.3, 0.3]]], [[[0.6, 0.6], [0.6, 0.6]]]], np.float32)
    clear = np.array(
        [
            [[True, True], [True, True]],  # day 0: clear everywhere (50 d away)
            [[True, False], [False, False]],  # day 45: clear at (0, 0) only
            [[True, True], [True, False]],  # day 70: clear but at (1, 1)
        ]
    )
    return s2, clear, np.array([0, 45, 70])


def test_each_composite_on_a_hand_made_series():
    s2, clear, days = _series()
    target = np.full((1, 2, 2), 0.9, np.float32)
    seen = np.array([[False, False], [False, True]])  # the user sees (1, 1) clear: kept
    out = composites(
        s2,
        clear,
        days,
        50,
        target=target,
        target_seen=seen,
        context=np.array([False, True, True]),
        window_days=30,
        clear_max_cover=0.0,
    )
    assert set(out) == set(COMPOSITES)
    # nearest clear date: only day 0 is wholly clear; the whole image, the target hidden whole
    np.testing.assert_allclose(out["nearest_clear_date"][0], [[0.1, 0.1], [0.1, 0.1]])
    # nearest clear value per pixel: (0,0) day 45; (0,1), (1,0) day 70 (20 d) over day 0 (50 d); (1,1) day 0
    np.testing.assert_allclose(out["nearest_clear_value"][0], [[0.3, 0.6], [0.6, 0.1]])
    # median of clear values within +-30 d (days 45, 70): (0,0) median(0.3, 0.6); (1,1) clear in neither: 0.1
    np.testing.assert_allclose(out["clear_median"][0], [[0.45, 0.6], [0.6, 0.1]])
    # the same with the pixel the user sees clear kept
    np.testing.assert_allclose(out["clear_median_kept"][0], [[0.45, 0.6], [0.6, 0.9]])
    # least cloudy within the window: day 70 (1 pixel cloudy) over day 45 (3)
    np.testing.assert_allclose(out["least_cloudy"][0], [[0.6, 0.6], [0.6, 0.6]])
    # mosaic of the context (days 45, 70): the mean of clear values; clear on neither: the least cloudy
    np.testing.assert_allclose(out["mosaic"][0], [[0.45, 0.6], [0.6, 0.6]])


def test_a_pixel_clear_nowhere_in_the_window_takes_the_nearest_clear_value():
    s2, clear, days = _series()
    out = composites(
        s2,
        clear,
        days,
        50,
        target=np.zeros((1, 2, 2), np.float32),
        target_seen=np.zeros((2, 2), bool),
        context=np.ones(3, bool),
        window_days=30,
        clear_max_cover=0.0,
    )
    assert out["clear_median"][0, 1, 1] == pytest.approx(0.1)  # only day 0 (outside the window) is clear there
