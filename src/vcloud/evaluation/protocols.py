"""The samples of our two evaluation protocols (the published third: evaluation/uncrtaints.py).

- fixed: seeded synthetic clouds (thin, thick, opaque in turn) put on the clear dates of the
  store; ground truth = the clear image; the other T-1 dates keep their natural clouds.
  Defined in evaluation/fixed_protocol.py beside its detection file (`fixed_samples`, re-exported here).
- reference (as UnCRtainTS): per location, the least-cloudy date is the ground truth and T
  other dates, all with their natural clouds, are the input; the model reconstructs at the
  input date nearest in time to the ground truth.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from vcloud.config import ModelSetConfig
from vcloud.data.samples import context_record, left_out, stack_sample
from vcloud.data.series import choose_context
from vcloud.data.shards import as_reader  # direct, checked shard reads; a reader handed down as it is
from vcloud.evaluation.fixed_protocol import EVAL_SEED, fixed_samples  # noqa: F401 (re-exported: the readers' names)


class ReferenceSamples(Dataset):
    """Natural clouds, after UnCRtainTS's reference loader: per location a clear date is the ground
    truth and T other usable dates, with their natural clouds, are the input, chosen by the context
    policy (data/series.py; `nearest`: the reference loader's own choice); the model reconstructs
    at the input date nearest in time to the truth.

    truths=1: the least-cloudy date of each location (the reference's one sample per location).
    truths=k: up to k truths per location, evenly spaced in time among its clear dates (cloud
    cover <= clear_max_cover; the least-cloudy date where none is clear): more samples of the
    same locations, so that differences between stages on natural clouds can be told apart.
    truths=None: every clear date is a truth (a series of your own: evaluation.reference_truths
    all, and every plain-folder store).
    """

    def __init__(
        self,
        store: Path,
        *,
        dates: int,
        truths: int | None = 1,
        clear_max_cover: float = 0.05,
        policy: str = "nearest",
        window_days: int = 30,
    ):
        if truths is not None and truths < 1:
            raise ValueError(f"reference protocol: truths per location must be >= 1, got {truths}")
        self.reader = as_reader(store)
        self.every_clear_date = truths is None
        usable = self.reader.valid_s2.copy()  # with or without S1 (zeroed, s1_valid); data/samples.py
        left_out(self.reader, usable, sampler="protocol reference", min_dates=2)  # logged: counted, named
        cover = np.where(usable, np.nan_to_num(self.reader.cloud_cover, nan=1.0), np.inf)
        days = self.reader.date_s2.astype("datetime64[D]").astype(np.int64)
        self.items = []
        for location in np.flatnonzero(usable.sum(axis=1) >= 2):
            every = int(usable.shape[1]) if truths is None else truths
            for truth in reference_truths(cover[location], truths=every, clear_max_cover=clear_max_cover):
                # T + 1 dates by the policy around the truth, the truth left out of them
                chosen = choose_context(
                    days[location],
                    self.reader.cloud_cover[location],
                    usable[location],
                    truth,
                    dates + 1,
                    policy=policy,
                    window_days=window_days,
                )
                inputs = [d for i, d in enumerate(chosen.dates) if i != chosen.slot]
                slot = int(np.argmin(np.abs(days[location, inputs] - days[location, truth])))
                self.items.append((int(location), truth, inputs, slot, chosen.fallback))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        location, truth, dates, slot, fallback = self.items[index]
        sample = self.reader.read(location, [*dates, truth])
        prob = np.nan_to_num(sample.cloud_prob, nan=1.0)
        item = stack_sample(
            sample.s2[:-1],
            sample.s1[:-1],
            prob[:-1],
            self.reader.date_s2[location, dates],
            slot,
            s1_valid=sample.valid_s1[:-1],
        )
        item["target"] = torch.from_numpy(np.ascontiguousarray(sample.s2[-1]))
        item["wind"] = torch.from_numpy(self.reader.wind[location, dates[slot]])
        item["cloud_class"] = torch.tensor(int(self.reader.cloud_class[location, dates[slot]]))
        item["location"] = torch.tensor(location)
        item.update(context_record(truth, dates, fallback))
        return item


def reference_truths(cover: np.ndarray, *, truths: int, clear_max_cover: float) -> list[int]:
    """The truth dates of one location (cover (T,): inf where unusable): the least-cloudy date for
    truths=1, else up to `truths` clear dates evenly spaced in time (the least-cloudy if none)."""
    least = int(np.argmin(cover))
    clear = np.flatnonzero(cover <= clear_max_cover)
    if truths == 1 or len(clear) == 0:
        return [least]
    picks = np.unique(np.linspace(0, len(clear) - 1, min(truths, len(clear))).round().astype(int))
    return [int(clear[i]) for i in picks]


def reference_samples(store: Path, cfg: ModelSetConfig) -> ReferenceSamples:
    """Protocol reference on `store` as the config sets it (T, truths per location)."""
    reader = as_reader(store)
    every = cfg.evaluation.reference_truths == "all" or reader.from_plain_folder
    return ReferenceSamples(
        reader,
        dates=cfg.data.input_dates,
        truths=None if every else cfg.evaluation.reference_truths,
        clear_max_cover=cfg.data.clear_target_max_cover,
        **cfg.data.context.sampler_kwargs(),
    )
