"""Tiny stage-1 and stage-2 checkpoints for the `vcloud predict` and `vcloud bundle` tests.

Untrained tiny models (tests/workflow/tiny_models.yaml without the wind scan), except the
refiner's output head, which gets small random weights: an untrained head predicts exactly
zero and its draws would not differ, so the uncertainty band would show nothing.
"""

from __future__ import annotations

from pathlib import Path


def tiny_checkpoints(folder: Path, *, wind: bool = False, bands: str | None = None) -> dict:
    """{"config": models.yaml, 1: stage-1 best.pt, 2: stage-2 best.pt} under `folder`; with
    `wind`, a wind-scanning stage 1 and "wind": its scan-order cache for 32 px stores; with
    `bands`, models of that band set (data.bands)."""
    import torch
    import yaml

    from tests.workflow.snakemake_run import ROOT
    from vcloud.config import load_model_config
    from vcloud.models.build import build_cfdt, build_refiner
    from vcloud.train.checkpoint import checkpoint_meta, save_checkpoint

    folder.mkdir(parents=True, exist_ok=True)
    models = yaml.safe_load((ROOT / "tests/workflow/tiny_models.yaml").read_text())
    models["stage1"]["model"]["wind_scan"] = wind
    if bands is not None:
        models["data"]["bands"] = bands
    config = folder / "models.yaml"
    config.write_text(yaml.safe_dump(models))
    cfg = load_model_config(config)
    torch.manual_seed(0)
    stage1, stage2 = folder / "stage1.pt", folder / "stage2.pt"
    save_checkpoint(stage1, {**checkpoint_meta(stage=1, config_hash="t"), "model": build_cfdt(cfg).state_dict()})
    refiner = build_refiner(cfg)
    with torch.no_grad():
        refiner.head[-1].weight.normal_(0.0, 0.05)
    save_checkpoint(stage2, {**checkpoint_meta(stage=2, config_hash="t"), "model": refiner.state_dict()})
    found = {"config": config, 1: stage1, 2: stage2}
    if wind:
        from vcloud.wind.scan_orders import write_cache

        found["wind"] = folder / "scan_orders.npz"  # 32 px / 2**3 (four CFDT levels) = 4 tokens a side
        write_cache(found["wind"], grid_h=4, grid_w=4, sectors=cfg.stage1.model.wind_sectors)
    return found


def predict_args(store: Path, out: Path, ckpt: dict, *extra: str) -> list[str]:
    """`vcloud predict` arguments for stage 2 with the tiny checkpoints."""
    return [
        "predict",
        "--stage",
        "2",
        "--store",
        str(store),
        "--out",
        str(out),
        "--stage1",
        str(ckpt[1]),
        "--stage2",
        str(ckpt[2]),
        "--config",
        str(ckpt["config"]),
        "--device",
        "cpu",
        *extra,
    ]


def fails_in_one_line(capsys, args, out, *expected) -> None:
    """`vcloud ARGS` exits 2 with one error line holding every `expected` text, and `out` was
    never created (nothing half-written)."""
    from vcloud.cli import main

    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for text in expected:
        assert text in err, err
    assert not out.exists(), sorted(out.rglob("*"))
