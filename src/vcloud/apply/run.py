"""`vcloud predict`: a trained stage applied to a prepared store, one georeferenced COG per
(location, reconstructed date), resumable.

Outputs under `out` (names from apply/plan.py, files from apply/geo.py):

    <location>_<YYYY-MM-DD>.tif              13 bands (B1..B12, S2 order), uint16 reflectance x 10000
    <location>_<YYYY-MM-DD>_cloud.tif        band 1: the cloud mask used (1 cloud), band 2: the cloud
                                             probability as stored (x 250; 255: no S2 probability)
    <location>_<YYYY-MM-DD>_uncertainty.tif  13 bands, uint16 x 10000: per-pixel std of the draws
                                             (stages 2-3 with --draws >= 2; none otherwise)
    mosaics/<ROIs>_<roi>_<YYYY-MM-DD>.vrt    the ROI's locations of that date in one grid
    manifest.json                            provenance, request, per output status, files, SHA-256
                                             (manifest.partial.json while the run is not complete)

Every file keeps the CRS and geotransform the store recorded for its location. With
`clear_pixels="observed"` (default) pixels the cloud mask calls clear keep their observed
reflectance (exactly the input's) and only masked pixels take the model's; "model" writes the
model's prediction everywhere.

Everything that can be wrong with the inputs (store, config, checkpoints, wind cache, dates)
is checked before the first file is written; a rerun of the same command skips the outputs the
manifest records as done with intact files (apply/manifest.py) and makes the rest, bit-identical
to an uninterrupted run (apply/plan.py: fixed batches).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch

from vcloud.apply.blend import SceneBlender, SceneOut
from vcloud.apply.geo import sha256_file, write_cog, write_vrt
from vcloud.apply.manifest import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    file_record,
    is_finished,
    read_manifest,
    request_id,
    write_manifest,
)
from vcloud.apply.plan import batches, parse_dates, plan_jobs, read_batch, roi_names, scenes
from vcloud.bands import model_bands
from vcloud.constants import CLEAR_MAX_COVER, S2_SCALE, S2CLOUDLESS_KWARGS
from vcloud.data.masks import store_mask_source
from vcloud.data.shards import ShardReader
from vcloud.data.store import CLOUD_PROB_SCALE, check_bands
from vcloud.errors import BadInputError, ConfigError
from vcloud.io import provenance, remove_leftover_temps

log = logging.getLogger(__name__)

PREDICT_STAGES = (1, 2, 3)  # stage 0 (the autoencoder) reconstructs a clear image, it removes no cloud
CLEAR_PIXELS = ("observed", "model")
MOSAICS = "mosaics"


def checksum(path: Path, what: str) -> str:
    """SHA-256 of an input file; one line naming it when it is missing or unreadable."""
    if not Path(path).is_file():
        raise BadInputError(f"{path}: {what} not found")
    try:
        return sha256_file(path)
    except OSError as err:
        raise BadInputError(f"{path}: {what} not readable ({err.strerror or err})") from None


def predict(
    *,
    store: Path,
    out: Path,
    stage: int,
    checkpoints: dict[int, Path],
    config_path: Path,
    wind_cache: Path | None = None,
    dates: list[str] | None = None,
    min_cover: float = CLEAR_MAX_COVER,
    draws: int | None = None,
    batch_size: int = 8,
    device: str | None = None,
    clear_pixels: str = "observed",
    command: str = "vcloud predict",
    timings: dict | None = None,
    bundle: dict | None = None,
) -> dict:
    """Reconstruct the planned dates of `store` with stage `stage` into `out`; returns the manifest.
    `timings` (bench): filled with seconds spent reading, in the model and writing. `bundle`: the
    {path, sha256} of the bundle the config and checkpoints came from (recorded, not part of the
    request: a bundle's members give the same outputs as the same files given one by one)."""
    from vcloud.config import load_model_config
    from vcloud.config.model_sets import config_to_dict
    from vcloud.evaluation.predict import build_predictor
    from vcloud.registry import get_stage, require_checkpoints
    from vcloud.wind.stage_orders import load_wind_orders

    store, out = Path(store), Path(out)
    label = f"vcloud predict --stage {stage}"
    if stage not in PREDICT_STAGES:
        raise ConfigError(f"--stage {stage}: stage 0 (the autoencoder) removes no cloud; predict with stage 1, 2 or 3")
    if batch_size < 1 or (draws is not None and draws < 1):
        raise ConfigError("--batch-size and --draws must be at least 1")
    if clear_pixels not in CLEAR_PIXELS:
        raise ConfigError(f"--clear-pixels {clear_pixels}: expected one of {', '.join(CLEAR_PIXELS)}")
    # Every input checked before anything is written.
    reader = ShardReader(store)  # opened once, handed down: the plan, the georeferencing, the wind check
    rois = roi_names(reader)
    grids = scenes(reader, rois)  # the output grids: locations, or cut scenes (apply/blend.py)
    cfg = load_model_config(config_path)
    bands = model_bands(cfg)
    check_bands(store, bands, model=f"the model of {config_path}", have=reader.s2_bands)
    needed = require_checkpoints(get_stage(stage).predictor_needs, checkpoints, command=label)
    weights = {str(n): checksum(Path(p), "checkpoint") for n, p in needed.items()}
    wind = None
    if get_stage(stage).reads_wind:
        wind = load_wind_orders(cfg, store=reader, wind_cache=wind_cache, world_size=1, command=label)
    wind_sha = checksum(Path(wind_cache), "wind cache") if wind is not None and wind_cache is not None else None
    wanted = parse_dates(dates) if dates else None
    jobs = plan_jobs(
        reader,
        rois=rois,
        input_dates=cfg.data.input_dates,
        min_cover=min_cover,
        dates=wanted,
        **cfg.data.context.sampler_kwargs(),
    )
    predictor = build_predictor(stage, cfg, needed, wind)  # another stage's checkpoint: one line
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    predictor.model.to(dev)
    sampled = hasattr(predictor, "draws")
    n_draws = (draws or cfg.stage2.model.ensemble) if sampled else None
    with_spread = sampled and n_draws >= 2

    config_text = json.dumps(config_to_dict(cfg), sort_keys=True, default=str)
    request = {
        "stage": stage,
        "weights_sha256": weights,
        "config_sha256": hashlib.sha256(config_text.encode()).hexdigest(),
        "wind_cache_sha256": wind_sha,
        "store_metadata_sha256": checksum(store / "zarr.json", "prepared store"),
        "dates": wanted,
        "min_cover": None if wanted else min_cover,
        "input_dates": cfg.data.input_dates,
        "draws": n_draws,
        "batch_size": batch_size,
        "clear_pixels": clear_pixels,
        "device": dev.type,
    }
    rid = request_id(request)
    previous = read_manifest(out).get("outputs", {}) if out.is_dir() else {}
    outputs = {job.name: job for job in jobs}  # a cut scene's patches: one output, described by its first
    finished = {
        name
        for name, job in outputs.items()
        if is_finished(previous.get(name), out, rid, made_from=job.describe(reader))
    }
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "producer": provenance(),
        "command": command,
        "store": str(store),
        "bundle": bundle,
        "config": str(config_path),
        "checkpoints": {str(n): {"path": str(p), "sha256": weights[str(n)]} for n, p in needed.items()},
        "wind_cache": None if wind_sha is None else {"path": str(wind_cache), "sha256": wind_sha},
        "request": request,
        "request_id": rid,
        "bands": list(bands),
        "scale": f"uint16 reflectance x {S2_SCALE:g} ({reader.s2_level}, as the input)",
        "clear_pixels": clear_pixels,
        "cloud_mask": _mask_description(reader.cloud_mask),
        "uncertainty": (
            f"per-pixel std of {n_draws} draws (x {S2_SCALE:g}), 0 where the observation is kept"
            if with_spread
            else f"none: {_no_spread(sampled, n_draws)}"
        ),
        "outputs": {
            name: previous[name] if name in finished else {**job.describe(reader), "status": "pending"}
            for name, job in outputs.items()
        },
        "mosaics": {},
        "complete": False,
    }
    log.info("%d outputs planned on %s, %d already done (request %s)", len(outputs), store, len(finished), rid)
    if out.is_dir():
        remove_leftover_temps(out)
        if (out / MOSAICS).is_dir():
            remove_leftover_temps(out / MOSAICS)
        if (out / MANIFEST).exists():
            # An earlier finished run's manifest must not go on claiming a complete run over files
            # this one is about to change: the partial manifest (what is done, what is pending)
            # takes its place before any output is written, and the final one comes at the end.
            write_manifest(out, manifest)
            (out / MANIFEST).unlink()
    times = timings if timings is not None else {}
    times.update(read=0.0, model=0.0, write=0.0, outputs=0)
    from tqdm import tqdm

    descriptions = {
        "prediction": list(bands),
        "uncertainty": [f"{b} std" for b in bands],
        "cloud": ["cloud mask (1: cloud)", f"cloud probability x {CLOUD_PROB_SCALE} (255: none)"],
    }
    blenders: dict[str, SceneBlender] = {}  # a cut scene's outputs in the making (one, two at a batch's seam)

    def blender_of(job) -> SceneBlender:
        if job.name not in blenders:
            scene = grids[job.scene]
            kinds = ("prediction", "cloud", "uncertainty") if with_spread else ("prediction", "cloud")
            counts = {
                "prediction": (len(bands), "uint16"),
                "cloud": (2, "uint8"),
                "uncertainty": (len(bands), "uint16"),
            }
            files = {kind: (out / _file_name(job.name, kind), *counts[kind], descriptions[kind]) for kind in kinds}
            grid = SceneOut(scene.height, scene.width, scene.crs, scene.transform, reader.shape[2], scene.windows)
            blenders[job.name] = SceneBlender(
                grid, files, _tags(stage, job, rid, clear_pixels), keep_observed=clear_pixels == "observed"
            )
        return blenders[job.name]

    try:
        for group in tqdm(batches(jobs, batch_size), unit="batch", disable=None):
            if all(job.name in finished for job in group):
                continue
            start = time.perf_counter()
            batch = read_batch(reader, group)
            tensors = {key: value.to(dev) for key, value in batch.tensors.items()}
            times["read"] += time.perf_counter() - start
            start = time.perf_counter()
            with torch.no_grad():
                if sampled:
                    samples = predictor.draws(tensors, n_draws).float()  # (N, B, 13, H, W)
                    mean = samples.mean(0)
                    spread = samples.std(0, unbiased=False).cpu().numpy() if with_spread else None
                else:
                    mean, spread = predictor(tensors).float(), None
                mean = mean.clamp(0, 1).cpu().numpy()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            times["model"] += time.perf_counter() - start
            start = time.perf_counter()
            masks = _cloud_masks(batch.cloud_prob, store_mask_source(reader.cloud_mask))  # (B, H, W) uint8
            for i, job in enumerate(group):
                if job.name in finished:
                    continue
                images = (
                    mean[i],
                    None if spread is None else spread[i],
                    batch.observed[i],
                    batch.cloud_prob[i],
                    masks[i],
                )
                if job.scene >= 0:  # a patch of a cut scene: blended, written when its last patch is in
                    blender_of(job).add(job.window, *images)
                    if not job.last:
                        continue
                    paths = blenders.pop(job.name).finish()
                    records = {kind: file_record(out, path) for kind, path in paths.items()}
                else:
                    georef = grids[job.location]
                    records = _write_location(out, job, images, georef, descriptions, rid, stage, clear_pixels)
                manifest["outputs"][job.name] = {
                    **job.describe(reader),
                    "status": "done",
                    "request_id": rid,
                    "files": records,
                }
                times["outputs"] += 1
            write_manifest(out, manifest)  # after the batch's files: it never names an incomplete file
            times["write"] += time.perf_counter() - start
    finally:
        for unfinished in blenders.values():
            unfinished.close()
    geo = {job.name: grids[job.scene] if job.scene >= 0 else grids[job.location] for job in jobs}
    manifest["mosaics"] = write_mosaics(out, jobs, geo, descriptions["prediction"])
    manifest["complete"] = True
    write_manifest(out, manifest, final=True)
    made = times["outputs"]
    log.info(
        "%s: %d outputs made, %d kept from an earlier run, %d mosaics",
        out,
        made,
        len(finished),
        len(manifest["mosaics"]),
    )
    return manifest


def _file_name(name: str, kind: str) -> str:
    return f"{name}.tif" if kind == "prediction" else f"{name}_{kind}.tif"


def _tags(stage: int, job, rid: str, clear_pixels: str) -> dict[str, str]:
    return {
        "VCLOUD_STAGE": str(stage),
        "DATE": job.date,
        "LOCATION": job.location_id,
        "REQUEST_ID": rid,
        "CLEAR_PIXELS": clear_pixels,
        "SCALE": str(S2_SCALE),
    }


def _write_location(out: Path, job, images: tuple, georef, descriptions, rid: str, stage: int, clear_pixels: str):
    """The output of a location that is its own scene (a patch of the store's size), written whole.
    images: its mean and spread (or None) in 0..1, observed S2, stored probability and mask."""
    mean, spread, observed, prob, mask = images
    keep = mask == 0 if clear_pixels == "observed" else np.zeros(mask.shape, bool)
    predicted = np.round(mean * S2_SCALE).astype(np.uint16)
    predicted = np.where(keep[None], observed, predicted)
    files = {
        "prediction": (predicted, "uint16"),
        "cloud": (np.stack([mask, prob]), "uint8"),
    }
    if spread is not None:
        uncertainty = np.round(np.clip(spread, 0, 1) * S2_SCALE).astype(np.uint16)
        files["uncertainty"] = (np.where(keep[None], np.uint16(0), uncertainty), "uint16")
    tags = _tags(stage, job, rid, clear_pixels)
    records = {}
    for kind, (data, dtype) in files.items():
        path = out / _file_name(job.name, kind)
        write_cog(
            path,
            data.astype(dtype),
            crs=georef.crs,
            transform=georef.transform,
            descriptions=descriptions[kind],
            tags={**tags, "CONTENT": kind},
        )
        records[kind] = file_record(out, path)
    return records


def _no_spread(sampled: bool, draws: int | None) -> str:
    return "1 draw (pass --draws N >= 2)" if sampled else "this stage's prediction is deterministic (no draws)"


def _cloud_masks(prob: np.ndarray, source: str) -> np.ndarray:
    """(B, H, W) stored probability -> the store's pixel mask (uint8, 1 = cloud); no probability = cloud.

    s2cloudless's probability takes its post-processing, as prepare applied it; a mask that came
    with the data (SCL/, MASK/) is used as stored.
    """
    from vcloud.data.clouds import cloud_mask
    from vcloud.data.masks import supplied_mask

    p = np.where(prob == 255, np.float32(1.0), prob.astype(np.float32) / CLOUD_PROB_SCALE)
    return cloud_mask(p).astype(np.uint8) if source == "s2cloudless" else supplied_mask(p)


def _mask_description(recorded: dict) -> str:
    """The manifest's `cloud_mask`: which mask decided what is cloud, from the store's record."""
    if store_mask_source(recorded) == "s2cloudless":
        return (
            f"s2cloudless mask of the stored probability (threshold {S2CLOUDLESS_KWARGS['threshold']}, "
            f"average_over {S2CLOUDLESS_KWARGS['average_over']}, dilation {S2CLOUDLESS_KWARGS['dilation_size']})"
        )
    return f"{recorded['source'].upper()} mask that came with the data: {recorded['pixel_mask']}"


def write_mosaics(out: Path, jobs: list, geo: dict, descriptions: list[str]) -> dict:
    """One VRT per (ROI, date) over its outputs (locations or scenes); unchanged files are not rewritten.
    geo: output name -> its grid (crs, transform)."""
    groups: dict[str, dict] = {}
    for job in jobs:  # a cut scene's patches are one output
        groups.setdefault(f"{job.roi}_{job.date}", {}).setdefault(job.name, job)
    mosaics = {}
    for name, outputs in groups.items():
        tiles, group = [], list(outputs.values())
        for job in group:
            g = geo[job.name]
            tiles.append({"path": out / f"{job.name}.tif", "crs": g.crs, "transform": g.transform})
        import rasterio

        for tile in tiles:
            with rasterio.open(tile["path"]) as src:
                tile["height"], tile["width"] = src.height, src.width
        path = out / MOSAICS / f"{name}.vrt"
        why_not = write_vrt(path, tiles, descriptions=descriptions)
        if why_not:
            mosaics[name] = {"status": "not made", "reason": why_not}
            continue
        mosaics[name] = {"status": "done", **file_record(out, path), "locations": [job.location_id for job in group]}
    return mosaics
