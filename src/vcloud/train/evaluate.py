"""`vcloud evaluate`: a stage's metrics on a prepared store, next to two baselines.

Two protocols, both reported:
- fixed: seeded synthetic clouds (thin, thick, opaque in turn) put on the clear dates of the
  store; ground truth = the clear image; the other T-1 dates keep their natural clouds.
- reference (as UnCRtainTS): per location, the least-cloudy date is the ground truth and T
  other dates, all with their natural clouds, are the input; the model reconstructs at the
  input date nearest in time to the ground truth.
Per protocol: PSNR, SSIM, SAM, MAE, RMSE per sample and averaged, also per cloud class of the
target-date input, for the stage and for the least-cloudy-date and median-mosaic baselines on
the same samples. Stage 0 (the autoencoder) is scored on reconstructing the ground truth.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from vcloud.config import ModelSetConfig, load_model_config
from vcloud.constants import CLOUD_CLASSES
from vcloud.data.shards import ShardReader as StoreReader  # direct, checked shard reads
from vcloud.data.samples import CloudySamples, _stack
from vcloud.models.autoencoder import Autoencoder
from vcloud.models.cfdt import CFDT
from vcloud.train.baselines import least_cloudy, median_mosaic
from vcloud.train.metrics import METRICS, compute_all
from vcloud.train.stages import EVAL_KINDS, _draft, build_pipeline, install_wind_orders, load_frozen

log = logging.getLogger(__name__)

EVAL_SEED = 2024


class ReferenceSamples(Dataset):
    """One sample per location with >= 2 usable dates: least-cloudy date = ground truth."""

    def __init__(self, store: Path, *, dates: int):
        self.reader = StoreReader(store)
        usable = self.reader.valid_s2 & self.reader.valid_s1
        cover = np.where(usable, np.nan_to_num(self.reader.cloud_cover, nan=1.0), np.inf)
        self.items = []
        for location in np.flatnonzero(usable.sum(axis=1) >= 2):
            truth = int(np.argmin(cover[location]))
            others = np.flatnonzero(usable[location])
            others = others[others != truth]
            nearest = others[np.argsort(np.abs(others - truth), kind="stable")][:dates]
            chosen = np.resize(np.sort(nearest), dates) if len(nearest) < dates else np.sort(nearest)
            slot = int(np.argmin(np.abs(chosen - truth)))
            self.items.append((int(location), truth, sorted(chosen.tolist()), slot))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        location, truth, dates, slot = self.items[index]
        sample = self.reader.read(location, [*dates, truth])
        prob = np.nan_to_num(sample.cloud_prob, nan=1.0)
        item = _stack(sample.s2[:-1], sample.s1[:-1], prob[:-1], self.reader.date_s2[location, dates], slot)
        item["target"] = torch.from_numpy(np.ascontiguousarray(sample.s2[-1]))
        item["wind"] = torch.from_numpy(self.reader.wind[location, dates[slot]])
        item["cloud_class"] = torch.tensor(int(self.reader.cloud_class[location, dates[slot]]))
        item["location"] = torch.tensor(location)
        return item


def build_predictor(stage: int, cfg: ModelSetConfig, results: Path, wind):
    ckpt = {n: Path(results) / f"stage{n}" / "best.pt" for n in range(4)}
    if stage == 0:
        autoencoder = load_frozen(Autoencoder(cfg.stage0.model), ckpt[0], stage=0)
        return lambda batch: autoencoder(batch["target"])
    if stage == 1:
        cfdt = install_wind_orders(load_frozen(CFDT(cfg.stage1.model), ckpt[1], stage=1), wind)
        return lambda batch: _draft(cfdt, batch)
    if stage == 2:
        pipeline = build_pipeline(cfg, stage0_ckpt=ckpt[0], stage1_ckpt=ckpt[1], wind=wind)
        pipeline.load_state_dict(load_frozen_state(ckpt[2], stage=2))
        pipeline.eval()
        return lambda batch: pipeline.sample(batch, steps=cfg.stage2.model.sample_steps, seed=EVAL_SEED)
    student = install_wind_orders(load_frozen(CFDT(cfg.stage1.model), ckpt[3], stage=3), wind)
    return lambda batch: _draft(student, batch)


def fixed_samples(store: Path, cfg: ModelSetConfig, *, samples: int | None = None) -> CloudySamples:
    """The fixed protocol's samples: seeded thin/thick/opaque clouds on the clear dates.

    Sample i is the same whatever `samples` is (draws depend on the seed and i only), so the
    viewer's sample i is the evaluation's sample i.
    """
    return CloudySamples(
        store, dates=cfg.data.input_dates, length=samples, seed=EVAL_SEED,
        clear_max_cover=cfg.data.clear_max_cover, kinds=EVAL_KINDS,
    )  # fmt: skip


def load_frozen_state(path: Path, *, stage: int) -> dict:
    from vcloud.errors import BadInputError
    from vcloud.train.checkpoint import load_checkpoint

    state = load_checkpoint(path)
    if state.get("stage") != stage:
        raise BadInputError(f"{path}: checkpoint of stage {state.get('stage')}, expected stage {stage}")
    return state["model"]


@torch.no_grad()
def score(dataset: Dataset, predict) -> dict:
    methods = {
        "model": predict,
        "least_cloudy_date": lambda b: least_cloudy(b["x"], b["target_index"]),
        "median_mosaic": lambda b: median_mosaic(b["x"], b["target_index"]),
    }
    per_sample: dict[str, dict[str, list]] = {name: {m: [] for m in METRICS} for name in methods}
    classes, locations = [], []
    for batch in DataLoader(dataset, batch_size=4):
        classes += batch["cloud_class"].tolist()
        locations += batch["location"].tolist()
        for name, method in methods.items():
            values = compute_all(method(batch).float().clamp(0, 1), batch["target"].float())
            for metric in METRICS:
                per_sample[name][metric] += values[metric].tolist()
    result: dict = {"samples": len(classes), "cloud_class": [_class_name(c) for c in classes], "location": locations}
    for name, values in per_sample.items():
        arrays = {m: np.asarray(v) for m, v in values.items()}
        by_class = {}
        for index, class_name in enumerate(CLOUD_CLASSES):
            mask = np.asarray(classes) == index
            if mask.any():
                by_class[class_name] = {m: float(a[mask].mean()) for m, a in arrays.items()} | {"samples": int(mask.sum())}
        result[name] = {
            "mean": {m: float(a.mean()) for m, a in arrays.items()} if len(classes) else {},
            "by_class": by_class,
            "per_sample": {m: [round(float(x), 5) for x in a] for m, a in arrays.items()},
        }
    return result


def _class_name(index: int) -> str:
    return CLOUD_CLASSES[index] if 0 <= index < len(CLOUD_CLASSES) else "unknown"


def evaluate(*, stage: int, store: Path, out: Path, results: Path, config_path: Path, wind_cache: Path | None = None,
             samples: int | None = None) -> dict:  # fmt: skip
    from vcloud.train.run import load_wind_orders

    cfg = load_model_config(config_path)
    torch.manual_seed(EVAL_SEED)
    wind = load_wind_orders(cfg, stage=stage, train=store, wind_cache=wind_cache, world_size=1)
    predict = build_predictor(stage, cfg, results, wind)
    report = {
        "stage": stage,
        "store": str(store),
        "config": str(config_path),
        "protocols": {
            "fixed": score(fixed_samples(store, cfg, samples=samples), predict),
            "reference": score(ReferenceSamples(store, dates=cfg.data.input_dates), predict),
        },
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(report, indent=1))
    os.replace(tmp, out)
    log.info("stage %d evaluation on %s:\n%s", stage, store, table(report))
    return report


def table(report: dict) -> str:
    lines = ["| protocol | method | PSNR | SSIM | SAM | MAE | RMSE |", "| --- | --- | --: | --: | --: | --: | --: |"]
    for protocol, result in report["protocols"].items():
        for method in ("model", "least_cloudy_date", "median_mosaic"):
            mean = result[method]["mean"]
            if mean:
                lines.append(
                    f"| {protocol} | {method} | {mean['psnr']:.2f} | {mean['ssim']:.3f} | "
                    f"{mean['sam']:.2f} | {mean['mae']:.4f} | {mean['rmse']:.4f} |"
                )
    return "\n".join(lines)
