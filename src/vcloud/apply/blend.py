"""One output of a scene cut into overlapping patches: the patches' predictions blended back into one
image on the scene's own grid, written in windows (memory: a band of patches, not the scene).

Weights: each patch's prediction is weighted by a separable ramp that falls linearly toward each
side that has a neighbour, across the pixels it shares with that neighbour, from 1 to 0.5 / width
at the edge (never 0); a side on the scene's border keeps weight 1, so every pixel has weight > 0.
Two neighbours' ramps sum to 1 across their overlap (a linear cross-fade), the snapped last row
and column included. The prediction is sum(w * p) / sum(w), the uncertainty the same weighted
mean of the patches' spreads (a blend of spreads, not the spread of blended draws).

Masks and observations: each pixel is owned by one patch, the one whose window holds it farthest
from its sides (the cut at the middle of each overlap); the cloud mask, the stored probability and
the observed pixels there are that patch's. The stored probability and the observed pixels are the
same in every patch (the same pixels of the same files); the mask (s2cloudless's averaging and
dilation reach 4 px) is the whole scene's wherever the overlap is at least 8 px.

Writing: patches arrive row by row (apply/plan.py orders them so), so a patch row and a strip
(size + 16 rows of the scene's width) are all that is held. When a patch row begins, the
rows above it are final; they go, in whole strips of 16 rows, into a striped GeoTIFF beside the
output (`.NAME.tmp-PID`, removed by a rerun if killed). At the end rio-cogeo
turns each into the COG (cog_translate copies window by window and GDAL builds the overviews
from the file), renamed into place when whole (io.atomic_output).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vcloud.apply.geo import COG_PROFILE, block_size
from vcloud.constants import S2_SCALE
from vcloud.io import atomic_output, remove_path, temp_path

STRIP = 16  # rows per strip of the file the rows go to before the COG: each strip is written once, whole


def ramp(size: int, before: int, after: int) -> np.ndarray:
    """(size,) weights along one axis: falling toward the start over `before` px and toward the end
    over `after` px (the overlaps with the neighbours there; 0: none), to 0.5 / width at the edge."""
    w = np.ones(size, np.float32)
    steps = np.arange(size, dtype=np.float32) + 0.5
    if before:
        w = np.minimum(w, steps / before)
    if after:
        w = np.minimum(w, steps[::-1] / after)
    return w


def axis_plan(offsets: list[int], size: int, length: int) -> dict[int, tuple[int, int, int, int]]:
    """Per patch offset along one axis: (overlap before, overlap after, first and stop of the pixels
    it owns). A pixel is owned by the patch in whose window it lies farthest from the sides: the cut
    is at each overlap's middle."""
    offsets = sorted(offsets)
    cuts = [0] + [(a + size + b) // 2 for a, b in zip(offsets, offsets[1:])] + [length]
    plan = {}
    for k, start in enumerate(offsets):
        before = offsets[k - 1] + size - start if k else 0
        after = start + size - offsets[k + 1] if k + 1 < len(offsets) else 0
        plan[start] = (max(before, 0), max(after, 0), cuts[k], cuts[k + 1])
    return plan


@dataclass(frozen=True)
class SceneOut:
    """The grid and files of one blended output."""

    height: int
    width: int
    crs: str
    transform: tuple[float, ...]
    size: int  # the patch side
    windows: tuple[tuple[int, int], ...]  # (row, column) of every patch


class SceneBlender:
    """Accumulate one output's patches (row by row) and write its files; `finish` gives their paths."""

    def __init__(
        self, scene: SceneOut, files: dict[str, tuple[Path, int, str, list[str]]], tags: dict, *, keep_observed
    ):
        """files: kind -> (final path, band count, dtype, band descriptions); kinds "prediction",
        "cloud" and optionally "uncertainty". keep_observed: clear pixels keep the observation."""
        import rasterio
        from rasterio.transform import Affine

        self.scene, self.files, self.keep_observed = scene, files, keep_observed
        self.block = block_size(scene.height, scene.width)  # the COG's internal tiles
        rows = scene.size + STRIP  # a patch row and a strip: all that is not final when a patch row begins
        bands, width = files["prediction"][1], scene.width
        self.sum = np.zeros((bands, rows, width), np.float32)
        self.weight = np.zeros((rows, width), np.float32)
        self.spread = np.zeros((bands, rows, width), np.float32) if "uncertainty" in files else None
        self.observed = np.zeros((bands, rows, width), np.uint16)
        self.prob = np.zeros((rows, width), np.uint8)
        self.mask = np.zeros((rows, width), np.uint8)
        self.top = 0  # scene row of the buffers' first row
        self.rows = axis_plan(sorted({r for r, _ in scene.windows}), scene.size, scene.height)
        self.cols = axis_plan(sorted({c for _, c in scene.windows}), scene.size, scene.width)
        crs = rasterio.crs.CRS.from_user_input(scene.crs) if scene.crs else None
        self.stripes, self.datasets = {}, {}
        for kind, (path, count, dtype, descriptions) in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            stripe = temp_path(path.with_name(path.stem + ".stripes.tif"))
            dataset = rasterio.open(
                stripe,
                "w",
                driver="GTiff",
                height=scene.height,
                width=scene.width,
                count=count,
                dtype=dtype,
                crs=crs,
                transform=Affine.from_gdal(*scene.transform),
                blockysize=STRIP,
                compress="deflate",
                zlevel=1,
            )
            dataset.descriptions = tuple(descriptions)
            dataset.update_tags(**tags, CONTENT=kind)
            self.stripes[kind], self.datasets[kind] = stripe, dataset

    def add(self, window: tuple[int, int], mean, spread, observed, prob, mask) -> None:
        """One patch at window (row, column): mean, spread (13, s, s) float in 0..1 (spread may be
        None), observed (13, s, s) uint16, prob and mask (s, s) uint8."""
        row, col = window
        size = self.scene.size
        if row > self.top:
            self._flush(row // STRIP * STRIP)  # rows above this patch row are final: whole strips of them
        r = row - self.top
        assert r + size <= self.weight.shape[0], f"patch at row {row} arrived out of order (buffer at {self.top})"
        (up, down, r0, r1), (left, right, c0, c1) = self.rows[row], self.cols[col]
        w = np.outer(ramp(size, up, down), ramp(size, left, right))
        cols = slice(col, col + size)
        self.sum[:, r : r + size, cols] += w * mean
        self.weight[r : r + size, cols] += w
        if self.spread is not None:
            self.spread[:, r : r + size, cols] += w * spread
        own = (slice(r0 - row, r1 - row), slice(c0 - col, c1 - col))
        dest = (slice(r0 - self.top, r1 - self.top), slice(c0, c1))
        self.observed[(slice(None), *dest)] = observed[(slice(None), *own)]
        self.prob[dest] = prob[own]
        self.mask[dest] = mask[own]

    def _flush(self, until: int) -> None:
        """Write scene rows [top, until) and move the buffers up."""
        from rasterio.windows import Window

        n = until - self.top
        if n <= 0:
            return
        keep = self.mask[:n] == 0 if self.keep_observed else np.zeros((n, self.scene.width), bool)
        mean = self.sum[:, :n] / self.weight[:n]
        predicted = np.round(np.clip(mean, 0, 1) * S2_SCALE).astype(np.uint16)
        out = {
            "prediction": np.where(keep, self.observed[:, :n], predicted),
            "cloud": np.stack([self.mask[:n], self.prob[:n]]),
        }
        if self.spread is not None:
            spread = np.round(np.clip(self.spread[:, :n] / self.weight[:n], 0, 1) * S2_SCALE).astype(np.uint16)
            out["uncertainty"] = np.where(keep, np.uint16(0), spread)
        window = Window(0, self.top, self.scene.width, n)
        for kind, data in out.items():
            self.datasets[kind].write(data.astype(self.files[kind][2]), window=window)
        for buffer in (self.sum, self.weight, self.spread, self.observed, self.prob, self.mask):
            if buffer is not None:
                buffer[..., :-n, :] = buffer[..., n:, :].copy()
                buffer[..., -n:, :] = 0
        self.top = until

    def finish(self) -> dict[str, Path]:
        """Write the last rows, turn each file into its COG; kind -> final path."""
        from rio_cogeo.cogeo import cog_translate
        from rio_cogeo.profiles import cog_profiles

        self._flush(self.scene.height)
        for dataset in self.datasets.values():
            dataset.close()
        cog = cog_profiles.get(COG_PROFILE)
        cog.update(blockxsize=self.block, blockysize=self.block, predictor=2)
        done = {}
        for kind, (path, *_) in self.files.items():
            with atomic_output(path) as tmp, warnings.catch_warnings():
                warnings.filterwarnings("ignore", category=PendingDeprecationWarning, module="rio_cogeo")
                cog_translate(self.stripes[kind], tmp, cog, in_memory=False, quiet=True, overview_resampling="average")
            remove_path(self.stripes[kind])
            done[kind] = path
        return done

    def close(self) -> None:
        """Drop an unfinished output's files (an error mid-scene)."""
        for kind, dataset in self.datasets.items():
            if not dataset.closed:
                dataset.close()
            remove_path(self.stripes[kind])
