"""Scenes of any extent (issue #35, outcome 4): `vcloud prepare` cuts a plain folder's scene into
overlapping patches, `vcloud predict` blends them back into one COG per date on the scene's grid."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.predict_fixtures import tiny_checkpoints
from tests.unit.scene_fixtures import prepare_args, write_scene

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors on a shared machine


def test_patch_grid_covers_the_scene_with_the_last_patch_snapped():
    from vcloud.data.scenes import patch_windows, starts

    assert starts(70, 32, 16) == [0, 16, 32, 38]  # the last one snapped to 70 - 32
    assert starts(100, 32, 8) == [0, 24, 48, 68]
    assert starts(32, 32, 16) == [0]
    windows = patch_windows(70, 100, 32, 8)
    assert windows[:4] == [(0, 0), (0, 24), (0, 48), (0, 68)] and windows[-1] == (38, 68)
    covered = np.zeros((70, 100), int)
    for r, c in windows:
        covered[r : r + 32, c : c + 32] += 1
    assert covered.min() >= 1


def test_blend_weights_sum_to_one_across_overlaps_and_never_reach_zero():
    from vcloud.apply.blend import axis_plan, ramp

    plan = axis_plan([0, 16, 32, 38], 32, 70)
    assert plan[0] == (0, 16, 0, 24) and plan[38] == (26, 0, 51, 70)  # overlaps before/after, owned rows
    assert [b - a for *_, a, b in plan.values()] == [24, 16, 11, 19]  # every row owned once
    for before, after, _, _ in plan.values():
        assert ramp(32, before, after).min() > 0
    # Two neighbours' ramps span exactly their shared rows and sum to 1 there: a cross-fade. The
    # scene's own first and last rows keep the full weight.
    for starts, length in (([0, 16], 48), ([0, 24, 48, 68], 100)):
        total = np.zeros(length)
        for start, (before, after, _, _) in axis_plan(starts, 32, length).items():
            total[start : start + 32] += ramp(32, before, after)
        np.testing.assert_allclose(total, 1.0, atol=1e-6)
    assert ramp(32, 0, 0).tolist() == [1.0] * 32
    np.testing.assert_allclose(ramp(32, 8, 0)[:8], (np.arange(8) + 0.5) / 8)


@pytest.fixture(scope="module")
def scene_store(tmp_path_factory):
    """A 48 x 72 px scene (not a multiple of 32) of three dates, prepared in 32 px patches."""
    from vcloud.cli import main

    root = tmp_path_factory.mktemp("extent")
    raw = write_scene(root / "mine", 48, 72)
    store = root / "mine.zarr"
    assert main(prepare_args(raw, store)) == 0
    return raw, store


def test_prepare_stores_each_patch_with_its_window(scene_store):
    import rasterio

    from vcloud.data.shards import ShardReader

    raw, store = scene_store
    reader = ShardReader(store)
    windows = [tuple(int(v) for v in w) for w in reader.window]
    assert windows == [(r, c, 32, 32) for r in (0, 16) for c in (0, 16, 32, 40)]  # overlap 16 (default at 32 px)
    assert (reader.scene_shape == [48, 72]).all() and set(reader.scene.tolist()) == {0}
    with rasterio.open(raw / "S2" / "T33_20190311.tif") as src:
        scene = src.read()
        assert tuple(reader.scene_transform[0]) == src.transform.to_gdal()
    for location, (r, c, h, w) in enumerate(windows):
        np.testing.assert_array_equal(reader.read_raw(location, [1]).s2[0], scene[:, r : r + h, c : c + w])
        x0, pw, _, y0, _, ph = reader.transform[location]
        assert (x0, y0) == (500000.0 + 10 * c, 5000000.0 - 10 * r)


def test_predict_writes_one_cog_per_date_on_the_scenes_grid(scene_store, tmp_path):
    import rasterio
    from rio_cogeo.cogeo import cog_validate

    from vcloud.cli import main

    raw, store = scene_store
    ckpt = tiny_checkpoints(tmp_path / "ckpt")
    out = tmp_path / "out"
    args = ["predict", "--stage", "1", "--store", str(store), "--out", str(out), "--stage1", str(ckpt[1])]
    assert main([*args, "--config", str(ckpt["config"]), "--device", "cpu", "--min-cover", "-1"]) == 0
    made = sorted(p.name for p in out.glob("*.tif"))
    dates = ("2019-03-01", "2019-03-11", "2019-03-21")
    assert made == sorted(f"ROIs9000_1_s0_{d}{kind}.tif" for d in dates for kind in ("", "_cloud"))
    for date, source in zip(dates, sorted((raw / "S2").iterdir())):
        with rasterio.open(out / f"ROIs9000_1_s0_{date}.tif") as cog, rasterio.open(source) as src:
            assert (cog.crs, cog.transform, cog.shape, cog.count) == (src.crs, src.transform, (48, 72), 13)
            predicted, observed = cog.read(), src.read()
        with rasterio.open(out / f"ROIs9000_1_s0_{date}_cloud.tif") as cloud:
            mask = cloud.read(1)
        assert cog_validate(out / f"ROIs9000_1_s0_{date}.tif")[0]
        clear = mask == 0  # the observation kept, byte for byte; the model's values under the cloud
        np.testing.assert_array_equal(predicted[:, clear], observed[:, clear])
        assert (~clear).any() == (date == "2019-03-11")  # the date with a cloud
        if date == "2019-03-11":
            assert (predicted[:, ~clear] != observed[:, ~clear]).any()
    manifest = (out / "manifest.json").read_text()
    assert '"complete": true' in manifest and "blended" in manifest


class EdgeErrorPredictor:
    """An identity-like model with the patch-edge error docs/patch-edges.md measured before its fix:
    the target's own S2 + 200 DN, 400 DN (twice the interior's) in the outer 4 rows and columns."""

    def __init__(self):
        import torch

        self.model = torch.nn.Identity()

    def __call__(self, batch):
        import torch

        x = batch["x"]  # (B, T, C, H, W), S2 first, 0..1
        s2 = x[torch.arange(len(x)), batch["target_index"], :13]
        ring = torch.ones(s2.shape[-2:], dtype=torch.bool)
        ring[4:-4, 4:-4] = False
        return s2 + torch.where(ring, 0.04, 0.02)


def seam_ratio(predicted: np.ndarray, truth: np.ndarray, windows, size: int = 32, ring: int = 4) -> float:
    """Mean error within `ring` px of a patch edge that lies inside the scene, over the interior's
    (further from every patch edge; the scene's own outer ring left out of both)."""
    height, width = truth.shape[1:]
    near = []
    for axis, length in ((0, height), (1, width)):
        edges = {e for w in windows for e in (w[axis], w[axis] + size) if 0 < e < length}
        at = np.arange(length)
        near.append(np.array([any(e - ring <= i < e + ring for e in edges) for i in at]))
    boundary = near[0][:, None] | near[1][None, :]
    border = np.ones((height, width), bool)
    border[ring:-ring, ring:-ring] = False
    error = np.abs(predicted.astype(np.float64) - truth).mean(axis=0)
    return float(error[boundary & ~border].mean() / error[~boundary & ~border].mean())


def test_no_seam_where_patches_meet(tmp_path, monkeypatch):
    """Blended, the error along patch boundaries stays within 1.2x of the interior's (the bound of
    docs/patch-edges.md); the same patches cut without overlap show the edge error (2x)."""
    import rasterio

    from vcloud.cli import main
    from vcloud.data.shards import ShardReader

    monkeypatch.setattr("vcloud.evaluation.predict.build_predictor", lambda *args: EdgeErrorPredictor())
    raw = write_scene(tmp_path / "mine", 64, 96, dates=DATES_2, cloudy=(0,))
    ckpt = tiny_checkpoints(tmp_path / "ckpt")
    with rasterio.open(raw / "S2" / f"T33_{DATES_2[0]}.tif") as src:
        truth = src.read().astype(np.float64)
    ratios = {}
    for overlap in ("16", "0"):
        store, out = tmp_path / f"o{overlap}.zarr", tmp_path / f"o{overlap}"
        assert main(prepare_args(raw, store, "--overlap", overlap)) == 0
        args = ["predict", "--stage", "1", "--store", str(store), "--out", str(out), "--stage1", str(ckpt[1])]
        args += ["--config", str(ckpt["config"]), "--device", "cpu", "--dates", "2019-03-01"]
        assert main([*args, "--clear-pixels", "model"]) == 0
        with rasterio.open(out / "ROIs9000_1_s0_2019-03-01.tif") as cog:
            predicted = cog.read()
        windows = [tuple(int(v) for v in w[:2]) for w in ShardReader(store).window]
        ratios[overlap] = seam_ratio(predicted, truth, windows)
    print("seam ratios", ratios)
    assert ratios["16"] <= 1.2, ratios
    assert ratios["0"] >= 1.8, ratios  # the measure sees a seam where there is one


DATES_2 = ("20190301", "20190311")


def test_dates_on_different_grids_are_refused_in_one_line(tmp_path, capsys):
    import rasterio
    from rasterio.transform import from_origin

    from vcloud.cli import main

    raw = write_scene(tmp_path / "mine", 40, 50)
    moved = raw / "S2" / "T33_20190321.tif"
    with rasterio.open(moved) as src:
        pixels, profile = src.read(), src.profile
    profile["transform"] = from_origin(500010.0, 5000000.0, 10, 10)  # one pixel east
    with rasterio.open(moved, "w", **profile) as dst:
        dst.write(pixels)
    out = tmp_path / "mine.zarr"
    assert main(prepare_args(raw, out)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"vcloud prepare: error: {moved}: on another grid") and "gdalwarp" in err
    assert str(raw / "S2" / "T33_20190301.tif") in err and not out.exists()


def test_a_scene_smaller_than_a_patch_is_refused_in_one_line(tmp_path, capsys):
    from vcloud.cli import main

    raw = write_scene(tmp_path / "mine", 40, 24)
    out = tmp_path / "mine.zarr"
    assert main(prepare_args(raw, out)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "40x24 px, smaller than one 32 px patch" in err, err
    assert not out.exists()
