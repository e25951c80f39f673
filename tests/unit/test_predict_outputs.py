"""`vcloud predict` on a tiny prepared store, read back with rasterio (GDAL) and rio-cogeo."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.unit.predict_fixtures import predict_args, tiny_checkpoints

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors on a shared machine

CLEAR_DATE, CLOUDY_DATE = "2018-01-25", "2018-05-17"  # the tiny store's p0 is clear on the first


@pytest.fixture(scope="module")
def predicted(tiny_store, tmp_path_factory):
    from vcloud.cli import main

    work = tmp_path_factory.mktemp("predict")
    ckpt = tiny_checkpoints(work / "ckpt")
    out = work / "out"
    assert main(predict_args(tiny_store, out, ckpt, "--dates", CLEAR_DATE, CLOUDY_DATE, "--draws", "3")) == 0
    return out, json.loads((out / "manifest.json").read_text())


def _raw_s2(raw: Path, location: str, date: str) -> Path:
    rois, roi, patch = location.split("_")
    (path,) = raw.glob(f"{rois}/{roi}/S2/*/s2_{rois}_{roi}_ImgNo_*_{date}_patch_{patch[1:]}.tif")
    return path


def test_outputs_keep_the_raw_georeferencing_and_are_valid_cogs(predicted, tiny_raw_master):
    import rasterio
    from rio_cogeo.cogeo import cog_validate

    from vcloud.data.geotiff import read_image

    out, manifest = predicted
    outputs = manifest["outputs"]
    assert len(outputs) == 4 and all(o["status"] == "done" for o in outputs.values())  # 2 locations x 2 dates
    for name, entry in outputs.items():
        assert name == f"{entry['location']}_{entry['date']}"
        _, georef = read_image(
            _raw_s2(tiny_raw_master, entry["location"], entry["date"]), bands=13, size=32, dtype=np.uint16
        )
        assert set(entry["files"]) == {"prediction", "cloud", "uncertainty"}
        for record in entry["files"].values():
            path = out / record["path"]
            valid, errors, _ = cog_validate(str(path), quiet=True)
            assert valid, (path, errors)
            with rasterio.open(path) as src:
                assert src.crs.to_epsg() == georef.epsg
                assert src.transform.to_gdal() == pytest.approx(georef.transform, abs=0)
                assert src.overviews(1), "no overviews"
        with rasterio.open(out / entry["files"]["prediction"]["path"]) as src:
            assert src.count == 13 and src.dtypes[0] == "uint16" and src.descriptions[0] == "B1"


def test_clear_pixels_come_back_as_observed(predicted, tiny_raw_master):
    """Default --clear-pixels observed: where the cloud mask says clear, the input's exact bytes
    (tolerance 0); the model's values only under the mask."""
    import rasterio

    from vcloud.data.geotiff import read_image

    out, manifest = predicted
    entry = manifest["outputs"][f"ROIs1868_119_p0_{CLEAR_DATE}"]
    assert entry["cloud_cover"] < 0.05
    raw, _ = read_image(_raw_s2(tiny_raw_master, entry["location"], CLEAR_DATE), bands=13, size=32, dtype=np.uint16)
    with rasterio.open(out / entry["files"]["prediction"]["path"]) as src:
        predicted_s2 = src.read()
    with rasterio.open(out / entry["files"]["cloud"]["path"]) as src:
        mask = src.read(1)
    with rasterio.open(out / entry["files"]["uncertainty"]["path"]) as src:
        spread = src.read()
    clear = mask == 0
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(predicted_s2[:, clear], raw[:, clear])
    assert not spread[:, clear].any()  # an observed pixel has no draw spread
    cloudy = manifest["outputs"][f"ROIs1868_119_p1_{CLOUDY_DATE}"]
    with rasterio.open(out / cloudy["files"]["cloud"]["path"]) as src:
        masked = src.read(1) == 1
    with rasterio.open(out / cloudy["files"]["uncertainty"]["path"]) as src:
        assert masked.any() and src.read()[:, masked].any()  # the draws differ under the cloud


def test_mosaic_places_every_location_at_its_stored_transform(predicted):
    import rasterio

    out, manifest = predicted
    mosaic = manifest["mosaics"][f"ROIs1868_119_{CLOUDY_DATE}"]
    assert mosaic["status"] == "done" and sorted(mosaic["locations"]) == ["ROIs1868_119_p0", "ROIs1868_119_p1"]
    with rasterio.open(out / mosaic["path"]) as vrt:
        whole = vrt.read()
        for location in mosaic["locations"]:
            with rasterio.open(out / f"{location}_{CLOUDY_DATE}.tif") as tile:
                window = rasterio.windows.from_bounds(*tile.bounds, transform=vrt.transform)
                rows, cols = window.toslices()
                np.testing.assert_array_equal(whole[:, rows, cols], tile.read())
                assert vrt.crs == tile.crs
        assert vrt.count == 13


def test_manifest_records_provenance_and_checksums(predicted):
    from vcloud.apply.geo import sha256_file

    out, manifest = predicted
    assert manifest["complete"] and manifest["producer"]["git_revision"]
    assert manifest["command"].startswith("vcloud predict --stage 2 --store ")  # the command as given
    assert manifest["command"].endswith(f" --dates {CLEAR_DATE} {CLOUDY_DATE} --draws 3")
    assert set(manifest["checkpoints"]) == {"1", "2"} and all(
        len(c["sha256"]) == 64 for c in manifest["checkpoints"].values()
    )
    assert manifest["uncertainty"].startswith("per-pixel std of 3 draws")
    for entry in manifest["outputs"].values():
        for record in entry["files"].values():
            assert sha256_file(out / record["path"]) == record["sha256"]


def test_default_dates_are_the_cloudy_ones_with_the_clearest_dates_of_the_window_as_inputs(tiny_store):
    from vcloud.apply.plan import plan_jobs, roi_names
    from vcloud.data.series import COVER_STEP
    from vcloud.data.shards import ShardReader

    reader = ShardReader(tiny_store)
    jobs = plan_jobs(reader, rois=roi_names(reader), input_dates=3, min_cover=0.05, window_days=60)
    cover = np.nan_to_num(reader.cloud_cover, nan=1.0)
    days = reader.date_s2.astype("datetime64[D]").astype(np.int64)
    assert {(j.location, j.time) for j in jobs} == {tuple(x) for x in np.argwhere(reader.valid_s2 & (cover > 0.05))}
    for job in jobs:
        assert len(job.inputs) == 3 and job.inputs[job.slot] == job.time and list(job.inputs) == sorted(job.inputs)
        others = [t for t in job.inputs if t != job.time]
        usable = [t for t in np.flatnonzero(reader.valid_s2[job.location]) if t != job.time]  # S1 or not
        near = [t for t in usable if abs(days[job.location, t] - days[job.location, job.time]) <= 60]
        if job.fallback is None:  # the least cloudy dates of the +-60-day window, in cover steps
            assert set(others) <= set(near)
            step = np.floor(cover[job.location] / COVER_STEP)
            rest = [t for t in near if t not in others]
            assert not rest or max(step[others]) <= min(step[rest])
        else:  # the window held fewer than 2 other dates: every one of them is taken
            assert job.fallback in ("beyond_window", "repeated") and set(near) <= set(others)
