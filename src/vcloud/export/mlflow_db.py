"""The offline tracking export: every run's resolved config, per-epoch metrics and scores in one
MLflow SQLite database (`vcloud export-mlflow`, rule export_mlflow; docs/evaluation.md).

Layout: one MLflow experiment per vcloud experiment; in it one parent run per vcloud run (a seed
of the experiment: its resolved model config as params, every stage's scores per split and
protocol as metrics) and one child run per stage the run trained (the stage's own config as
params, metrics.jsonl's rows as metrics with step = epoch). A stage shared by several runs (the
same identity, trained once: docs/workflow.md) is one child, under the run that trained it; the
other runs name its folder in a tag. So no curve is logged twice, and none under an experiment
that did not train it, while each parent still carries all the scores its seed is compared on.

Idempotent: every MLflow run is found again by its tag `vcloud.key` (what it is, never its
name): a parent by its folder and config hash, a stage by its folder and stage hash. Each stage
run records how many rows it has (`vcloud.rows`, with the wall time of the last): a resumed
stage gets only its new epochs, and a second export of unchanged results writes nothing. A
stage trained again from scratch under the same hash (its rows no longer start as before) is a
new MLflow run; the old one stays, tagged `vcloud.current` false, as does a run whose config
changed. Metric timestamps are the rows' own wall times, so a row logged twice (an export
killed between the rows and the tag) is the same row, which MLflow keeps once.

One writer, never SQLite on a parallel filesystem: the database is copied to a node-local
temporary folder, exported there, and copied back under a temporary name and renamed over the
old one. A killed export leaves the old database as it was, and the next one does all of it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

from vcloud.errors import BadInputError, ConfigError
from vcloud.export.tracking import RunRecord, RunSpec, StageRecord, collect
from vcloud.train.records import scalars

log = logging.getLogger(__name__)

KEY = "vcloud.key"
ROWS = "vcloud.rows"
CURRENT = "vcloud.current"
INSTALL = "pip install 'vcloud[mlflow]' (or: pip install mlflow-skinny sqlalchemy alembic)"


def export_mlflow(specs: list[RunSpec], *, results: str, db: Path) -> dict[str, int]:
    """Export the runs `specs` into the SQLite database `db`; returns what was written."""
    records = collect(specs, results=results)  # every file read and checked before the database
    client_class = _mlflow_client()
    db = Path(db)
    work = Path(tempfile.mkdtemp(prefix="vcloud-mlflow-"))
    try:
        local = work / "mlflow.db"
        if db.exists():
            shutil.copyfile(db, local)
        writer = _Writer(_open(client_class, local, db))
        writer.write(records)
        if writer.counts["changes"] or not db.exists():
            from vcloud.io import atomic_output

            with atomic_output(db) as staged:
                shutil.copyfile(local, staged)
        else:
            os.utime(db)  # newer than its inputs for snakemake; not a byte changed
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dict(writer.counts)


def _mlflow_client():
    from importlib.util import find_spec

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # compute nodes have no network
    # mlflow-skinny's SQLite store needs these two but does not require them: asked first, by name.
    missing = [name for name in ("sqlalchemy", "alembic") if find_spec(name) is None]
    try:
        if missing:
            raise ImportError(f"No module named {missing[0]}")
        from mlflow import MlflowClient
    except ImportError as err:
        raise ConfigError(f"the MLflow export needs MLflow's SQLite tracking store ({err}): {INSTALL}") from None
    for name in ("alembic", "mlflow"):  # their setup and schema messages, at INFO on every start
        logging.getLogger(name).setLevel(logging.WARNING)
    return MlflowClient


def _open(client_class, local: Path, db: Path):
    try:
        client = client_class(tracking_uri=f"sqlite:///{local.resolve()}")
        client.search_experiments(max_results=1)  # opens (and on a new file creates) the schema
    except Exception as err:  # MlflowException, sqlalchemy errors: the file is not a store it can use
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise BadInputError(f"{db}: not an MLflow SQLite database this MLflow can open ({first})") from None
    return client


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


class _Writer:
    def __init__(self, client) -> None:
        from mlflow.entities import ViewType

        self.client = client
        self.counts: dict[str, int] = defaultdict(int)
        self.experiments: dict[str, str] = {}
        self.runs: dict[str, object] = {}  # vcloud.key -> the MLflow run (as read at the start)
        token = None
        ids = []
        while True:
            page = client.search_experiments(view_type=ViewType.ACTIVE_ONLY, page_token=token)
            ids += [e.experiment_id for e in page]
            token = page.token
            if not token:
                break
        token = None
        while ids:
            page = client.search_runs(ids, run_view_type=ViewType.ACTIVE_ONLY, max_results=10000, page_token=token)
            for run in page:
                key = run.data.tags.get(KEY)
                if key in self.runs:
                    raise BadInputError(
                        f"MLflow runs {self.runs[key].info.run_id} and {run.info.run_id} are both {key}"
                    )
                if key:
                    self.runs[key] = run
            token = page.token
            if not token:
                break

    def write(self, records: list[RunRecord]) -> None:
        stages = {stage.folder: stage for record in records for stage in record.own_stages}
        users = defaultdict(list)  # stage folder -> the run folders that read it
        for record in records:
            for folder in record.stage_folders.values():
                users[folder].append(record.spec.folder)
        current = set()
        for record in records:
            parent = self._parent(record, stages)
            current.add(parent.data.tags[KEY])
            for stage in record.own_stages:
                current.add(self._stage(record, parent, stage, users[stage.folder]))
            mine = [stages.get(folder) for folder in record.stage_folders.values()]
            if all(stage is not None and stage.finished for stage in mine):
                self._finish(parent, max(_ms(stage.rows[-1]["wall_time"]) for stage in mine))
        folders = {r.spec.folder for r in records} | set(stages)
        for key, run in self.runs.items():
            tags = run.data.tags
            if tags.get("vcloud.folder") in folders and key not in current and tags.get(CURRENT) != "false":
                self._tag(run, {CURRENT: "false"})

    # --- MLflow runs ---------------------------------------------------------------------
    def _experiment(self, name: str) -> str:
        if name not in self.experiments:
            found = self.client.get_experiment_by_name(name)
            if found is not None and found.lifecycle_stage != "active":
                raise BadInputError(
                    f"MLflow experiment {name!r} is deleted in the database: restore it (mlflow experiments "
                    "restore) or remove it for good (mlflow gc), then export again"
                )
            if found is None:
                self.counts["changes"] += 1
                self.counts["experiments"] += 1
                self.experiments[name] = self.client.create_experiment(name, tags={"vcloud.experiment": name})
            else:
                self.experiments[name] = found.experiment_id
        return self.experiments[name]

    def _run(self, experiment: str, key: str, *, name: str, tags: dict, start: int | None):
        """The MLflow run of `key`, made with `tags` if there is none; its tags brought up to date."""
        run = self.runs.get(key)
        if run is None:
            self.counts["changes"] += 1
            self.counts["runs"] += 1
            run = self.client.create_run(
                self._experiment(experiment), start_time=start, tags={KEY: key, CURRENT: "true", **tags}, run_name=name
            )
            self.runs[key] = run
            return run
        self._tag(run, {CURRENT: "true", **tags})
        return run

    def _tag(self, run, tags: dict) -> None:
        for name, value in tags.items():
            if run.data.tags.get(name) != value:
                self.client.set_tag(run.info.run_id, name, value)
                run.data.tags[name] = value
                self.counts["changes"] += 1

    def _params(self, run, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        have = run.data.params
        for name, value in params.items():
            if name in have and have[name] != value:
                raise BadInputError(
                    f"MLflow run {run.info.run_id} ({run.data.tags[KEY]}) has {name}={have[name]!r}, the "
                    f"results say {value!r}: params never change (was the database made from other results?)"
                )
        new = [Param(name, value) for name, value in params.items() if name not in have]
        if new:
            self.client.log_batch(run.info.run_id, params=new)
            have.update({p.key: p.value for p in new})
            self.counts["changes"] += len(new)
            self.counts["params"] += len(new)

    def _metrics(self, run, metrics: list) -> None:
        if metrics:
            self.client.log_batch(run.info.run_id, metrics=metrics)
            self.counts["changes"] += len(metrics)
            self.counts["metrics"] += len(metrics)

    def _finish(self, run, end: int) -> None:
        if run.info.status != "FINISHED":
            self.client.set_terminated(run.info.run_id, "FINISHED", end_time=end)
            self.counts["changes"] += 1

    # --- what is written -----------------------------------------------------------------
    def _parent(self, record: RunRecord, stages: dict[str, StageRecord]):
        from mlflow.entities import Metric

        spec = record.spec
        seed = "-" if spec.seed is None else str(spec.seed)
        tags = {
            "vcloud.kind": "run",
            "vcloud.experiment": spec.experiment,
            "vcloud.seed": seed,
            "vcloud.folder": spec.folder,
            "vcloud.model_config": spec.model_config,
            "vcloud.config_hash": record.config_hash,
        }
        for n, folder in record.stage_folders.items():
            tags[f"vcloud.stage{n}"] = folder
            tags[f"vcloud.stage{n}.hash"] = record.stage_hashes[n]
        starts = [_ms(stages[f].rows[0]["wall_time"]) for f in record.stage_folders.values() if f in stages]
        name = spec.experiment if spec.seed is None else f"{spec.experiment}/seed{spec.seed}"
        key = f"run|{spec.folder}|{record.config_hash}"
        run = self._run(spec.experiment, key, name=name, tags=tags, start=min(starts, default=None))
        self._params(run, record.params)
        latest = run.data.metrics
        new = [Metric(k, v, when, 0) for k, (v, when) in sorted(record.scores.items()) if latest.get(k) != v]
        self._metrics(run, new)
        latest.update({m.key: m.value for m in new})
        return run

    def _stage(self, record: RunRecord, parent, stage: StageRecord, users: list[str]) -> str:
        from mlflow.entities import Metric

        spec = record.spec
        key = f"stage|{stage.folder}|{stage.stage_hash}"
        rows = stage.rows
        run = self.runs.get(key)
        if run is not None and not _continues(run.data.tags.get(ROWS), rows):
            # Trained again from the start under the same hash: a new MLflow run, the old one kept.
            self._tag(run, {KEY: f"{key}|superseded:{run.info.run_id}", CURRENT: "false"})
            del self.runs[key]
            self.runs[run.data.tags[KEY]] = run
        tags = {
            "vcloud.kind": "stage",
            "vcloud.stage": str(stage.number),
            "vcloud.stage_hash": stage.stage_hash,
            "vcloud.experiment": spec.experiment,
            "vcloud.seed": "-" if spec.seed is None else str(spec.seed),
            "vcloud.folder": stage.folder,
            "vcloud.used_by": ",".join(users),
            "mlflow.parentRunId": parent.info.run_id,
        }
        name = f"{parent.info.run_name}/stage{stage.number}"
        run = self._run(spec.experiment, key, name=name, tags=tags, start=_ms(rows[0]["wall_time"]))
        self._params(run, stage.params)
        done = _logged(run.data.tags.get(ROWS))
        new = [
            Metric(metric, value, _ms(row["wall_time"]), row["epoch"])
            for row in rows[done:]
            for metric, value in sorted(scalars(row).items())
        ]
        self._metrics(run, new)  # then the count: killed in between, the rows are logged again, kept once
        self._tag(run, {ROWS: json.dumps([len(rows), _ms(rows[-1]["wall_time"])])})
        if stage.finished:
            self._finish(run, _ms(rows[-1]["wall_time"]))
        return key


def _logged(tag: str | None) -> int:
    return json.loads(tag)[0] if tag else 0


def _continues(tag: str | None, rows: list[dict]) -> bool:
    """The rows an MLflow run has (its `vcloud.rows`: count, last wall time) start the file's rows."""
    if not tag:
        return True
    count, last = json.loads(tag)
    return count <= len(rows) and _ms(rows[count - 1]["wall_time"]) == last
