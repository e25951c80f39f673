"""What the offline tracking export reads: every run's resolved config, each stage's epochs and
each stage's scores, gathered and checked before the MLflow database is touched.

A run is one experiment under one seed (vcloud.config.experiments), given as its results folder
and its resolved model config (`results/<experiment>/seed<k>/model.yaml`, written by
`vcloud run-config`; a single run's is config.model_config). Where each stage and evaluation of
a run lies - its own folder, or the folder of the earlier run that made it with the same
identity - comes from the workflow's own rule (vcloud.config.identities.run_paths), so the export
reads exactly the files the rules wrote. Nothing here imports MLflow (vcloud.export.mlflow_db writes).

A stage not trained yet (no metrics.jsonl) or not scored yet (no report) is left out and said;
a file that is there but damaged is refused in one line naming it: a torn or non-JSON line, a
row without an integer epoch or a wall time, an epoch twice or one missing between two others.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

from vcloud.errors import BadInputError
from vcloud.registry import STAGES

log = logging.getLogger(__name__)

SPLITS = ("test", "val")
# The model's scores of each protocol that are exported (the report keeps the per-sample values,
# the baselines and the paired differences: docs/evaluation.md).
SCORE_METRICS = ("psnr", "ssim", "sam", "mae", "rmse")
MAX_PARAM_LENGTH = 6000  # MLflow's limit on a param value


@dataclass(frozen=True)
class RunSpec:
    """A run as the command line names it: EXPERIMENT SEED FOLDER MODEL_CONFIG."""

    experiment: str
    seed: int | None  # None: the model config's own seeds (no `seeds:` list)
    folder: str  # results/<experiment>/seed<k>, or results for the single run
    model_config: str


@dataclass(frozen=True)
class StageRecord:
    """One stage's training, as made by the run that trained it (its home)."""

    number: int
    folder: str  # results/<...>/stage<n>
    stage_hash: str
    epochs: int  # train.epochs: the stage is finished when its last row is epoch epochs - 1
    params: dict[str, str]
    rows: list[dict]  # metrics.jsonl, by epoch (-1: the validated start)

    @property
    def finished(self) -> bool:
        return bool(self.rows) and self.rows[-1]["epoch"] >= self.epochs - 1


@dataclass(frozen=True)
class RunRecord:
    spec: RunSpec
    config_hash: str
    params: dict[str, str]
    stage_folders: dict[int, str]  # each stage's folder, its own or the run's it shares
    stage_hashes: dict[int, str]
    own_stages: list[StageRecord]  # the stages this run trained (metrics.jsonl present)
    scores: dict[str, tuple[float, int]] = field(default_factory=dict)  # key -> (value, ms)


def collect(specs: list[RunSpec], *, results: str) -> list[RunRecord]:
    """Read and check everything the export writes, in the runs' order (experiments, then seeds:
    the order in which the workflow gives a shared stage to the first run that has it)."""
    from vcloud.config import config_hash, config_to_dict, load_model_config, stage_config_dict
    from vcloud.config.experiments import Run
    from vcloud.config.identities import run_paths

    runs, model_sets = [], []
    for spec in specs:
        if not Path(spec.model_config).is_file():
            raise BadInputError(f"{spec.model_config}: model config of run {spec.folder} not found")
        model_set = load_model_config(Path(spec.model_config))
        runs.append(Run(spec.experiment, spec.seed, _prefix(spec.folder, results), {}, model_set))
        model_sets.append(model_set)
    # The wind cache's home is not exported: any patch size the CFDT takes gives the same homes of
    # the stages and evaluations, which depend on the model config alone.
    patch = 2 ** (len(model_sets[0].stage1.model.widths) - 1) if model_sets else 1
    all_paths = run_paths(runs, prepared="", results=results, patch_size=patch)
    records = []
    for spec, model_set, paths in zip(specs, model_sets, all_paths):
        shared = {key for key, _ in paths.homes}
        stages, folders, hashes = [], {}, {}
        for stage in STAGES:
            n = stage.number
            folders[n] = paths.stage_dir(n)
            hashes[n] = config_hash(stage_config_dict(model_set, n))
            if f"stage{n}" in shared:
                continue  # trained by an earlier run: exported there
            metrics = Path(paths.metrics_log(n))
            if not metrics.is_file():
                log.info("%s: not there yet, stage %d of %s left out", metrics, n, spec.folder)
                continue
            stages.append(
                StageRecord(
                    number=n,
                    folder=folders[n],
                    stage_hash=hashes[n],
                    epochs=getattr(model_set, stage.name).train.epochs,
                    params=flatten(stage_config_dict(model_set, n)),
                    rows=read_rows(metrics),
                )
            )
        scores = {}
        for split in SPLITS:
            for stage in STAGES:
                report = Path(paths.eval_report(stage.number, split))
                if report.is_file():
                    scores.update(read_scores(report, stage=stage.number, split=split))
        records.append(
            RunRecord(
                spec=spec,
                config_hash=config_hash(model_set),
                params=flatten(config_to_dict(model_set)),
                stage_folders=folders,
                stage_hashes=hashes,
                own_stages=stages,
                scores=scores,
            )
        )
    return records


def tracking_inputs(run_paths: list, *, research: bool) -> list[str]:
    """Rule export_mlflow's inputs: every run's metrics.jsonl and evaluations (val too in research
    runs) and a research run's model config, each shared file once."""
    from vcloud.registry import STAGE_NUMBERS

    splits = SPLITS if research else ("test",)
    files = []
    for paths in run_paths:
        files += [paths.metrics_log(stage) for stage in STAGE_NUMBERS]
        files += [paths.eval_report(stage, split) for split in splits for stage in STAGE_NUMBERS]
        files += [paths.run_model_config()] if research else []
    return list(dict.fromkeys(files))


def tracking_flags(runs: list, run_paths: list, *, model_config: str | None) -> str:
    """vcloud export-mlflow's --run EXPERIMENT SEED FOLDER MODEL_CONFIG per run, in the workflow's
    order; `model_config` for the single run (config.model_config), None for research runs (each
    its own run_config's model.yaml)."""
    import shlex

    return " ".join(
        f"--run {run.experiment} {'-' if run.seed is None else run.seed} {shlex.quote(paths.results)} "
        + shlex.quote(model_config or paths.run_model_config())
        for run, paths in zip(runs, run_paths, strict=True)
    )


def _prefix(folder: str, results: str) -> str:
    """The run's prefix under the results folder ("" for the single run, "/<experiment>/seed<k>")."""
    try:
        relative = Path(folder).relative_to(Path(results))
    except ValueError:
        raise BadInputError(f"{folder}: run folder is not under the results folder {results}") from None
    return "" if str(relative) == "." else f"/{relative.as_posix()}"


def flatten(tree: dict, prefix: str = "") -> dict[str, str]:
    """A nested config as MLflow params: dotted keys, values as JSON (strings as they are)."""
    out: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
            continue
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        out[name] = text if len(text) <= MAX_PARAM_LENGTH else text[: MAX_PARAM_LENGTH - 6] + " (cut)"
    return out


def read_rows(path: Path) -> list[dict]:
    """metrics.jsonl's rows, checked and sorted by epoch; a damaged file is refused in one line."""
    rows: dict[int, dict] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        try:
            row = json.loads(line)
        except ValueError as err:
            raise BadInputError(f"{path}:{number}: not a JSON line ({err})") from None
        epoch = row.get("epoch") if isinstance(row, dict) else None
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            raise BadInputError(f"{path}:{number}: no integer 'epoch' in the row")
        wall = row.get("wall_time")
        if isinstance(wall, bool) or not isinstance(wall, (int, float)) or not math.isfinite(wall):
            raise BadInputError(f"{path}:{number}: no 'wall_time' (seconds) in the row of epoch {epoch}")
        if epoch in rows:
            raise BadInputError(f"{path}:{number}: epoch {epoch} a second time")
        rows[epoch] = row
    epochs = sorted(rows)
    for before, after in zip(epochs, epochs[1:]):
        if after != before + 1:
            raise BadInputError(f"{path}: epoch {before + 1} missing (the rows go from epoch {before} to {after})")
    return [rows[epoch] for epoch in epochs]


def read_scores(path: Path, *, stage: int, split: str) -> dict[str, tuple[float, int]]:
    """An evaluation report's model scores as `<split>/stage<n>/<protocol>/<metric>` -> (value,
    the report's time in ms); a protocol not run has its `samples` (0) only."""
    try:
        report = json.loads(Path(path).read_text())
    except ValueError as err:
        raise BadInputError(f"{path}: not a JSON evaluation report ({err})") from None
    if not isinstance(report, dict) or report.get("stage") != stage or not isinstance(report.get("protocols"), dict):
        raise BadInputError(f"{path}: not the evaluation report of stage {stage} (no 'stage': {stage}, 'protocols')")
    when = int(Path(path).stat().st_mtime * 1000)
    out = {}
    for protocol, result in report["protocols"].items():
        prefix = f"{split}/stage{stage}/{protocol}"
        if not isinstance(result, dict) or not isinstance(result.get("samples"), int):
            raise BadInputError(f"{path}: protocols.{protocol}: no sample count")
        out[f"{prefix}/samples"] = (float(result["samples"]), when)
        model = result.get("model") or {}
        values = {m: (model.get("mean") or {}).get(m) for m in SCORE_METRICS}
        values["seen_mae"] = model.get("seen_mae")
        for metric, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                out[f"{prefix}/{metric}"] = (float(value), when)
    return out
