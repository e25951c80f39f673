"""Fast random access to a prepared store for training and evaluation.

xarray is the contract and the tool for inspection; a training sample, though, is a handful
of chunk reads, and going through zarr directly avoids xarray's per-call indexing overhead.
The zarr group is opened lazily on first read, so each DataLoader worker opens its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vcloud.data.store import CLOUD_PROB_SCALE, normalise_s1, normalise_s2, open_store


@dataclass(frozen=True)
class Sample:
    """Images of one location at the requested dates, normalised as the reference loader."""

    s2: np.ndarray  # (T, 13, H, W) float32 0..1
    s1: np.ndarray  # (T, 2, H, W) float32 0..1
    cloud_prob: np.ndarray  # (T, H, W) float32 0..1, NaN where S2 is missing
    valid_s2: np.ndarray  # (T,) bool
    valid_s1: np.ndarray  # (T,) bool


class StoreReader:
    """Per-(location, time) metadata in memory; pixels read on demand, one chunk per image."""

    def __init__(self, path: Path):
        self.path = Path(path)
        ds = open_store(self.path)  # validates format version and gives a clear error
        self.locations: list[str] = [str(v) for v in ds["location"].values]
        self.valid_s2 = ds["valid_s2"].values
        self.valid_s1 = ds["valid_s1"].values
        self.cloud_cover = ds["cloud_cover"].values
        self.cloud_class = ds["cloud_class"].values
        self.date_s2 = ds["date_s2"].values
        # (L, T, 2) wind (u east, v north; m/s) when the store has it, else NaN: no wind known.
        if "wind_u" in ds:
            self.wind = np.stack([ds["wind_u"].values, ds["wind_v"].values], axis=-1).astype(np.float32)
        else:
            self.wind = np.full((*self.valid_s2.shape, 2), np.nan, np.float32)
        self.shape = (ds.sizes["location"], ds.sizes["time"], ds.sizes["y"], ds.sizes["x"])
        self._arrays = None

    def __len__(self) -> int:
        return self.shape[0]

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_arrays"] = None  # open handles stay in their process
        return state

    def _open(self):
        if self._arrays is None:
            import zarr

            group = zarr.open_group(str(self.path), mode="r", use_consolidated=True, zarr_format=3)
            self._arrays = {name: group[name] for name in ("s2", "s1", "cloud_prob")}
        return self._arrays

    def read(self, location: int, times: Sequence[int]) -> Sample:
        arrays = self._open()
        index = np.asarray(times, dtype=np.int64)
        selection = (location, index)
        s2 = arrays["s2"].get_orthogonal_selection(selection)  # (T, 13, H, W) uint16
        s1 = arrays["s1"].get_orthogonal_selection(selection)  # (T, 2, H, W) dB
        prob = arrays["cloud_prob"].get_orthogonal_selection(selection)  # (T, H, W) uint8
        cloud_prob = np.where(prob == 255, np.nan, prob.astype(np.float32) / CLOUD_PROB_SCALE)
        return Sample(
            s2=normalise_s2(s2),
            s1=normalise_s1(s1),
            cloud_prob=cloud_prob.astype(np.float32),
            valid_s2=self.valid_s2[location, index],
            valid_s1=self.valid_s1[location, index],
        )
