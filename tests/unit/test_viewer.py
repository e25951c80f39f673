"""Viewer export: stretches and PNG bytes, sample picking, the page, and a whole export on tiny models;
a research run's page with the comparison of its runs ("Experiments compared")."""

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


# --- a research run's viewer: the comparison of the runs on the page ---------------------------


def _report(folder: Path, name: str, psnr: list[float], stage: int = 2) -> Path:
    """An evaluation report of one stage, the fixed protocol on two samples at locations 0 and 1."""
    protocol = {
        "protocol": {"protocol": "fixed", "dates": 4},
        "samples": len(psnr),
        "cloud_class": ["thin"] * len(psnr),
        "location": [0, 1],
        "model": {"per_sample": {"psnr": psnr}},
    }
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"stage": stage, "protocols": {"fixed": protocol}}))
    return path


@pytest.fixture
def comparison(tmp_path):
    """results/compare.json of base and s1 under seeds 0 and 1, on val and test (vcloud compare)."""
    from vcloud.evaluation.compare import write_run_comparison

    test = {("base", 0): [30.0, 32.0], ("base", 1): [32.0, 34.0], ("s1", 0): [31.0, 33.0], ("s1", 1): [35.0, 37.0]}
    val = {("base", 0): [20.0, 22.0], ("base", 1): [20.0, 22.0], ("s1", 0): [21.0, 23.0], ("s1", 1): [21.0, 23.0]}
    reports = [(e, s, _report(tmp_path, f"t_{e}{s}", v)) for (e, s), v in test.items()]
    val_reports = [(e, s, _report(tmp_path, f"v_{e}{s}", v)) for (e, s), v in val.items()]
    path = tmp_path / "compare.json"
    write_run_comparison(reports, path, baseline="base", val_reports=val_reports, markdown_out=tmp_path / "compare.md")
    return path


def test_the_comparison_is_embedded_with_the_cells_of_compare_md(comparison):
    from vcloud.export.viewer import comparison_section

    section = comparison_section(comparison, run=("base", "0"))
    # The cells as results/compare.md has them: its table rows, cell for cell, in its order.
    markdown = [line for line in (comparison.parent / "compare.md").read_text().splitlines() if line.startswith("|")]
    assert markdown[0] == "| " + " | ".join(section["header"]) + " |"
    (table,) = section["tables"]
    assert table["stage"] == 2
    assert ["| " + " | ".join(row["cells"]) + " |" for row in table["rows"]] == markdown[2:]
    # Worked out by hand: seed means 31, 33 and 32, 36; differences 1 and 3 per seed, the same at
    # both samples, so only the seed level: se 1, t(0.975, 1 df) = 12.706.
    by = {(row["split"], row["experiment"]): row["cells"] for row in table["rows"]}
    assert by["test", "s1"] == ["fixed", "test", "s1", "2", "32.00", "36.00", "34.00 ± 2.83", "+2.00 [-10.71, +14.71]"]
    assert by["val", "base"][-1] == "baseline" and [r["split"] for r in table["rows"]] == ["val", "val", "test", "test"]
    assert section["decided_on"] == "val" and section["baseline"] == "base"
    assert section["notes"][1].startswith("Designs are chosen on the val split")  # plain text, no Markdown
    assert (
        section["shown"] == "The samples below are one run's: base, seed 0 (the baseline). The tables are every run's."
    )
    assert "(the baseline)" not in comparison_section(comparison, run=("s1", "1"))["shown"]


def test_the_comparison_scripts_are_on_a_research_page_only(comparison):
    from vcloud.export.viewer import comparison_section

    data = {"title": "t", "samples": []}
    assets = ROOT / "src/vcloud/export/assets"
    script, style = (assets / "experiments.js").read_text(), (assets / "experiments.css").read_text()
    plain = render_page(data)
    assert script not in plain and style not in plain and "Experiments compared" not in plain
    page = render_page({**data, "comparison": comparison_section(comparison, run=("base", "0"))})
    assert script in page and style in page
    assert page.index((assets / "viewer.js").read_text()) < page.index(script)  # after the viewer's own
    payload = json.loads(page.split('id="viewer-data">', 1)[1].split("</script>", 1)[0])
    assert payload["comparison"]["tables"][0]["rows"][3]["cells"][-1] == "+2.00 [-10.71, +14.71]"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not a comparison of runs from vcloud compare (JSONDecodeError"),
        ('{"metric": "psnr", "baseline": "base", "decided_on": "test", "seeds": [0]}', "it lacks rows"),
        ('{"metric": "psnr", "baseline": "b", "decided_on": "test", "seeds": [0], "rows": []}', "its rows are empty"),
        ('{"metric": "psnr", "baseline": "b", "decided_on": "test", "seeds": [0], "rows": [{"stage": 1}]}', "KeyError"),
        ("[1, 2]", "a JSON list, not an object"),
    ],
)
def test_a_bad_comparison_is_one_line_naming_the_file(tmp_path, text, message):
    from vcloud.errors import BadInputError
    from vcloud.export.viewer import comparison_section

    path = tmp_path / "compare.json"
    path.write_text(text)
    with pytest.raises(BadInputError) as err:
        comparison_section(path, run=("base", "0"))
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_cli_export_viewer_refuses_a_bad_comparison_before_writing_anything(comparison, tiny_store, tmp_path, capsys):
    from vcloud.cli import main

    bad = tmp_path / "bad.json"
    bad.write_text('{"metric": "psnr"}')
    flags = [a for n in range(4) for a in (f"--stage{n}", str(tmp_path / f"nothing/stage{n}/best.pt"))]
    args = [
        "export-viewer",
        "--store",
        str(tiny_store),
        *flags,
        "--config",
        str(ROOT / "tests/workflow/tiny_models.yaml"),
    ]
    args += ["--out", str(tmp_path / "v")]
    for extra, says in [
        (["--comparison", str(bad), "--run", "base", "0"], f"{bad}: not a comparison of runs"),
        (["--comparison", str(comparison), "--run", "other", "0"], "--run other 0: not a run of"),
        (["--comparison", str(comparison)], "--comparison: give --run EXPERIMENT SEED too"),
        (["--run", "base", "0"], "--run: names the run of a research run's viewer"),
    ]:
        assert main([*args, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and says in err, err
        assert not (tmp_path / "v").exists()


def test_export_with_a_comparison_adds_it_and_changes_nothing_else(comparison, tiny_checkpoints, tiny_store, tmp_path):
    checkpoints = {n: tiny_checkpoints / f"results/stage{n}/best.pt" for n in range(4)}
    common = {"store": tiny_store, "checkpoints": checkpoints, "config_path": tiny_checkpoints / "models.yaml"}
    plain = export_viewer(**common, out=tmp_path / "plain", samples=1, seed=0)
    research = export_viewer(
        **common, out=tmp_path / "research", samples=1, seed=0, comparison=comparison, run=("s1", "1")
    )
    assert {k: v for k, v in research.items() if k != "comparison"} == plain
    assert research["comparison"]["run"] == {"experiment": "s1", "seed": "1"}
    page = (tmp_path / "research/index.html").read_text()
    assert json.loads(page.split('id="viewer-data">', 1)[1].split("</script>", 1)[0]) == research
    images = sorted(p.name for p in (tmp_path / "plain/images").iterdir())
    assert sorted(p.name for p in (tmp_path / "research/images").iterdir()) == images
