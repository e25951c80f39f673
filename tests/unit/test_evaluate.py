import numpy as np
import pytest

from vcloud.data.samples import CloudySamples
from vcloud.evaluation.protocols import ReferenceSamples
from vcloud.evaluation.scoring import score, table


def test_reference_protocol_targets_the_least_cloudy_date(tiny_store):
    ds = ReferenceSamples(tiny_store, dates=2)
    reader = ds.reader
    location, truth, dates, slot, _ = ds.items[0]
    cover = np.nan_to_num(reader.cloud_cover[location], nan=1.0)
    assert truth == int(np.argmin(cover)) and truth not in dates
    assert abs(dates[slot] - truth) == min(abs(d - truth) for d in dates)  # reconstruct at the nearest date
    item = ds[0]
    np.testing.assert_array_equal(item["target"].numpy(), reader.read(location, [truth]).s2[0])
    assert item["x"].shape[0] == 2 and int(item["target_index"]) == slot


def test_score_reports_means_classes_and_baselines_on_the_same_samples(tiny_store):
    samples = CloudySamples(tiny_store, dates=2, length=6, seed=1, clear_max_cover=1.01, kinds=("thin", "opaque"))
    result = score(samples, lambda batch: batch["target"])  # a perfect "model"
    assert result["samples"] == 6 and set(result["cloud_class"]) <= {"thin", "opaque"}
    assert result["model"]["mean"]["psnr"] == pytest.approx(100.0)  # the documented cap
    assert result["model"]["mean"]["ssim"] == pytest.approx(1.0)
    assert result["least_cloudy_date"]["mean"]["psnr"] < 100.0
    counts = sum(c["samples"] for c in result["median_mosaic"]["by_class"].values())
    assert counts == 6 and len(result["median_mosaic"]["per_sample"]["rmse"]) == 6
    assert len(result["nearest_clear_date"]["per_sample"]["psnr"]) == 6
    text = table({"protocols": {"fixed": result}})
    assert "| fixed | model | 6 | 100.00 |" in text
    assert "| fixed | nearest_clear_date | 6 |" in text


def _tiny_config(tmp_path):
    import yaml

    from tests.workflow.snakemake_run import ROOT

    models = yaml.safe_load((ROOT / "tests/workflow/tiny_models.yaml").read_text())
    models["stage1"]["model"]["wind_scan"] = False
    (tmp_path / "models.yaml").write_text(yaml.safe_dump(models))
    return tmp_path / "models.yaml"


def _stage0_checkpoint(tmp_path, config):
    from vcloud.config import load_model_config
    from vcloud.models.autoencoder import Autoencoder
    from vcloud.train.checkpoint import checkpoint_meta, save_checkpoint

    model = Autoencoder(load_model_config(config).stage0.model)
    path = tmp_path / "stage0/best.pt"
    path.parent.mkdir()
    save_checkpoint(path, {**checkpoint_meta(stage=0, config_hash="t"), "model": model.state_dict()})
    return path


def test_evaluate_takes_explicit_checkpoints_and_refuses_another_stages_in_one_line(tiny_store, tmp_path, capsys):
    from vcloud.cli import main

    config = _tiny_config(tmp_path)
    stage0 = _stage0_checkpoint(tmp_path, config)
    common = ["--store", str(tiny_store), "--config", str(config), "--samples", "2"]
    # A stage-0 checkpoint given as stage 1's: one line naming the file, nothing written.
    status = main(["evaluate", "--stage", "1", "--stage1", str(stage0), "--out", str(tmp_path / "e1.json"), *common])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1
    assert f"{stage0}: checkpoint of stage 0, expected stage 1" in err
    assert not (tmp_path / "e1.json").exists()
    # Stage 2's predictor needs stages 0, 1 and 2: the missing flags are named.
    status = main(["evaluate", "--stage", "2", "--stage0", str(stage0), "--out", str(tmp_path / "e2.json"), *common])
    err = capsys.readouterr().err.strip()
    assert status == 2 and err.endswith("vcloud evaluate --stage 2 needs --stage1 and --stage2 CHECKPOINT")
    # The right checkpoint at any path (no results-folder convention): evaluated.
    moved = tmp_path / "elsewhere.pt"
    stage0.rename(moved)
    status = main(["evaluate", "--stage", "0", "--stage0", str(moved), "--out", str(tmp_path / "e0.json"), *common])
    assert status == 0
    report = __import__("json").loads((tmp_path / "e0.json").read_text())
    assert report["stage"] == 0 and report["protocols"]["fixed"]["samples"] == 2
