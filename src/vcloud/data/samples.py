"""Training and evaluation samples drawn from a prepared store (torch Datasets).

Every draw is a pure function of (seed, epoch, index): the sampler hands the dataset the
global index `epoch * len(dataset) + i`, so the data order survives DataLoader workers, DDP
sharding and a resume from a checkpoint, bit for bit.

- ClearImages (stage 0): one clear S2 image.
- CloudySamples (stages 1-3, evaluation): T dates of one location; the target date is a clear
  date with a synthetic cloud of the curriculum's class put on it (the other T-1 dates keep
  their natural clouds); ground truth = the clear image. The target's cloud probability is
  what s2cloudless (data/clouds.py, as in prepare) finds on the clouded image, stored as the
  store stores it: the model never sees the synthetic opacity, in training or evaluation.
  With fixed `kinds` (validation, evaluation) sample i is the i-th (clear target, kind) pair
  of a seeded order: every clear target once per kind before any repeats.
- UnlabelledSamples (stage 3): T dates of a location that is never clear; the target date keeps
  its natural clouds and has no ground truth; `visible` marks pixels the cloud mask calls clear.

Cloudy and unlabelled samples carry `wind` (u, v) of the target date (NaN when unknown), from
which a wind-scanning model picks its scan sector.

Dates without S1, short series. A date counts as usable when its S2 image is valid, with or
without S1. Where S1 is missing its channels are zeros (normalised; the clip floor in dB for raw
samples), the model is told so in x's S1 validity channel (constants.S1_VALID_CHANNEL: 0), and
every sample of T dates says so: `s1_valid` (T,) bool and `target_s1_valid` () bool (the target
slot's), in every sampler here and in evaluation/protocols.py and evaluation/uncrtaints.py, so
batches of any of them collate. Training removes S1 from dates at random (CloudySamples'
`s1_dropout`, config data.s1_dropout) so that the models know the case; `WithoutS1` removes it
from every date (vcloud evaluate --without-s1). Both mark a date exactly as a missing S1 is. A location with fewer usable dates
than T repeats dates (drawn with replacement, in time order) to fill the T slots; a location with
a single usable date is no clear target for CloudySamples (its other slots would show the
ground truth), and a location without any S2 date is of no use to any sampler: both are counted
and named in the log when a sampler is built (`left_out`).

With `raw=True` (training) a sample carries the images as stored - S2 as int16 bits of the
uint16 reflectance, S1 in dB, the cloud probability as uint8 - and `finish_batch` normalises
the whole batch where it lands (the accelerator) and blends the synthetic cloud (simulated in
the worker, from the sample's seed, where its detected probability is computed too) into the
target date, giving exactly the layout and values of `raw=False`: normalising 17 images in numpy costs a loader process about as much as reading
and decompressing them; on the device it costs nothing.

`detect` says where s2cloudless runs on the clouded target: "worker" (LightGBM in the loader
process, ~1 s of one core per 256x256 target) or "device" (raw batches only: the worker leaves
the stored probability and marks the sample `detect_target`; finish_batch runs the same trees
as torch tensors, data/cloud_trees.py, where the batch is). Training on a GPU uses "device".
Evaluation reads the fixed samples' detection from a file made once per run instead
(`detected`, set by evaluation/fixed_protocol.fixed_samples).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from vcloud.constants import (
    CLEAR_MAX_COVER,
    CLOUD_CLASSES,
    S1_CHANNELS,
    S1_CLIP_DB,
    S1_VALID_CHANNEL,
    S2_BANDS,
    S2_CLIP,
    S2_SCALE,
    S2CLOUDLESS_KWARGS,
)
from vcloud.data import cloudsim
from vcloud.data.cloud_trees import detected_levels
from vcloud.data.clouds import cloud_probability
from vcloud.data.masks import store_mask_source
from vcloud.data.series import FALLBACKS, choose_context
from vcloud.data.shards import ShardReader as StoreReader
from vcloud.data.shards import as_reader
from vcloud.data.store import CLOUD_PROB_SCALE, normalise_s1, normalise_s2
from vcloud.errors import BadInputError

log = logging.getLogger(__name__)

DETECT_ON = ("worker", "device")  # where CloudySamples runs s2cloudless on the clouded target
NAMED = 20  # locations named per log line; the rest counted


class NoSamples(BadInputError, ValueError):
    """A store holds no sample of a kind: one line naming the store and why (exit 2 in the CLI)."""


def _usable(reader: StoreReader) -> np.ndarray:
    """(L, T) bool: dates with a valid S2 image, with or without S1 (see the module docstring)."""
    return reader.valid_s2.copy()


def left_out(reader: StoreReader, usable: np.ndarray, *, sampler: str, min_dates: int = 1) -> list[int]:
    """Locations with fewer than `min_dates` usable dates: logged (counted, named); returns them.

    Also says how many usable dates lack S1. Logs nothing when nothing is left out and S1 is
    everywhere (the common case: no noise)."""
    counts = usable.sum(axis=1)
    short = np.flatnonzero(counts < min_dates).tolist()
    no_s1 = int((usable & ~reader.valid_s1).sum())
    if no_s1:
        log.info(
            "%s %s: %d of %d usable dates have no S1 (used with S1 zeroed, s1_valid False)",
            reader.path,
            sampler,
            no_s1,
            int(usable.sum()),
        )
    for label, group in (
        ("no S2 date", [i for i in short if counts[i] == 0]),
        (f"fewer than {min_dates} dates with S2", [i for i in short if counts[i] > 0]),
    ):
        if group:
            names = ", ".join(reader.locations[i] for i in group[:NAMED])
            more = f" and {len(group) - NAMED} more" if len(group) > NAMED else ""
            log.info(
                "%s %s: %d of %d locations left out (%s): %s%s",
                reader.path,
                sampler,
                len(group),
                len(counts),
                label,
                names,
                more,
            )
    return short


def no_target_reason(reader: StoreReader, usable: np.ndarray, clear_max_cover: float) -> str:
    """Why a store has no clear target, for the one-line error: what it does hold."""
    cover = np.where(usable, np.nan_to_num(reader.cloud_cover, nan=1.0), np.inf)
    lowest = f"lowest cloud cover {float(cover.min()):.3f}" if usable.any() else "no S2 image"
    single = int((usable.sum(axis=1) == 1).sum())
    return (
        f"{reader.path}: no clear date (cloud cover < {clear_max_cover} on a valid S2 image, in a location "
        f"with at least 2 dates) to use as ground truth: {len(reader)} locations, {int(usable.sum())} dates "
        f"with S2 ({lowest}), {single} locations with a single date"
    )


class _StoreSamples(Dataset):
    def __init__(
        self,
        store: Path,
        *,
        length: int,
        seed: int,
        crop: int | None,
        raw: bool = False,
        policy: str = "clearest",
        window_days: int = 30,
    ):
        self.reader = as_reader(store)
        self.length = length
        self.seed = seed
        self.crop = crop
        self.raw = raw
        self.policy, self.window_days = policy, window_days

    def context(self, rng, usable_row: np.ndarray, location: int, target_t: int, count: int):
        """The sample's dates under the context policy (data/series.py): a series.Context."""
        days = self.reader.date_s2[location].astype("datetime64[D]").astype(np.int64)
        return choose_context(
            days,
            self.reader.cloud_cover[location],
            usable_row,
            target_t,
            count,
            policy=self.policy,
            window_days=self.window_days,
            rng=rng,
        )

    def __len__(self) -> int:
        return self.length

    def _rng(self, index: int) -> tuple[np.random.Generator, int]:
        epoch, i = divmod(int(index), self.length)
        return np.random.default_rng((self.seed, epoch, i)), epoch

    def _window(self, rng: np.random.Generator) -> tuple[slice, slice]:
        _, _, height, width = self.reader.shape
        if self.crop is None or self.crop >= min(height, width):
            return slice(None), slice(None)
        y = int(rng.integers(0, height - self.crop + 1))
        x = int(rng.integers(0, width - self.crop + 1))
        return slice(y, y + self.crop), slice(x, x + self.crop)


class ClearImages(_StoreSamples):
    """Stage 0: clear S2 images (cloud cover below `clear_max_cover`)."""

    def __init__(self, store, *, length=None, seed=0, crop=None, clear_max_cover=CLEAR_MAX_COVER, raw=False):
        reader = as_reader(store)
        usable = _usable(reader)
        left_out(reader, usable, sampler="clear images")
        clear = usable & (np.nan_to_num(reader.cloud_cover, nan=1.0) < clear_max_cover)
        self.images = np.argwhere(clear)  # (N, 2) location, time
        if len(self.images) == 0:
            raise NoSamples(
                f"{store}: no clear image (cloud cover < {clear_max_cover} on a valid S2 image) to train on"
            )
        super().__init__(reader, length=length or len(self.images), seed=seed, crop=crop, raw=raw)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        rng, _ = self._rng(index)
        location, t = self.images[int(rng.integers(len(self.images)))]
        ys, xs = self._window(rng)
        s2 = self.reader.read_raw(int(location), [int(t)]).s2[0][:, ys, xs]  # (13, h, w) uint16
        if self.raw:
            return {"target_raw": _bits(s2)}
        return {"target": torch.from_numpy(np.ascontiguousarray(normalise_s2(s2)))}


class CloudySamples(_StoreSamples):
    """T dates of a location with a synthetic cloud on the (clear) target date."""

    def __init__(
        self,
        store,
        *,
        dates: int,
        length=None,
        seed=0,
        crop=None,
        clear_max_cover=CLEAR_MAX_COVER,
        epochs: int = 1,
        mixed_from: float = 0.0,
        all_from: float = 0.0,
        kinds: tuple[str, ...] | None = None,
        raw: bool = False,
        detect: str = "worker",
        clear_share: float = 0.0,
        s1_dropout: float = 0.0,
        policy: str = "clearest",
        window_days: int = 30,
    ):
        """clear_share (training, kinds None): the share of samples whose target date gets no
        synthetic cloud (kind "clear"); 0 draws exactly the samples it drew before it existed.
        s1_dropout: the probability that a date's S1 is removed (marked missing, as a date without
        S1 is), each date on its own, drawn from a generator of its own: 0 draws exactly the
        samples it drew before it existed."""
        if not 0.0 <= s1_dropout <= 1.0:
            raise ValueError(f"CloudySamples s1_dropout={s1_dropout}: expected a probability in 0..1")
        if detect not in DETECT_ON:
            raise ValueError(f"CloudySamples detect={detect!r}: expected one of {', '.join(DETECT_ON)}")
        if detect == "device" and not raw:
            raise ValueError("CloudySamples detect='device' needs raw=True (finish_batch detects on the device)")
        self.detect = detect
        reader = as_reader(store)
        # The cloud put on a clear target is in the store's bands; its probability is what the
        # store's mask would say: s2cloudless's, or, for a mask that came with the data (SCL/,
        # MASK/; any band set but L1C's 13), the simulated cloud itself (cloudsim.simulated_probability).
        self.spectrum = cloudsim.cloud_spectrum(reader.s2_bands)
        self.supplied_mask = store_mask_source(reader.cloud_mask) != "s2cloudless"
        usable = _usable(reader)
        single = left_out(reader, usable, sampler="cloudy samples", min_dates=2)
        clear = usable & (np.nan_to_num(reader.cloud_cover, nan=1.0) < clear_max_cover)
        clear[single] = False  # a single date: the other slots would repeat the ground truth
        self.targets = np.argwhere(clear)  # (N, 2) location, clear date
        if len(self.targets) == 0:
            raise NoSamples(no_target_reason(reader, usable, clear_max_cover))
        self.usable = usable
        self.dates = dates
        self.epochs = epochs
        self.mixed_from, self.all_from = mixed_from, all_from
        self.kinds = kinds  # fixed kinds (evaluation); None = the curriculum's
        self.clear_share = clear_share
        self.s1_dropout = s1_dropout
        self._detected: dict[int, np.ndarray] = {}  # fixed kinds: index -> detected target probability
        # Fixed kinds detected in the worker: the detection done once for the run, set by
        # evaluation/fixed_protocol.fixed_samples; levels(index, count) -> (count,) uint8 touched levels.
        self.detected = None
        if kinds is not None:  # every (target, kind) pair once, in a seeded order
            pairs = len(self.targets) * len(kinds)
            self.pair_order = np.random.default_rng((seed, 11)).permutation(pairs)
        super().__init__(
            reader,
            length=length or len(self.targets) * len(kinds or (0,)),
            seed=seed,
            crop=crop,
            raw=raw,
            policy=policy,
            window_days=window_days,
        )

    def kinds_at(self, epoch: int) -> tuple[str, ...]:
        if self.kinds is not None:
            return self.kinds
        phase = cloudsim.curriculum_phase(epoch, self.epochs, mixed_from=self.mixed_from, all_from=self.all_from)
        return cloudsim.CURRICULUM[phase]

    def pick(self, index: int) -> tuple[int, int, list[int], int, str]:
        """What sample `index` shows: location, target time, input times, target slot, cloud kind."""
        rng, epoch = self._rng(index)
        return self._pick(rng, epoch, index)

    def _pick(self, rng: np.random.Generator, epoch: int, index: int) -> tuple[int, int, list[int], int, str]:
        if self.kinds is None:
            location, target_t = (int(v) for v in self.targets[int(rng.integers(len(self.targets)))])
        else:
            pair = int(self.pair_order[int(index) % len(self.pair_order)])
            location, target_t = (int(v) for v in self.targets[pair // len(self.kinds)])
        chosen = self.context(rng, self.usable[location], location, target_t, self.dates)
        dates, target_index = list(chosen.dates), chosen.slot
        if self.kinds is None:
            kind = str(rng.choice(self.kinds_at(epoch)))
            if self.clear_share and rng.random() < self.clear_share:
                kind = "clear"  # the target date as observed: a seen date is to be left alone
        else:
            kind = self.kinds[pair % len(self.kinds)]
        return location, target_t, dates, target_index, kind

    def _draw(self, index: int):
        """Sample `index`'s draws in the order they consume its generator (the cloud comes after)."""
        rng, epoch = self._rng(index)
        location, target_t, dates, target_index, kind = self._pick(rng, epoch, index)
        ys, xs = self._window(rng)
        return rng, (location, target_t, dates, target_index, kind), (ys, xs)

    def clouded_target(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Sample `index`'s clouded target (13, h, w) as __getitem__ makes it, and the pixels its
        cloud or shadow touches (h, w) bool: what s2cloudless is run on."""
        rng, (location, target_t, _, _, kind), (ys, xs) = self._draw(index)
        s2 = self.reader.read_raw(location, [target_t]).s2[0][:, ys, xs]  # (13, h, w) uint16
        opacity, shadow = cloudsim.simulate(rng, s2.shape[1:], kind)
        return cloudsim.apply(normalise_s2(s2), opacity, shadow, spectrum=self.spectrum), (opacity > 0) | (shadow > 0)

    def s1_valid(self, index: int, location: int, dates: list[int]) -> np.ndarray:
        """(T,) bool: which of sample `index`'s dates have S1, after s1_dropout."""
        valid = self.reader.valid_s1[location, dates]
        if self.s1_dropout:
            epoch, i = divmod(int(index), self.length)
            dropped = np.random.default_rng((self.seed, epoch, i, 51)).random(len(dates)) < self.s1_dropout
            valid = valid & ~dropped
        return valid

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        rng, (location, target_t, dates, target_index, kind), (ys, xs) = self._draw(index)
        images = self.reader.read_raw(location, dates)
        s2 = images.s2[:, :, ys, xs]  # (T, 13, h, w) uint16
        opacity, shadow = cloudsim.simulate(rng, s2.shape[2:], kind)
        s1_valid = self.s1_valid(index, location, dates)  # (T,)
        s1 = images.s1[:, :, ys, xs]
        if not s1_valid.all():  # S1 missing: the clip floor in dB, zeros once normalised
            s1 = np.where(s1_valid[:, None, None, None], s1, np.float32(S1_CLIP_DB[0]))
        prob = images.cloud_prob[:, ys, xs].copy()  # (T, h, w) uint8 as stored
        truth = normalise_s2(s2[target_index])
        clouded = cloudsim.apply(truth, opacity, shadow, spectrum=self.spectrum)  # (C, h, w)
        detected = self._detected.get(index)
        if self.supplied_mask:  # no detector: the simulated cloud as the store's kind of mask marks it
            touched = (opacity > 0) | (shadow > 0)
            detected = prob[target_index].copy()
            levels = np.round(cloudsim.simulated_probability(opacity, shadow) * CLOUD_PROB_SCALE).astype(np.uint8)
            detected[touched] = levels[touched]
        elif self.detect == "device":  # finish_batch detects on the clouded target
            detected = prob[target_index]
        elif detected is None:  # what prepare would store for the clouded target
            touched = (opacity > 0) | (shadow > 0)
            detected = prob[target_index].copy()  # untouched pixels: stored from the same values
            if self.detected is not None:  # detected once for the run (vcloud fixed-protocol)
                detected[touched] = self.detected.levels(index, int(touched.sum()))
            else:
                detected[touched] = detected_probability(clouded[:, touched][:, None])[0]  # (13, 1, M) -> (M,)
                if self.kinds is not None:  # fixed samples come back every epoch: detect once
                    self._detected[index] = detected
        prob[target_index] = detected
        days = _days(self.reader.date_s2[location, dates], target_index)
        if self.raw:  # the cloud is put on the target on the device too (finish_batch)
            item = {
                "s2_raw": _bits(s2),
                "s1_raw": torch.from_numpy(np.ascontiguousarray(s1)),
                "prob_raw": torch.from_numpy(np.ascontiguousarray(prob)),
                "cloud_opacity": torch.from_numpy(np.ascontiguousarray(opacity, dtype=np.float32)),
                "cloud_shadow": torch.from_numpy(np.ascontiguousarray(shadow, dtype=np.float32)),
                "days": days,
                "target_index": torch.tensor(target_index),
                "s1_valid": torch.from_numpy(s1_valid.copy()),
                "target_s1_valid": torch.tensor(bool(s1_valid[target_index])),
            }
            if self.detect == "device" and not self.supplied_mask:
                item["detect_target"] = torch.tensor(True)
            if self.reader.s2_bands != S2_BANDS:  # finish_batch puts the cloud on in these bands
                item["cloud_spectrum"] = torch.from_numpy(self.spectrum.copy())
        else:
            s2 = normalise_s2(s2)
            s2[target_index] = clouded
            item = stack_sample(
                s2,
                normalise_s1(s1),
                _probability(prob),
                self.reader.date_s2[location, dates],
                target_index,
                s1_valid=s1_valid,
            )
            item["target"] = torch.from_numpy(np.ascontiguousarray(truth))
        item["wind"] = torch.from_numpy(self.reader.wind[location, target_t])
        item["cloud_class"] = torch.tensor(CLOUD_CLASSES.index(kind))
        item["location"] = torch.tensor(location)
        item.update(context_record(target_t, dates, self.fallback(location, target_t)))
        return item

    def fallback(self, location: int, target_t: int) -> str | None:
        """Why sample dates of this target are not what the policy asks (None: they are)."""
        if self.policy == "random":
            others = np.flatnonzero(self.usable[location])
            return "repeated" if len(others[others != target_t]) < self.dates - 1 else None
        return self.context(None, self.usable[location], location, target_t, self.dates).fallback


class UnlabelledSamples(_StoreSamples):
    """Cloudy target dates of locations that have no clear date at all (stage 3)."""

    def __init__(
        self,
        store,
        *,
        dates: int,
        seed=0,
        clear_max_cover=CLEAR_MAX_COVER,
        limit: int | None = None,
        policy: str = "clearest",
        window_days: int = 30,
    ):
        reader = as_reader(store)
        usable = _usable(reader)
        left_out(reader, usable, sampler="unlabelled samples")
        cover = np.nan_to_num(reader.cloud_cover, nan=1.0)
        never_clear = ~(usable & (cover < clear_max_cover)).any(axis=1)  # (L,)
        candidates = np.argwhere(usable & never_clear[:, None])
        if limit is not None:
            candidates = candidates[:limit]
        self.candidates = candidates
        self.usable = usable
        self.dates = dates
        super().__init__(reader, length=len(candidates), seed=seed, crop=None, policy=policy, window_days=window_days)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        rng, _ = self._rng(index)
        location, target_t = (int(v) for v in self.candidates[int(index) % len(self.candidates)])
        chosen = self.context(rng, self.usable[location], location, target_t, self.dates)
        dates, target_index = list(chosen.dates), chosen.slot
        sample = self.reader.read(location, dates)
        prob = np.nan_to_num(sample.cloud_prob, nan=1.0)
        item = stack_sample(
            sample.s2, sample.s1, prob, self.reader.date_s2[location, dates], target_index, s1_valid=sample.valid_s1
        )
        item["wind"] = torch.from_numpy(self.reader.wind[location, target_t])
        item["visible"] = torch.from_numpy(prob[target_index] < S2CLOUDLESS_KWARGS["threshold"])
        item["location"] = torch.tensor(location)
        item.update(context_record(target_t, dates, chosen.fallback))
        return item


def detected_probability(s2: np.ndarray, *, num_threads: int = 1) -> np.ndarray:
    """Normalised S2 (13, H, W) -> its s2cloudless probability as a store holds it (uint8).

    The image is rounded to the stored reflectance (uint16 x10000) and the probability to the
    store's scale, so a clouded target looks to the model exactly like a naturally cloudy date.
    s2cloudless is per pixel, so a crop's probability is the crop of the image's, and the pixels
    of many images side by side (13, 1, M) give each pixel's own (whatever num_threads).
    """
    reflectance = np.round(np.clip(s2, 0.0, 1.0) * S2_SCALE).astype(np.uint16)
    prob = cloud_probability(reflectance[None], num_threads=num_threads)[0]  # (H, W) float 0..1
    return np.round(np.clip(prob, 0.0, 1.0) * CLOUD_PROB_SCALE).astype(np.uint8)


def context_record(target_t: int, dates: list[int], fallback: str | None) -> dict[str, torch.Tensor]:
    """What a sample records of its dates: the target's time index `date`, every input's `dates`
    (T,) and `fallback`, the index of the context policy's fallback in series.FALLBACKS (-1: none)."""
    return {
        "date": torch.tensor(int(target_t)),
        "dates": torch.tensor([int(d) for d in dates]),
        "fallback": torch.tensor(FALLBACKS.index(fallback) if fallback else -1),
    }


def stack_sample(s2, s1, prob, dates_s2, target_index, *, s1_valid) -> dict[str, torch.Tensor]:
    """Normalised images of T dates -> the model's layout. s1_valid (T,) bool: which dates have S1;
    S1 is zeroed where it is False, x's S1 validity channel says which (constants), and the item
    carries `s1_valid` and `target_s1_valid`."""
    s1_valid = np.asarray(s1_valid, dtype=bool)
    if not s1_valid.all():
        s1 = np.where(s1_valid[:, None, None, None], s1, np.float32(0.0))
    mask = np.broadcast_to(s1_valid[:, None, None, None], (len(s1_valid), 1, *prob.shape[1:]))
    x = np.concatenate([s2, s1, mask, prob[:, None]], axis=1).astype(np.float32)  # (T, 17, H, W)
    item = {
        "x": torch.from_numpy(np.ascontiguousarray(x)),
        "days": _days(dates_s2, target_index),
        "target_index": torch.tensor(target_index),
        "target_s1": torch.from_numpy(np.ascontiguousarray(s1[target_index])),
        "target_prob": torch.from_numpy(np.ascontiguousarray(prob[target_index])),
        "s1_valid": torch.from_numpy(s1_valid.copy()),  # (T,)
        "target_s1_valid": torch.tensor(bool(s1_valid[target_index])),
    }
    return item


def remove_s1(item: dict[str, torch.Tensor], absent: torch.Tensor) -> dict[str, torch.Tensor]:
    """One sample (either layout) with S1 removed from the dates `absent` (T,) bool: what the
    sampler gives where the store has no S1 at those dates (stack_sample, CloudySamples)."""
    absent = torch.as_tensor(absent, dtype=torch.bool)
    item = dict(item)
    valid = item["s1_valid"] & ~absent
    slot = int(item["target_index"])
    if "s1_raw" in item:  # the clip floor in dB, zeros once finish_batch normalises it
        item["s1_raw"] = torch.where(valid[:, None, None, None], item["s1_raw"], torch.tensor(S1_CLIP_DB[0]))
    else:
        x = item["x"].clone()
        x[~valid, S1_CHANNELS] = 0.0
        x[:, S1_VALID_CHANNEL] = valid[:, None, None].to(x.dtype)
        item["x"] = x
        item["target_s1"] = x[slot, S1_CHANNELS].clone()
    item["s1_valid"], item["target_s1_valid"] = valid, valid[slot].clone()
    return item


class WithoutS1(Dataset):
    """A dataset whose samples have no S1 at any date, marked as a store without S1 marks it
    (vcloud evaluate --without-s1: what a user without S1 gets)."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        item = self.dataset[index]
        return remove_s1(item, torch.ones_like(item["s1_valid"]))


def _days(dates_s2: np.ndarray, target_index: int) -> torch.Tensor:
    day = dates_s2.astype("datetime64[D]").astype(np.int64)
    return torch.from_numpy((day - day[target_index]).astype(np.float32))  # (T,) offsets from the target date


def _probability(prob: np.ndarray) -> np.ndarray:
    """Stored uint8 cloud probability -> float32 0..1; missing (255) counts as cloud (1.0)."""
    return np.where(prob == 255, np.float32(1.0), prob.astype(np.float32) / CLOUD_PROB_SCALE).astype(np.float32)


def _bits(s2: np.ndarray) -> torch.Tensor:
    """uint16 reflectance as int16 bits: torch 2.5 moves and stacks int16 everywhere."""
    return torch.from_numpy(np.ascontiguousarray(s2).view(np.int16))


def _reflectance(bits: torch.Tensor) -> torch.Tensor:
    """int16 bits -> S2 normalised as normalise_s2: clip 0..10000, /10000 (same float32 ops)."""
    s2 = bits.to(torch.int32).bitwise_and_(0xFFFF).to(torch.float32)
    low, high = S2_CLIP
    return s2.clamp_(low, high).div_(S2_SCALE)


def finish_batch(batch: dict) -> dict:
    """A `raw=True` batch -> the `raw=False` layout and values, on the batch's device.

    x (B, T, 17, H, W) = 13 S2 + 2 S1 + S1 validity + cloud probability; the target slot holds the clouded
    image (the cloud simulated in the worker, blended here) and the probability s2cloudless
    found on it (in the worker, or here for samples marked `detect_target`: CloudySamples(detect="device"));
    target = the clear image; target_s1 / target_prob are the target slot's S1 and
    probability. A batch already normalised (no raw keys) is returned as it is.
    """
    if "target_raw" in batch:
        rest = {k: v for k, v in batch.items() if k != "target_raw"}
        return {**rest, "target": _reflectance(batch["target_raw"])}
    if "s2_raw" not in batch:
        return batch
    low, high = S1_CLIP_DB
    s2 = _reflectance(batch["s2_raw"])  # (B, T, 13, H, W)
    s1 = batch["s1_raw"].to(torch.float32).clamp(low, high).sub_(low).div_(high - low).nan_to_num_(nan=0.0)
    assert "s1_valid" in batch, "a raw batch without s1_valid: the model could not be told which dates lack S1"
    s1_valid = batch["s1_valid"].to(s2.device)[:, :, None, None, None]  # (B, T, 1, 1, 1) bool
    s1 = s1.where(s1_valid, 0.0)
    rows = torch.arange(s2.shape[0], device=s2.device)
    slot = batch["target_index"].to(s2.device)
    truth = s2[rows, slot]  # (B, 13, H, W) the clear target, a copy
    opacity = batch["cloud_opacity"].to(s2.device)  # (B, H, W)
    shadow = batch["cloud_shadow"].to(s2.device)
    s2[rows, slot] = clouded = _apply_cloud(truth, opacity, shadow, batch.get("cloud_spectrum"))
    raw_prob = batch["prob_raw"].to(s2.device)  # (B, T, H, W) uint8
    if "detect_target" in batch:
        assert bool(batch["detect_target"].all()), "a batch mixes samples detected in the worker and here"
        raw_prob = raw_prob.clone()
        raw_prob[rows, slot] = _detect_target(raw_prob[rows, slot], clouded, opacity, shadow)
    prob = torch.where(raw_prob == 255, 1.0, raw_prob.to(torch.float32) / CLOUD_PROB_SCALE)  # (B, T, H, W)
    x = torch.cat([s2, s1, s1_valid.to(s2.dtype).expand(-1, -1, 1, *s2.shape[-2:]), prob[:, :, None]], dim=2)
    drop = ("s2_raw", "s1_raw", "prob_raw", "cloud_opacity", "cloud_shadow", "detect_target", "cloud_spectrum")
    rest = {k: v for k, v in batch.items() if k not in drop}
    return {**rest, "x": x, "target": truth, "target_s1": s1[rows, slot], "target_prob": prob[rows, slot]}


def _detect_target(stored, clouded, opacity, shadow) -> torch.Tensor:
    """The worker's detection (CloudySamples.__getitem__) on a batch: s2cloudless on the touched
    pixels of the clouded targets (B, 13, H, W), the stored uint8 probability (B, H, W) elsewhere."""
    touched = (opacity > 0) | (shadow > 0)  # (B, H, W)
    detected = stored.clone()
    detected[touched] = detected_levels(clouded.permute(0, 2, 3, 1)[touched])  # (M, 13) -> (M,)
    return detected


def _apply_cloud(s2: torch.Tensor, opacity: torch.Tensor, shadow: torch.Tensor, spectrum=None) -> torch.Tensor:
    """cloudsim.apply on a batch (B, C, H, W), the same float32 operations in the same order;
    spectrum (B, C): the samples' cloud spectra (None: the 13 L1C bands')."""
    if spectrum is None:
        spectrum = torch.from_numpy(cloudsim.CLOUD_SPECTRUM)[None]
    spectrum = spectrum.to(s2.device)[:, :, None, None]
    shade = 1.0 - 0.5 * shadow
    cloudy = s2 * ((1.0 - opacity) * shade)[:, None] + spectrum * opacity[:, None]
    return cloudy.clamp(0.0, 1.0)


class EpochConcat(Dataset):
    """Concatenation that keeps the epoch in the index each part sees (unlike ConcatDataset).

    A batch mixes parts, so every item carries the keys that every part's items carry (read once
    from each part's first item): a key only one part gives (e.g. `s1_valid` where another part
    picks its keys from a list that lacks it) is left out rather than failing the collation."""

    def __init__(self, parts: list[Dataset]):
        assert parts and all(len(p) for p in parts), "every part needs at least one sample"
        self.parts = parts
        self.offsets = np.cumsum([0] + [len(p) for p in parts])
        self._keys: set | None = None

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def _common_keys(self) -> set:
        if self._keys is None:
            self._keys = set.intersection(*(set(part[0]) for part in self.parts))
        return self._keys

    def __getitem__(self, index: int):
        epoch, i = divmod(int(index), len(self))
        part = int(np.searchsorted(self.offsets, i, side="right")) - 1
        local = i - int(self.offsets[part])
        item = self.parts[part][epoch * len(self.parts[part]) + local]
        if isinstance(item, dict):
            keys = self._common_keys()
            item = {k: v for k, v in item.items() if k in keys}
        return item


def crop_item(item: dict[str, torch.Tensor], rng: np.random.Generator, crop: int | None) -> dict:
    """The same random square window of every image-shaped tensor of a sample."""
    height, width = item["x"].shape[-2:]
    if crop is None or crop >= min(height, width):
        return item
    y, x = int(rng.integers(0, height - crop + 1)), int(rng.integers(0, width - crop + 1))
    return {
        k: v[..., y : y + crop, x : x + crop] if v.ndim >= 2 and v.shape[-2:] == (height, width) else v
        for k, v in item.items()
    }


class EpochSampler(Sampler[int]):
    """Global indices `epoch * n + i` for this rank's shard, from `start` (resume mid-epoch)."""

    def __init__(self, n: int, *, rank: int = 0, world_size: int = 1, shuffle: bool = True, seed: int = 0):
        self.n, self.rank, self.world_size = n, rank, world_size
        self.shuffle, self.seed = shuffle, seed
        self.epoch = 0
        self.start = 0
        self.per_rank = -(-n // world_size)  # ceil: every rank takes the same number of steps

    def set_epoch(self, epoch: int, *, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def __len__(self) -> int:
        return self.per_rank - self.start

    def __iter__(self):
        order = np.arange(self.n)
        if self.shuffle:
            order = np.random.default_rng((self.seed, self.epoch, 7)).permutation(self.n)
        padded = np.resize(order, self.per_rank * self.world_size)  # wrap to equal shards
        mine = padded[self.rank :: self.world_size]
        for i in mine[self.start :]:
            yield int(self.epoch * self.n + i)
