"""Scores of a predictor and the three baselines on the same samples, per sample, on average and
per cloud class of the target-date input (UnCRtainTS's metrics, evaluation/metrics.py), and the
paired differences model - baseline with their standard errors (evaluation/stats.py).

The differences are computed from the per-sample values as the report stores them (rounded to
5 decimals), so anyone can recompute them from the JSON with stats.compare.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from vcloud.constants import CLOUD_CLASSES, S2CLOUDLESS_KWARGS
from vcloud.data.series import FALLBACKS
from vcloud.evaluation.baselines import least_cloudy, median_mosaic
from vcloud.evaluation.metrics import METRICS, compute_all
from vcloud.evaluation.nearest_clear import nearest_clear
from vcloud.evaluation.series_baselines import NAMES as SERIES_NAMES
from vcloud.evaluation.stats import headline_difference, paired_report

# Of the model's own inputs (the published protocols' baselines), then of the whole series the
# protocol lets a method see (evaluation/series_baselines.py; our protocols).
INPUT_BASELINES = ("least_cloudy_date", "median_mosaic", "nearest_clear_date")
BASELINES = (*INPUT_BASELINES, *SERIES_NAMES)
METHODS = ("model", *BASELINES)
DIGITS = {"psnr": 2, "ssim": 3, "sam": 2, "mae": 4, "rmse": 4}  # how tables print each metric


@torch.no_grad()
def score(dataset: Dataset, predict, *, nearest_clear_max_cover: float = 0.05) -> dict:
    methods = {
        "model": predict,
        "least_cloudy_date": lambda b: least_cloudy(b["x"], b["target_index"]),
        "median_mosaic": lambda b: median_mosaic(b["x"], b["target_index"]),
        "nearest_clear_date": lambda b: nearest_clear(
            b["x"], b["target_index"], b["days"], clear_max_cover=nearest_clear_max_cover
        ),
    }
    per_sample: dict[str, dict[str, list]] = {name: {m: [] for m in METRICS} for name in methods}
    classes, locations, dates, fallbacks = [], [], [], []
    seen_error, seen_pixels = 0.0, 0  # the model's |error| summed over the date's seen pixels
    for batch in DataLoader(dataset, batch_size=4):
        classes += batch["cloud_class"].tolist()
        locations += batch["location"].tolist()
        if "dates" in batch:  # the context policy's record (data/samples.py context_record)
            dates += batch["dates"].tolist()
            fallbacks += [FALLBACKS[f] if f >= 0 else None for f in batch["fallback"].tolist()]
        if "series" in batch:  # the series composites (evaluation/series_baselines.py)
            for k, name in enumerate(SERIES_NAMES):
                methods.setdefault(name, lambda b, k=k: b["series"][:, k])
                per_sample.setdefault(name, {m: [] for m in METRICS})
        for name, method in methods.items():
            prediction = method(batch).float().clamp(0, 1)
            values = compute_all(prediction, batch["target"].float())
            for metric in METRICS:
                per_sample[name][metric] += values[metric].tolist()
            if name == "model":
                seen = (batch["target_prob"] < S2CLOUDLESS_KWARGS["threshold"])[:, None].expand_as(prediction)
                seen_error += float((prediction - batch["target"].float()).abs()[seen].double().sum())
                seen_pixels += int(seen.sum())
    result: dict = {"samples": len(classes), "cloud_class": [class_name(c) for c in classes], "location": locations}
    if dates:  # every sample's input dates (time indices) and why they are not the policy's, if not
        result["context"] = {
            "dates": dates,
            "fallback": fallbacks,
            "fallbacks": dict(Counter(f for f in fallbacks if f)),
        }
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
    # Where the reconstructed date is seen (cloud probability below the s2cloudless threshold): the
    # model's mean |error| there, every band of every such pixel alike (None: nothing seen).
    result["model"]["seen_mae"] = seen_error / seen_pixels if seen_pixels else None
    result["model"]["seen_values"] = seen_pixels
    # model - baseline per metric, overall and per cloud class: paired SE, location-clustered SE
    others = [name for name in BASELINES if name in result]
    result["paired"] = paired_report(result, method="model", others=others) if classes else {}
    result["strongest"] = strongest(result, others) if classes else None
    return result


def strongest(result: dict, baselines: list[str], *, level: float = 0.95) -> dict:
    """The model against the strongest baseline of a scored protocol (the highest mean PSNR on these
    samples, chosen after the fact: the hardest comparison for the model): the paired difference,
    its interval at `level` (t, clustered by location), the samples the model wins, and whether
    the interval lies above zero."""
    best = max(baselines, key=lambda name: result[name]["mean"]["psnr"])
    a, b = result["model"]["per_sample"]["psnr"], result[best]["per_sample"]["psnr"]
    paired = headline_difference(a, b, groups=result["location"], level=level)
    return {"baseline": best, **paired}


def headline(result: dict) -> str | None:
    """One line: the model against the strongest simple answer, said plainly."""
    best = result.get("strongest")
    if not best:
        return None
    low, high = best["ci"] if best["ci"] else (None, None)
    interval = f"[{low:+.2f}, {high:+.2f}]" if low is not None else "[no interval: one location]"
    verdict = (
        "beats it"
        if low is not None and low > 0
        else "loses to it"
        if high is not None and high < 0
        else "does not beat it (the interval holds zero)"
    )
    return (
        f"model - {best['baseline']} (the strongest simple answer): {best['difference']:+.2f} dB PSNR "
        f"{interval} at {best['ci_level']:.0%}, wins {best['wins']} of {best['samples']}: the model {verdict}"
    )


def class_name(index: int) -> str:
    return CLOUD_CLASSES[index] if 0 <= index < len(CLOUD_CLASSES) else "unknown"


def _class_order(name: str) -> int:
    return CLOUD_CLASSES.index(name) if name in CLOUD_CLASSES else len(CLOUD_CLASSES)


def describe(result: dict) -> str:
    """One line naming a protocol's setup: 'uncrtaints: T=3, region all, cov [0, 1], pairs computed'."""
    setup = result.get("protocol", {})
    text = f"{setup.get('protocol', '?')}: T={setup.get('dates', '?')}, region {setup.get('region', 'all')}"
    if "min_cov" in setup:
        text += f", coverage [{setup['min_cov']:g}, {setup['max_cov']:g}], pairs {setup.get('pairs')}"
        text += f", target among the inputs in {setup.get('target_in_inputs')} of {setup.get('samples')}"
    if "unavailable" in result:
        text += f" - not run: {result['unavailable']}"
    return text


def _value(value: float | None, metric: str, *, sign: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.{DIGITS[metric]}f}" if sign else f"{value:.{DIGITS[metric]}f}"


def _difference(paired: dict | None, metric: str) -> str:
    if paired is None:
        return "-"
    return f"{_value(paired['difference'], metric, sign=True)} ± {_value(paired['se'], metric)}"


def mean_rows(report: dict) -> list[list[str]]:
    """[protocol, method, samples, PSNR, SSIM, SAM, MAE, RMSE] per protocol and method."""
    rows = []
    for protocol, result in report["protocols"].items():
        for method in METHODS:
            mean = result.get(method, {}).get("mean")
            if mean:
                rows.append([protocol, method, str(result["samples"]), *(_value(mean[m], m) for m in METRICS)])
    return rows


def difference_rows(report: dict) -> list[list[str]]:
    """[protocol, difference, class, samples, locations, PSNR ± SE, PSNR SE by location, SSIM ± SE, ...].

    One row per protocol, baseline and cloud class (`all` first): model - baseline, its paired
    standard error and, for PSNR, the location-clustered one.
    """
    rows = []
    for protocol, result in report["protocols"].items():
        for other, comparison in result.get("paired", {}).items():
            classes = sorted(comparison["by_class"].items(), key=lambda kv: _class_order(kv[0]))
            parts = [("all", comparison["overall"]), *classes]
            for cloud_class, by_metric in parts:
                psnr = by_metric["psnr"]
                cells = [_difference(by_metric.get(m), m) for m in METRICS]
                rows.append(
                    [
                        protocol,
                        f"{comparison['method']} - {other}",
                        cloud_class,
                        str(psnr["samples"]),
                        str(psnr.get("locations", "-")),
                        cells[0],
                        _value(psnr.get("se_location"), "psnr"),
                        *cells[1:],
                    ]
                )
    return rows


MEAN_HEADER = ["protocol", "method", "samples", "PSNR", "SSIM", "SAM", "MAE", "RMSE"]
DIFFERENCE_HEADER = [
    "protocol",
    "difference",
    "class",
    "samples",
    "locations",
    "PSNR ± SE",
    "PSNR SE by location",
    "SSIM ± SE",
    "SAM ± SE",
    "MAE ± SE",
    "RMSE ± SE",
]


def markdown(header: list[str], rows: list[list[str]], *, left: int) -> str:
    align = ["---" if i < left else "--:" for i in range(len(header))]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in [header, align, *rows])


def table(report: dict) -> str:
    """The report as Markdown: each protocol's setup, the means (protocol x method) and the
    paired differences model - baseline (mean ± paired SE, per cloud class)."""
    lines = [f"- {name}: {headline(result)}" for name, result in report["protocols"].items() if headline(result)]
    setups = [f"- {describe(result)}" for result in report["protocols"].values()]
    return "\n\n".join(
        [
            *(["Against the strongest simple answer:\n" + "\n".join(lines)] if lines else []),
            "\n".join(setups),
            markdown(MEAN_HEADER, mean_rows(report), left=2),
            markdown(DIFFERENCE_HEADER, difference_rows(report), left=3),
        ]
    )
