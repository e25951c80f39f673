"""The series composites (data/series.py) as baselines of our protocols: what a user computes by
hand from every date of the series that the protocol lets a method see.

A sample of the fixed or the reference protocol hides one date, its truth; every other usable date
of the location is the series (the reconstructed date, when it is another one, with it). The
composites are made for the truth's day, the truth hidden whole (../shared/GAPFILL.md's
protocol); `clear_median_kept` also keeps the truth's pixels that are seen (cloud probability
below the threshold, as the model is told) where the truth is the reconstructed date under a
synthetic cloud (the fixed protocol), as a user masks clouds and fills them. The model's own
inputs are a few of these dates (its context), so a series baseline sees at least what the model
sees: the comparison is never flattered by giving the simple answers less.

`WithSeries(dataset)` adds `series` (K, C, H, W), the composites in series.COMPOSITES order, to
every item; evaluation/scoring.py scores them as `series_<name>` beside the model.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from vcloud.constants import CLOUD_CHANNEL, S2_CHANNELS, S2CLOUDLESS_KWARGS
from vcloud.data.series import COMPOSITES, composites
from vcloud.data.store import CLOUD_PROB_SCALE, normalise_s2

NAMES = tuple(f"series_{name}" for name in COMPOSITES)
CLEAR_BELOW = S2CLOUDLESS_KWARGS["threshold"]


class WithSeries(Dataset):
    """`dataset`'s items (a reader, items with location, date, dates, target_index, x) with `series`."""

    def __init__(self, dataset: Dataset, *, window_days: int, clear_max_cover: float):
        self.dataset = dataset
        self.reader = dataset.reader
        self.window_days, self.clear_max_cover = window_days, clear_max_cover
        self.days = self.reader.date_s2.astype("datetime64[D]").astype(np.int64)  # (L, T)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        item = self.dataset[index]
        location, truth = int(item["location"]), int(item["date"])
        inputs = [int(d) for d in item["dates"]]
        slot = int(item["target_index"])
        reconstructed = inputs[slot]
        usable = self.reader.valid_s2[location].copy()
        usable[truth] = False  # hidden: the truth (in the fixed protocol the reconstructed date too)
        times = np.flatnonzero(usable).tolist()
        x = item["x"]
        target = x[slot, S2_CHANNELS].numpy()
        # The truth's pixels seen through the synthetic cloud (fixed protocol) are kept; a truth
        # that is another date than the reconstructed one (reference protocol) is hidden whole.
        seen = (x[slot, CLOUD_CHANNEL] < CLEAR_BELOW).numpy() & (reconstructed == truth)
        if times:
            raw = self.reader.read_raw(location, times)
            s2 = normalise_s2(raw.s2)
            clear = (raw.cloud_prob != 255) & (raw.cloud_prob < round(CLEAR_BELOW * CLOUD_PROB_SCALE))
        else:
            s2 = np.zeros((0, *target.shape), np.float32)
            clear = np.zeros((0, *target.shape[1:]), bool)
        answers = composites(
            s2,
            clear,
            self.days[location, times],
            int(self.days[location, truth]),
            target=target,
            target_seen=seen,
            context=np.isin(times, inputs),
            window_days=self.window_days,
            clear_max_cover=self.clear_max_cover,
        )
        item = dict(item)
        item["series"] = torch.from_numpy(np.stack([answers[name] for name in COMPOSITES]))
        return item
