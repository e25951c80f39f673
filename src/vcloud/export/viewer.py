"""`vcloud export-viewer`: quicklooks of test samples and a static, offline index.html.

The samples are the evaluation's fixed protocol (seeded thin/thick/opaque clouds on clear
dates of the store, `vcloud.evaluation.protocols.fixed_samples`): viewer sample i is sample i of
`results/eval/stage<n>.json`. `samples` of them are picked with `seed`. Per sample, PNG
quicklooks (stretches in `vcloud.export.images`) of the cloudy target-date input, the other
input dates as a strip, the cloud probability, S1 VV, the stage 1 draft, the stage 2
refinement, the stage 3 output, the ground truth and the error of the stage 3 output, plus
the metrics of every stage and both baselines.

The page (assets/index.html, viewer.css, viewer.js inlined, the data as JSON in a script
tag) needs no network, no server and no build step: it opens from file:// as well as over
`python -m http.server`. Same checkpoints, store and settings: byte-identical files.

A research run's viewer (`--comparison results/compare.json --run EXPERIMENT SEED`) also shows
the section "Experiments compared": vcloud compare's tables, their cells formatted here as in
results/compare.md (compare.runs_tables), laid out by assets/experiments.js. Those assets are
inlined only then.

The page opens, above everything, with each shown stage against the strongest simple answer
(docs/evaluation.md): in a research run the shown experiment's lines of the comparison (over its
seeds, test split); otherwise those of the stages' evaluation reports when `evaluations` are given
(evaluation_headlines). viewer.js lays them out; a page without them has no such box.
"""

from __future__ import annotations

import html
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import default_collate

from vcloud.config import load_model_config
from vcloud.constants import CLOUD_CLASSES, S2_CHANNELS
from vcloud.errors import ConfigError
from vcloud.evaluation.baselines import least_cloudy, median_mosaic
from vcloud.evaluation.compare import (
    STRONGEST,
    fallbacks,
    headline,
    read_evaluation,
    read_run_comparison,
    runs_headlines,
    runs_tables,
    strongest_of,
)
from vcloud.evaluation.metrics import compute_all
from vcloud.evaluation.predict import build_predictor
from vcloud.evaluation.protocols import EVAL_SEED, fixed_samples
from vcloud.export import images as im
from vcloud.io import fresh_staging_dir, remove_path
from vcloud.registry import VIEWER_STAGES, get_stage, require_checkpoints
from vcloud.wind.stage_orders import load_wind_orders

log = logging.getLogger(__name__)

VIEWER_VERSION = 1
IMAGES = "images"  # folder of the quicklooks, beside index.html
THUMBNAILS = "thumbnails.png"  # contact sheet for the run report
THUMBNAIL_ROWS = 6
SHOWN = tuple(get_stage(n) for n in VIEWER_STAGES)  # registry: stages with a viewer_label
LAST = SHOWN[-1].name  # the pipeline's output: its error layer, the page's sort order
THUMBNAIL_LAYERS = ("input", *(stage.name for stage in SHOWN), "truth", "error")
# Inlined after viewer.css and viewer.js when the page has a comparison of runs (data["comparison"]).
COMPARISON_ASSETS = ("experiments.css", "experiments.js")


def needed_checkpoints() -> tuple[int, ...]:
    """The stages whose best.pt the shown stages' predictors read (registry.predictor_needs)."""
    return tuple(sorted({n for stage in SHOWN for n in stage.predictor_needs}))


@dataclass(frozen=True)
class Layer:
    key: str
    label: str
    swipe: bool = True  # same geometry as the target image: can take part in a comparison


LAYERS = (
    Layer("input", "cloudy input (target date)"),
    Layer("context", "other input dates", swipe=False),
    Layer("cloud", "cloud probability"),
    Layer("s1", "S1 VV"),
    *(Layer(stage.name, stage.viewer_label) for stage in SHOWN),
    Layer("truth", "ground truth"),
    Layer("error", f"error of stage {SHOWN[-1].number}"),
)
METHODS = {
    **{stage.name: stage.viewer_label for stage in SHOWN},
    "least_cloudy_date": "least-cloudy date (baseline)",
    "median_mosaic": "median mosaic (baseline)",
}


def pick_samples(total: int, count: int, seed: int) -> list[int]:
    """`count` distinct sample indices of `total`, in ascending order; a pure function of seed."""
    if total <= 0:
        return []
    chosen = np.random.default_rng(seed).choice(total, size=min(count, total), replace=False)
    return sorted(int(i) for i in chosen)


def comparison_section(path: Path, *, run: tuple[str, str] | None) -> dict:
    """The page's "Experiments compared" of a research run: vcloud compare's JSON `path` laid out
    as results/compare.md lays it out (every cell formatted here; the page only places them), and
    which run's samples the page shows, `run` = (experiment, seed; "-": the model config's seeds).
    BadInputError naming the file for one that is not a comparison; ConfigError for a `run` it
    does not have."""
    comparison = read_run_comparison(path)
    if run is None:
        raise ConfigError("--comparison: give --run EXPERIMENT SEED too, the run whose checkpoints the page shows")
    experiment, seed = str(run[0]), str(run[1])
    experiments = list(dict.fromkeys(row["experiment"] for row in comparison["rows"]))
    seeds = ["-" if s is None else str(s) for s in comparison["seeds"]]
    if experiment not in experiments or seed not in seeds:
        raise ConfigError(
            f"--run {experiment} {seed}: not a run of {path} (experiments {', '.join(experiments)}; "
            f"seeds {', '.join(seeds)})"
        )
    layout = runs_tables(comparison, markup=False)
    who = f"{experiment}, seed {seed}" if seed != "-" else f"{experiment} (the model config's seeds)"
    role = " (the baseline)" if experiment == comparison["baseline"] else ""
    shown = tuple(stage.number for stage in SHOWN)
    lines = [line["text"] for line in runs_headlines(comparison, stages=shown) if line["experiment"] == experiment]
    return {
        "headlines": {
            "title": STRONGEST,
            "note": f"Each shown stage of {experiment} over its seeds, on the test split (vcloud compare, {path}).",
            "lines": lines,
        },
        "title": "Experiments compared",
        "source": str(path),
        "baseline": comparison["baseline"],
        "decided_on": comparison["decided_on"],
        "run": {"experiment": experiment, "seed": seed},
        "notes": layout["notes"],
        # every experiment's lines, as results/compare.md opens with them
        "strongest": [line["text"] for line in layout["headlines"]],
        "shown": f"The samples below are one run's: {who}{role}. The tables are every run's.",
        "header": layout["header"],
        "tables": layout["tables"],
    }


def evaluation_headlines(reports: list[Path]) -> dict:
    """The page's opening of a run: each shown stage against the strongest simple answer, per
    protocol, from its evaluation reports (results/eval/stage<n>.json; the words of
    scoring.headline), with the context policy's fallbacks counted where there are any. Reports of
    stages the page does not show are left out; BadInputError naming a file that is no report."""
    shown = {stage.number for stage in SHOWN}
    lines = []
    for path in reports:
        report = read_evaluation(path)
        if int(report["stage"]) not in shown:
            continue
        for protocol, result in report["protocols"].items():
            parts = [t for t in (headline(strongest_of(result)), fallbacks(result)) if t]
            if parts:
                lines.append(f"stage {report['stage']}, {protocol}: " + "; ".join(parts))
    return {
        "title": STRONGEST,
        "note": "Each shown stage on the test split, per protocol (results/eval/stage<n>.json).",
        "lines": lines,
    }


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy()


def _layers(batch: dict, outputs: dict[str, torch.Tensor], bands: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The quicklooks of one sample (batch of one) as (H, W, 3) uint8 arrays; `bands`: the store's."""
    x = _numpy(batch["x"][0])  # (T, 17, H, W): 13 S2, 2 S1, S1 validity, cloud probability
    target = int(batch["target_index"][0])
    truth = _numpy(batch["target"][0])
    output = _numpy(outputs[LAST][0])
    rgb = lambda s2: im.true_colour(s2, bands)  # noqa: E731
    context = [rgb(x[t, S2_CHANNELS]) for t in range(x.shape[0]) if t != target]
    return {
        "input": rgb(x[target, S2_CHANNELS]),
        "context": im.strip(context) if context else rgb(x[target, S2_CHANNELS]),
        "cloud": im.grey(_numpy(batch["target_prob"][0])),
        "s1": im.grey(_numpy(batch["target_s1"][0, 0])),
        **{stage.name: rgb(_numpy(outputs[stage.name][0])) for stage in SHOWN},
        "truth": rgb(truth),
        "error": im.error_map(output, truth),
    }


def _contact_sheet(rows: list[dict[str, np.ndarray]]) -> np.ndarray:
    """THUMBNAIL_LAYERS side by side, one row per sample, enlarged to at least 96 px a tile."""
    size = rows[0]["input"].shape[0]
    factor = max(1, -(-96 // size))
    gap = 4
    lines = []
    for row in rows:
        lines.append(im.strip([im.upscale(row[key], factor) for key in THUMBNAIL_LAYERS], gap=gap))
        lines.append(np.full((gap, lines[-1].shape[1], 3), 255, np.uint8))
    return np.concatenate(lines[:-1], axis=0)


@torch.no_grad()
def export_viewer(
    *,
    store: Path,
    checkpoints: dict[int, Path],
    config_path: Path,
    out: Path,
    samples: int,
    seed: int,
    wind_cache: Path | None = None,
    fixed_protocol: Path | None = None,
    comparison: Path | None = None,
    run: tuple[str, str] | None = None,
    evaluations: list[Path] | None = None,
) -> dict:
    """Write out/index.html, out/images/*.png and out/thumbnails.png; return the page's data.

    `checkpoints` maps stage numbers to best.pt paths: those of needed_checkpoints();
    `fixed_protocol`: the detection of `vcloud fixed-protocol` for this store and config;
    `comparison`: a research run's results/compare.json, shown above the samples, and `run`
    (experiment, seed) the run the checkpoints are of (comparison_section); `evaluations`: the
    shown stages' evaluation reports, whose lines against the strongest simple answer open the page
    (evaluation_headlines; a research run's come from the comparison)."""
    if samples < 1:
        raise ConfigError(f"--samples: {samples}; the viewer shows at least one sample")
    if run is not None and comparison is None:
        raise ConfigError("--run: names the run of a research run's viewer; give --comparison too")
    # Read before anything is computed or written: a bad file stops the export in one line.
    section = None if comparison is None else comparison_section(comparison, run=run)
    opening = None if not evaluations else evaluation_headlines(evaluations)
    command = "vcloud export-viewer"
    checkpoints = require_checkpoints(needed_checkpoints(), checkpoints, command=command)
    cfg = load_model_config(config_path)
    torch.manual_seed(EVAL_SEED)
    dataset = fixed_samples(store, cfg, detected=fixed_protocol)  # a bad detection file fails first
    reader = dataset.reader  # the store, opened once
    wind = load_wind_orders(cfg, store=reader, wind_cache=wind_cache, world_size=1, command=command)
    predictors = {stage.name: build_predictor(stage.number, cfg, checkpoints, wind) for stage in SHOWN}
    out = Path(out)
    staging = fresh_staging_dir(out)
    (staging / IMAGES).mkdir()
    try:
        entries, sheet_rows = [], []
        for index in pick_samples(len(dataset), samples, seed):
            location, target_t, dates, target_index, kind = dataset.pick(index)
            batch = default_collate([dataset[index]])
            outputs = {name: predict(batch).float().clamp(0, 1) for name, predict in predictors.items()}
            outputs["least_cloudy_date"] = least_cloudy(batch["x"], batch["target_index"]).float()
            outputs["median_mosaic"] = median_mosaic(batch["x"], batch["target_index"]).float()
            target = batch["target"].float()
            metrics = {}
            for method in METHODS:
                values = compute_all(outputs[method], target)
                metrics[method] = {m: round(float(v[0]), 4) for m, v in values.items()}
            layers = _layers(batch, outputs, reader.s2_bands)
            names = {}
            for key, image in layers.items():
                names[key] = f"{IMAGES}/s{index:04d}_{key}.png"
                im.write_png(staging / names[key], image)
            if len(sheet_rows) < THUMBNAIL_ROWS:
                sheet_rows.append(layers)
            day = reader.date_s2[location].astype("datetime64[D]")
            entries.append(
                {
                    "index": index,
                    "location": reader.locations[location],
                    "date": str(day[target_t]),
                    "cloud_class": kind,
                    "context": [
                        {"date": str(day[t]), "days": int((day[t] - day[target_t]).astype(np.int64))}
                        for slot, t in enumerate(dates)
                        if slot != target_index
                    ],
                    "images": names,
                    "metrics": metrics,
                }
            )
        data = {
            "version": VIEWER_VERSION,
            "title": f"vcloud viewer: {Path(store).name}",
            "store": str(store),
            "model_set": cfg.name,
            "protocol": "fixed: seeded synthetic thin/thick/opaque clouds on clear dates (as results/eval)",
            "stretch": im.STRETCH_NOTE,
            "cloud_classes": list(CLOUD_CLASSES),
            "layers": [{"key": layer.key, "label": layer.label, "swipe": layer.swipe} for layer in LAYERS],
            "methods": METHODS,
            "sort_method": LAST,
            "samples": entries,
        }
        if section is not None:
            data["comparison"] = section
        if opening is not None:
            data["headlines"] = opening
        if sheet_rows:
            im.write_png(staging / THUMBNAILS, _contact_sheet(sheet_rows))
        else:
            im.write_png(staging / THUMBNAILS, np.full((8, 8, 3), 255, np.uint8))
        (staging / "index.html").write_text(render_page(data), encoding="utf-8")
        # Into place; index.html last, so a page that exists has its images.
        shutil.rmtree(out / IMAGES, ignore_errors=True)
        os.replace(staging / IMAGES, out / IMAGES)
        os.replace(staging / THUMBNAILS, out / THUMBNAILS)
        os.replace(staging / "index.html", out / "index.html")
    finally:
        remove_path(staging)
    log.info("viewer: %d samples of %s -> %s", len(entries), store, out / "index.html")
    return data


def _asset(name: str) -> str:
    return resources.files("vcloud.export").joinpath("assets", name).read_text(encoding="utf-8")


def render_page(data: dict) -> str:
    """index.html with the CSS, the script and the data inlined (no fetch: file:// works)."""
    payload = json.dumps(data, indent=None, separators=(",", ":"))
    payload = payload.replace("</", "<\\/")  # never closes the script element early
    css, script = _asset("viewer.css"), _asset("viewer.js")
    if "comparison" in data:  # only then: a page without one keeps its bytes
        css += "\n" + _asset(COMPARISON_ASSETS[0])
        script += "\n" + _asset(COMPARISON_ASSETS[1])
    values = {
        "/*VCLOUD_CSS*/": css,
        "/*VCLOUD_JS*/": script,
        "VCLOUD_DATA": payload,
        "VCLOUD_TITLE": html.escape(data["title"]),
    }
    page = _asset("index.html")
    for marker in values:
        assert page.count(marker) == 1, f"assets/index.html: marker {marker} must appear once"
    # One pass: text put in is never searched for markers again.
    pattern = "|".join(re.escape(marker) for marker in values)
    return re.sub(pattern, lambda match: values[match.group(0)], page)
