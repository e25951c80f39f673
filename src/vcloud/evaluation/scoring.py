"""Scores of a predictor and the two baselines on the same samples, per sample, on average and
per cloud class of the target-date input (UnCRtainTS's metrics, evaluation/metrics.py)."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from vcloud.constants import CLOUD_CLASSES
from vcloud.evaluation.baselines import least_cloudy, median_mosaic
from vcloud.evaluation.metrics import METRICS, compute_all

METHODS = ("model", "least_cloudy_date", "median_mosaic")


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
    result: dict = {"samples": len(classes), "cloud_class": [class_name(c) for c in classes], "location": locations}
    for name, values in per_sample.items():
        arrays = {m: np.asarray(v) for m, v in values.items()}
        by_class = {}
        for index, name_of_class in enumerate(CLOUD_CLASSES):
            mask = np.asarray(classes) == index
            if mask.any():
                by_class[name_of_class] = {m: float(a[mask].mean()) for m, a in arrays.items()} | {
                    "samples": int(mask.sum())
                }
        result[name] = {
            "mean": {m: float(a.mean()) for m, a in arrays.items()} if len(classes) else {},
            "by_class": by_class,
            "per_sample": {m: [round(float(x), 5) for x in a] for m, a in arrays.items()},
        }
    return result


def class_name(index: int) -> str:
    return CLOUD_CLASSES[index] if 0 <= index < len(CLOUD_CLASSES) else "unknown"


def table(report: dict) -> str:
    """The report's mean scores as a Markdown table (protocol x method)."""
    lines = ["| protocol | method | PSNR | SSIM | SAM | MAE | RMSE |", "| --- | --- | --: | --: | --: | --: | --: |"]
    for protocol, result in report["protocols"].items():
        for method in METHODS:
            mean = result[method]["mean"]
            if mean:
                lines.append(
                    f"| {protocol} | {method} | {mean['psnr']:.2f} | {mean['ssim']:.3f} | "
                    f"{mean['sam']:.2f} | {mean['mae']:.4f} | {mean['rmse']:.4f} |"
                )
    return "\n".join(lines)
