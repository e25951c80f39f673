"""What `vcloud predict` reconstructs: one Job per (location, target date), and its batches.

Target dates: every date with an S2 image whose cloud cover exceeds `min_cover` (default), or
the dates given (each must be a date of the store; it is reconstructed at every location that
has an S2 image on it). Inputs: the target plus T-1 other dates with an S2 image (with or
without S1, as the samplers count them: data/samples.py), chosen by the model's context policy
(data.context, data/series.py: by default the least cloudy within +-30 days, nearer first among
equals), exactly as in training and evaluation; the manifest records the dates and, where the
policy could not be met, its fallback. Where a
date (target or input) has no S1 its S1 is zeros (the missing-image value once normalised) and
the batch carries `s1_valid` (B, T) and `target_s1_valid` (B,), as evaluation's batches do; the
manifest says whether the target's S1 was present.

A scene cut into overlapping patches (data/scenes.py: a plain folder's image larger than a patch)
is one output per date: its patches are jobs of that output, planned together. A date is a target
when any patch's cover exceeds `min_cover`; the input dates are chosen once for the scene, by its
patches' mean cover, so every patch is made from the same dates (apply/blend.py blends them).

A batch is a fixed slice of the plan (the plan's order is the store's location order, then
time; a cut scene's: by date, then its patches row by row): a rerun forms the same batches, so
the noise of the diffusion draws and every float operation are the same and a redone output is
bit-identical to the first run's.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np
import torch

from vcloud.data.samples import stack_sample
from vcloud.data.series import choose_context
from vcloud.data.shards import ShardReader
from vcloud.data.store import CLOUD_PROB_SCALE, normalise_s1, normalise_s2
from vcloud.errors import BadInputError, ConfigError


@dataclass(frozen=True)
class Job:
    """One output: location `location` (store index) at time index `time`."""

    name: str  # <location>_<YYYY-MM-DD>: the output's file stem
    location: int
    location_id: str
    roi: str  # <ROIs folder>_<roi number>: the mosaic it belongs to
    time: int
    date: str  # YYYY-MM-DD
    inputs: tuple[int, ...]  # time indices in date order, the target among them
    slot: int  # the target's place in `inputs`
    cloud_cover: float
    s1_missing: bool
    scene: int = -1  # index into scenes(); -1: the location is its own output
    window: tuple[int, int] = (0, 0)  # (row, column) of the patch in its scene
    last: bool = True  # the last patch of its output
    fallback: str | None = None  # the context policy's fallback (data/series.py), None: the policy held

    def describe(self, reader: ShardReader) -> dict:
        """The manifest's record of what the output was made from."""
        dates = [date_text(reader.date_s2[self.location, t]) for t in self.inputs]
        record = {
            "location": self.location_id,
            "roi": self.roi,
            "date": self.date,
            "time_index": self.time,
            "cloud_cover": round(self.cloud_cover, 4),
            "input_dates": dates,
            "context_fallback": self.fallback,
            "s1": "missing: zeros (the store's missing-image value)" if self.s1_missing else "present",
        }
        if self.scene >= 0:
            record["patches"] = "blended: the scene's overlapping patches (apply/blend.py)"
        return record


@dataclass(frozen=True)
class Scene:
    """One output grid: a store location, or a plain folder's scene cut into patches."""

    name: str  # the outputs' stem before the date: the location id, or <ROIs>_<roi>_s<scene>
    roi: str
    crs: str
    transform: tuple[float, ...]  # GDAL geotransform of the whole scene
    height: int
    width: int
    locations: tuple[int, ...]  # its patches' store indices, row by row
    windows: tuple[tuple[int, int], ...]  # their (row, column) in the scene
    cut: bool  # blended from patches (False: one location, written as it is)


def scenes(reader: ShardReader, rois: list[str]) -> list[Scene]:
    """The store's output grids in store order: each location, or each cut scene's patches together."""
    geo = georefs(reader)
    size = reader.shape[2]
    if reader.window is None:
        return [
            Scene(reader.locations[i], rois[i], g.crs, g.transform, size, size, (i,), ((0, 0),), False)
            for i, g in enumerate(geo)
        ]
    groups: dict[tuple[str, int], list[int]] = {}
    for i in range(len(reader)):
        groups.setdefault((rois[i], int(reader.scene[i])), []).append(i)
    out = []
    for (roi, index), members in groups.items():
        members.sort(key=lambda i: (int(reader.window[i][0]), int(reader.window[i][1])))
        first = members[0]
        height, width = (int(v) for v in reader.scene_shape[first])
        out.append(
            Scene(
                name=f"{roi}_s{index}",
                roi=roi,
                crs=geo[first].crs,
                transform=tuple(float(v) for v in reader.scene_transform[first]),
                height=height,
                width=width,
                locations=tuple(members),
                windows=tuple((int(reader.window[i][0]), int(reader.window[i][1])) for i in members),
                cut=True,
            )
        )
    return out


@dataclass(frozen=True)
class Georef:
    crs: str  # "EPSG:32633"; "" when the raw files carried none
    transform: tuple[float, ...]  # GDAL geotransform (x0, pixel_w, 0, y0, 0, -pixel_h)


def date_text(value) -> str:
    return str(np.datetime_as_string(np.datetime64(value, "D"), unit="D"))


def georefs(reader: ShardReader) -> list[Georef]:
    """Each location's CRS and geotransform as the store keeps them."""
    if reader.crs is None or reader.transform is None:
        raise BadInputError(f"{reader.path}: no crs/transform tables (not a store `vcloud prepare` wrote)")
    return [Georef(str(c), tuple(float(v) for v in t)) for c, t in zip(reader.crs, reader.transform)]


def roi_names(reader: ShardReader) -> list[str]:
    if reader.roi_region is None or reader.roi_number is None:
        raise BadInputError(f"{reader.path}: no rois/roi tables (not a store `vcloud prepare` wrote)")
    return [f"{a}_{int(b)}" for a, b in zip(reader.roi_region, reader.roi_number)]


def parse_dates(texts: list[str]) -> list[str]:
    """--dates values, checked: YYYY-MM-DD each."""
    for text in texts:
        try:
            dt.date.fromisoformat(text)
        except ValueError:
            raise ConfigError(f"--dates {text}: not a date YYYY-MM-DD") from None
    return sorted(set(texts))


def plan_jobs(
    reader: ShardReader,
    *,
    rois: list[str],
    input_dates: int,
    min_cover: float,
    dates: list[str] | None = None,
    policy: str = "clearest",
    window_days: int = 30,
) -> list[Job]:
    """Every output to make, in store order; BadInputError naming a --dates value not in the store.

    Each output's input dates follow the model's context policy (data.context; data/series.py),
    on the scene's dates and its mean cloud cover: what the model was trained and scored on."""
    valid_s2 = reader.valid_s2  # targets and inputs alike: S2-only dates are data (S1 zeroed, s1_valid False)
    cover = np.nan_to_num(reader.cloud_cover, nan=1.0)
    stored = np.array(
        [[date_text(d) if ok else "" for d, ok in zip(row, oks)] for row, oks in zip(reader.date_s2, valid_s2)]
    )
    if dates is not None:
        missing = [d for d in dates if not (stored == d).any()]
        if missing:
            have = sorted(set(stored[stored != ""].tolist()))
            span = f"{len(have)} dates, {have[0]} to {have[-1]}" if have else "no S2 image"
            raise BadInputError(f"{reader.path}: date {missing[0]} not in the store ({span})")
        targets = valid_s2 & np.isin(stored, dates)
    else:
        targets = valid_s2 & (cover > min_cover)
    days = reader.date_s2.astype("datetime64[D]").astype(np.int64)
    jobs, names = [], set()
    for number, scene in enumerate(scenes(reader, rois)):
        locs = list(scene.locations)
        first = locs[0]
        valid = valid_s2[locs].all(axis=0)  # the patches of one scene share their dates
        scene_cover = cover[locs].mean(axis=0)
        wanted = targets[locs].any(axis=0) & valid
        for t in np.flatnonzero(wanted).tolist():
            chosen = choose_context(
                days[first], scene_cover, valid, t, input_dates, policy=policy, window_days=window_days
            )
            inputs = list(chosen.dates)
            name = f"{scene.name}_{stored[first, t]}"
            if name in names:  # two images of one location on one day: keep both, apart
                name = f"{name}_t{t}"
            names.add(name)
            for k, (location, window) in enumerate(zip(locs, scene.windows)):
                jobs.append(
                    Job(
                        name=name,
                        location=location,
                        location_id=scene.name,
                        roi=rois[location],
                        time=t,
                        date=stored[first, t],
                        inputs=tuple(inputs),
                        slot=chosen.slot,
                        fallback=chosen.fallback,
                        cloud_cover=float(np.mean(reader.cloud_cover[locs, t])),
                        s1_missing=not bool(reader.valid_s1[locs, t].all()),
                        scene=number if scene.cut else -1,
                        window=window,
                        last=k == len(locs) - 1,
                    )
                )
    return jobs


def batches(jobs: list[Job], size: int) -> list[list[Job]]:
    return [jobs[i : i + size] for i in range(0, len(jobs), size)]


@dataclass(frozen=True)
class Batch:
    tensors: dict[str, torch.Tensor]  # the model's input layout (data/samples.py stack_sample) + wind
    observed: np.ndarray  # (B, 13, H, W) uint16: each target date's S2 as stored
    cloud_prob: np.ndarray  # (B, H, W) uint8 as stored: round(p * 250), 255 where missing


def read_batch(reader: ShardReader, jobs: list[Job]) -> Batch:
    """The model's inputs for `jobs`, normalised as in evaluation (on the CPU)."""
    items, observed, probs = [], [], []
    for job in jobs:
        raw = reader.read_raw(job.location, job.inputs)
        prob = np.where(raw.cloud_prob == 255, np.float32(1.0), raw.cloud_prob.astype(np.float32) / CLOUD_PROB_SCALE)
        inputs = list(job.inputs)
        item = stack_sample(
            normalise_s2(raw.s2),
            normalise_s1(raw.s1),
            prob.astype(np.float32),
            reader.date_s2[job.location, inputs],
            job.slot,
            s1_valid=reader.valid_s1[job.location, inputs],
        )
        item["wind"] = torch.from_numpy(reader.wind[job.location, job.time])
        items.append(item)
        observed.append(raw.s2[job.slot])
        probs.append(raw.cloud_prob[job.slot])
    tensors = {key: torch.stack([item[key] for item in items]) for key in items[0]}
    return Batch(tensors, np.stack(observed), np.stack(probs))
