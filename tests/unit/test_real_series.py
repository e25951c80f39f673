"""The simple answers and the context policy on a real Level-2A series (../shared/realdata, read in
place): the figures its README states, reproduced by vcloud's own code."""

import numpy as np
import pytest

from vcloud.data.series import choose_context, composites
from vcloud.data.store import CLOUD_PROB_SCALE, normalise_s2


def _psnr(a, b):
    return float(-10 * np.log10(np.mean((a.astype(np.float64) - b) ** 2)))


@pytest.fixture(scope="module")
def series(real_store):
    from vcloud.data.shards import ShardReader

    reader = ShardReader(real_store)
    times = list(range(reader.shape[1]))
    raw = reader.read_raw(0, times)
    clear = (raw.cloud_prob != 255) & (raw.cloud_prob < round(0.4 * CLOUD_PROB_SCALE))
    days = reader.date_s2[0].astype("datetime64[D]").astype(np.int64)
    return reader, normalise_s2(raw.s2), clear, days


def test_every_clear_date_hidden_whole_the_composites_score_as_the_readme_says(series):
    """README: the clear-pixel median within 30 days 28.49 dB, the nearest clear date 26.26, the
    per-pixel nearest clear value 25.31 (every date under 5 % SCL cloud a truth, from the other 117)."""
    reader, s2, clear, days = series
    truths = np.flatnonzero(reader.cloud_cover[0] < 0.05)
    assert len(truths) == 53
    scores = {"clear_median": [], "nearest_clear_date": [], "nearest_clear_value": []}
    for t in truths:
        rest = np.arange(len(days)) != t
        out = composites(
            s2[rest],
            clear[rest],
            days[rest],
            int(days[t]),
            target=np.zeros_like(s2[t]),
            target_seen=np.zeros(s2.shape[2:], bool),
            context=np.zeros(rest.sum(), bool),
            window_days=30,
            clear_max_cover=0.05,
        )
        for name in scores:
            scores[name].append(_psnr(out[name], s2[t]))
    means = {name: np.mean(values) for name, values in scores.items()}
    # within 0.3 dB of the README's figures (the README's cover counts the pixels as its tool did)
    assert means["clear_median"] == pytest.approx(28.49, abs=0.3)
    assert means["nearest_clear_date"] == pytest.approx(26.26, abs=0.3)
    assert means["nearest_clear_value"] == pytest.approx(25.31, abs=0.3)
    assert means["clear_median"] > means["nearest_clear_date"] > means["nearest_clear_value"]


def test_the_clearest_policy_takes_clear_dates_near_the_target_where_the_series_has_them(series):
    reader, _, _, days = series
    cover = reader.cloud_cover[0]
    usable = reader.valid_s2[0]
    fallbacks = 0
    for t in np.flatnonzero(cover < 0.05):
        chosen = choose_context(days, cover, usable, int(t), 4, policy="clearest", window_days=30)
        others = [d for d in chosen.dates if d != t]
        if chosen.fallback:
            fallbacks += 1
            continue
        assert all(abs(days[d] - days[t]) <= 30 for d in others)
        # no date of the window left out is clearer by a cover step than one taken
        window = [d for d in np.flatnonzero(usable) if d != t and abs(days[d] - days[t]) <= 30 and d not in others]
        assert not window or np.floor(cover[others] / 0.05).max() <= np.floor(cover[window] / 0.05).min()
    assert fallbacks <= 3  # a 5-day revisit holds 3 dates within a month almost everywhere
