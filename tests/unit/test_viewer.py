"""Viewer export: stretches and PNG bytes, sample picking, the page, and a whole export on tiny models."""

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from vcloud.export import images as im
from vcloud.export.viewer import LAYERS, METHODS, export_viewer, pick_samples, render_page

ROOT = Path(__file__).parents[2]


def test_true_colour_takes_b4_b3_b2_with_the_fixed_linear_stretch():
    s2 = np.zeros((13, 1, 2), np.float32)
    s2[3, 0, 0], s2[2, 0, 0], s2[1, 0, 0] = 0.12, 0.3, 0.6  # B4, B3, B2
    s2[3, 0, 1], s2[2, 0, 1], s2[1, 0, 1] = 0.06, -0.1, np.nan
    rgb = im.true_colour(s2)
    assert rgb.shape == (1, 2, 3) and rgb.dtype == np.uint8
    # 0.12 / 0.3 * 255 = 102; 0.3 is full white; 0.6 clips to white.
    assert rgb[0, 0].tolist() == [102, 255, 255]
    assert rgb[0, 1].tolist() == [51, 0, 0]  # 0.06 / 0.3 * 255 = 51; negative and NaN -> 0


def test_error_map_runs_from_dark_at_zero_to_yellow_at_error_max():
    truth = np.zeros((13, 1, 3), np.float32)
    pred = truth.copy()
    pred[:, 0, 1] = im.ERROR_MAX / 2  # the middle anchor of the ramp
    pred[:, 0, 2] = 5 * im.ERROR_MAX  # clipped to the top
    rgb = im.error_map(pred, truth)
    assert rgb[0].tolist() == [[0, 0, 4], [188, 55, 84], [252, 255, 164]]


def test_png_bytes_depend_on_the_pixels_only(tmp_path):
    from PIL import Image

    image = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    im.write_png(tmp_path / "a.png", image)
    im.write_png(tmp_path / "b.png", image.copy())
    data = (tmp_path / "a.png").read_bytes()
    assert data == (tmp_path / "b.png").read_bytes()
    assert b"tIME" not in data and b"tEXt" not in data  # no timestamps, no text
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(data))), image)


def test_strip_puts_tiles_side_by_side_with_white_gaps():
    tiles = [np.zeros((4, 4, 3), np.uint8), np.ones((4, 4, 3), np.uint8)]
    out = im.strip(tiles, gap=2)
    assert out.shape == (4, 10, 3)
    assert (out[:, 4:6] == 255).all() and (out[:, 6:] == 1).all()


def test_pick_samples_is_a_sorted_seeded_choice():
    assert pick_samples(100, 5, seed=0) == pick_samples(100, 5, seed=0)
    picks = pick_samples(100, 5, seed=0)
    assert picks == sorted(set(picks)) and len(picks) == 5
    assert pick_samples(100, 5, seed=1) != picks
    assert pick_samples(3, 10, seed=0) == [0, 1, 2]  # capped by what the store has
    assert pick_samples(0, 10, seed=0) == []


def test_page_embeds_the_data_safely_and_refers_to_nothing_online():
    data = {"title": "a <b> title", "samples": [{"note": "</script><script>alert(1)</script>"}]}
    page = render_page(data)
    assert page.count("</script>") == 2  # the data's own and the viewer's
    payload = page.split('id="viewer-data">', 1)[1].split("</script>", 1)[0]
    assert json.loads(payload) == data
    assert "<title>a &lt;b&gt; title</title>" in page
    assert not re.search(r"https?://", page, re.IGNORECASE)
    for asset in (ROOT / "src/vcloud/export/assets").iterdir():
        assert not re.search(r"https?://|//cdn|@import", asset.read_text(), re.IGNORECASE), asset.name


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory, one_thread):
    """Untrained tiny models of every stage saved as best.pt, and a model config to match."""
    from vcloud.config import load_model_config
    from vcloud.models.autoencoder import Autoencoder
    from vcloud.models.cfdt import CFDT
    from vcloud.models.refiner import Refiner
    from vcloud.train.checkpoint import checkpoint_meta, save_checkpoint

    root = tmp_path_factory.mktemp("viewer")
    models = yaml.safe_load((ROOT / "tests/workflow/tiny_models.yaml").read_text())
    models["data"]["clear_target_max_cover"] = 1.01  # every date of the tiny store may be a target
    models["stage1"]["model"]["wind_scan"] = False  # the viewer with wind: the shared pipeline run
    (root / "models.yaml").write_text(yaml.safe_dump(models))
    cfg = load_model_config(root / "models.yaml")
    torch.manual_seed(0)
    weights = {
        0: Autoencoder(cfg.stage0.model).state_dict(),
        1: CFDT(cfg.stage1.model).state_dict(),
        2: Refiner(cfg.stage2.model).state_dict(),
        3: CFDT(cfg.stage1.model).state_dict(),  # stage 3 self-trains the draft model
    }
    for stage, state in weights.items():
        (root / f"results/stage{stage}").mkdir(parents=True)
        save_checkpoint(
            root / f"results/stage{stage}/best.pt", {**checkpoint_meta(stage=stage, config_hash="t"), "model": state}
        )
    return root


def _export(root, store, out, samples=3):
    checkpoints = {n: root / f"results/stage{n}/best.pt" for n in range(4)}
    return export_viewer(
        store=store, checkpoints=checkpoints, config_path=root / "models.yaml", out=out, samples=samples, seed=0
    )


def test_export_writes_every_layer_of_every_sample_and_the_metrics(tiny_checkpoints, tiny_store, tmp_path):
    from PIL import Image

    data = _export(tiny_checkpoints, tiny_store, tmp_path / "viewer")
    out = tmp_path / "viewer"
    assert sorted(p.name for p in out.iterdir()) == ["images", "index.html", "thumbnails.png"]  # no staging left
    assert len(data["samples"]) == 3
    written = sorted(p.name for p in (out / "images").iterdir())
    referenced = sorted(Path(s["images"][layer.key]).name for s in data["samples"] for layer in LAYERS)
    assert written == referenced
    for sample in data["samples"]:
        assert set(sample["metrics"]) == set(METHODS)
        assert sample["cloud_class"] in ("thin", "thick", "opaque")
        assert len(sample["context"]) == 1  # tiny models take 2 dates: the target and one other
        size = Image.open(out / sample["images"]["input"]).size
        assert size == (32, 32) and Image.open(out / sample["images"]["context"]).size == (32, 32)
    page = (out / "index.html").read_text()
    assert json.loads(page.split('id="viewer-data">', 1)[1].split("</script>", 1)[0]) == data


def test_export_is_byte_identical_and_replaces_a_previous_one(tiny_checkpoints, tiny_store, tmp_path):
    _export(tiny_checkpoints, tiny_store, tmp_path / "a")
    _export(tiny_checkpoints, tiny_store, tmp_path / "b")
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    _export(tiny_checkpoints, tiny_store, tmp_path / "a", samples=1)  # fewer samples: no stale images
    assert len(list((tmp_path / "a/images").iterdir())) == len(LAYERS)


def test_cli_export_viewer_names_a_missing_checkpoint_in_one_line(tiny_store, tmp_path, capsys):
    from vcloud.cli import main
    from vcloud.wind.scan_orders import write_cache

    write_cache(tmp_path / "w.npz", grid_h=4, grid_w=4, sectors=8)  # tiny_models.yaml scans by wind
    flags = [a for n in range(4) for a in (f"--stage{n}", str(tmp_path / f"nothing/stage{n}/best.pt"))]
    status = main(
        [
            "export-viewer",
            "--store",
            str(tiny_store),
            *flags,
            "--config",
            str(ROOT / "tests/workflow/tiny_models.yaml"),
            "--out",
            str(tmp_path / "v"),
            "--wind-cache",
            str(tmp_path / "w.npz"),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1 and "best.pt" in err
    assert not (tmp_path / "v/index.html").exists()


def test_export_refuses_zero_samples(tiny_store, tmp_path):
    from vcloud.errors import ConfigError

    with pytest.raises(ConfigError, match="--samples: 0"):
        export_viewer(
            store=tiny_store, checkpoints={}, config_path=tmp_path / "x.yaml", out=tmp_path / "v", samples=0, seed=0
        )
