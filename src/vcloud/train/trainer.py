"""The one training loop every stage shares: parse -> build -> train -> close.

A stage hands the loop a `StageTask` (its model, datasets, loss and validation); the loop owns
everything the LUMI field reports taught us to get right once:
- device "cuda" when available (ROCm maps it) else CPU; bf16 autocast, no GradScaler (bf16
  has fp32's range: a scaler only skips steps, 75-87 % of them on LUMI);
- DataLoader multiprocessing options only when num_workers > 0;
- one run per output folder (train/lock.py); leftover temp files of killed writes removed;
- a stage's identity (resume key: settings, upstream identities and upstream weights) in every
  checkpoint; a latest.pt of another identity, or any with `fresh`, is set aside, never resumed;
- checkpoints through one object, checkpoint.Checkpointer (save, load, the resume decision);
  the loop's own state (epoch, step, best, rows) is its state_dict(), saved beside the weights;
- latest.pt every epoch and at the next step boundary after SIGTERM/SIGUSR1 (then exit so
  SLURM can requeue), best.pt on validation improvement, both atomic; resume restores model,
  optimizer, scheduler, RNG states, curriculum position (the epoch) and data order (the
  sampler position), so a killed and resumed run ends bit-identical to an uninterrupted one;
- latest.pt is the one record of an epoch's end (best weights and metrics rows included):
  best.pt, metrics.jsonl and TensorBoard are views of it, re-created when missing or behind,
  so a kill at any point - or snakemake deleting an interrupted job's best.pt - loses nothing,
  and a finished stage is never trained again (a missing best.pt is re-created, not retrained);
- DDP from torchrun or SLURM variables; only rank 0 writes;
- a NaN/inf loss stops the run with stage, epoch and step; the last good checkpoint stays;
- a tqdm bar per epoch, one metrics line per epoch in metrics.jsonl, TensorBoard scalars.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from vcloud.config import DataConfig, TrainConfig
from vcloud.data.samples import EpochSampler
from vcloud.errors import StopRequested, VcloudError
from vcloud.evaluation.metrics import MetricAccumulator
from vcloud.train import checkpoint as ckpt
from vcloud.train import distributed as dist_utils
from vcloud.train import lock as out_lock
from vcloud.train import optim, records

log = logging.getLogger(__name__)


class TrainingDiverged(VcloudError):
    """The loss became NaN or infinite."""


@dataclass
class StageTask:
    """What a stage gives the loop. `loss` gets the (DDP-wrapped) model and a device batch."""

    stage: int
    model: nn.Module
    train_set: Dataset
    val_set: Dataset | None
    loss: Callable[[nn.Module, dict], torch.Tensor]
    validate: Callable[[nn.Module, dict], dict[str, torch.Tensor]]  # per-sample metrics
    best_metric: str = "psnr"  # higher is better
    on_epoch_start: Callable[[int], dict] | None = None  # e.g. the curriculum phase, logged
    summary: dict = field(default_factory=dict)  # stage facts for the metrics log
    artifacts: dict = field(default_factory=dict)  # name -> JSON-able, written as <out>/<name>.json
    # Validate the untrained model before epoch 0 and keep it as the first best candidate
    # (row "epoch": -1): a stage whose starting point is a safe fallback (stage 2's refiner
    # starts as "no correction") then never ships weights that validate worse than it.
    validate_initial: bool = False
    # More validation protocols beside val_set ("fixed"): name -> samples (the natural-cloud
    # protocols on the val split), scored with `validate` too. With any, an epoch is selected on
    # the mean of every protocol's mean `best_metric` (val_score), and with validate_initial it
    # may become best.pt only if it loses to the start (the predecessor stage) on no protocol by
    # more than the paired standard error of the per-sample difference (guard()).
    extra_val: dict[str, Dataset] = field(default_factory=dict)


FIXED = "fixed"  # the name of StageTask.val_set among the validation protocols


class Indexed(Dataset):
    """A validation set whose items carry their index (val_index), so that per-sample scores can
    be put back in sample order whatever rank scored them."""

    def __init__(self, base: Dataset):
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> dict:
        return {**self.base[index], "val_index": torch.tensor(int(index) % len(self.base))}


def guard(candidate: dict[str, list[float]], start: dict[str, list[float]]) -> dict[str, dict]:
    """Per protocol: does `candidate` lose to `start` by more than the paired standard error?

    candidate, start: protocol -> per-sample values (same samples, same order). Returns protocol ->
    {"difference": mean(candidate - start), "se": its paired standard error, "ok": difference >=
    -se}. A protocol with one sample has no spread: there ok is difference >= 0.
    """
    verdict = {}
    for name, values in candidate.items():
        d = torch.tensor(values, dtype=torch.float64) - torch.tensor(start[name], dtype=torch.float64)
        se = float(d.std(unbiased=True) / math.sqrt(len(d))) if len(d) > 1 else 0.0
        mean = float(d.mean())
        verdict[name] = {"difference": round(mean, 5), "se": round(se, 5), "ok": mean >= -se}
    return verdict


def loader_kwargs(data: DataConfig, *, batch_size: int) -> dict:
    """DataLoader options; the multiprocessing ones only with workers (else torch raises)."""
    kwargs: dict = {"batch_size": batch_size, "num_workers": data.num_workers, "pin_memory": False}
    if data.num_workers > 0:
        kwargs.update(
            prefetch_factor=data.prefetch_factor,
            persistent_workers=data.persistent_workers,
            multiprocessing_context="spawn",
        )
    return kwargs


def _to(batch: dict, device: str) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def _peak_memory_mb(device: str) -> float:
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


class Trainer:
    def __init__(
        self,
        task: StageTask,
        *,
        train_cfg: TrainConfig,
        data_cfg: DataConfig,
        out_dir: Path,
        resume_dir: Path | None = None,
        config_hash: str,
        config: dict,
        resume_key: str | None = None,
        fresh: bool = False,
        env: dist_utils.DistEnv,
        device: str,
        progress: bool = True,
        step_threads: int | None = None,
    ):
        """step_threads: torch's intra-op threads while the training loop runs (its DataLoader
        workers busy beside it); None keeps the process's setting throughout. resume_key: the
        stage's whole identity (checkpoint.resume_key; default config_hash). fresh: set an
        existing latest.pt aside and train from the start (vcloud train --fresh)."""
        self.task, self.cfg, self.data_cfg = task, train_cfg, data_cfg
        self.step_threads = step_threads
        self.out_dir = Path(out_dir)
        self.env, self.device = env, device
        self.main = dist_utils.is_main(env)
        self.progress = progress and self.main
        self.model = task.model.to(device)
        self.ddp_model: nn.Module = self.model
        if env.world_size > 1:
            self.ddp_model = nn.parallel.DistributedDataParallel(
                self.model, device_ids=[torch.cuda.current_device()] if device == "cuda" else None
            )
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = optim.build_optimizer(params, train_cfg)
        self.sampler = EpochSampler(
            len(task.train_set), rank=env.rank, world_size=env.world_size, shuffle=True, seed=train_cfg.seed
        )
        self.steps_per_epoch = math.ceil(self.sampler.per_rank / train_cfg.batch_size)
        total_steps = max(1, self.steps_per_epoch * train_cfg.epochs)
        self.scheduler = optim.build_scheduler(self.optimizer, total_steps=total_steps)
        self.epoch, self.step_in_epoch, self.best_value = 0, 0, -math.inf
        self.best_epoch: int | None = None  # epoch whose weights are best.pt
        self.rows: list[dict] = []  # one metrics row per finished epoch (also in latest.pt)
        self.partial: dict | None = None  # running sums of an epoch interrupted by a stop
        # Save, load and the resume decision: latest.pt, best.pt and their views.
        self.checkpointer = ckpt.Checkpointer(
            stage=task.stage,
            out_dir=self.out_dir,
            resume_dir=resume_dir,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            train_state=self,
            config=config,
            config_hash=config_hash,
            resume_key=resume_key,
            fresh=fresh,
            main=self.main,
            tensorboard=train_cfg.tensorboard,
            best_metric=task.best_metric,
        )
        # Built once: with persistent workers they (and their open stores) live across epochs.
        self.train_loader = self._loader(task.train_set, self.sampler)
        self.val_loader = None  # the first of val_loaders, None when there is none
        self.val_loaders: dict[str, DataLoader] = {}
        protocols = {FIXED: task.val_set, **task.extra_val} if task.val_set is not None else {}
        for name, dataset in protocols.items():
            val_sampler = EpochSampler(len(dataset), rank=env.rank, world_size=env.world_size, shuffle=False)
            self.val_loaders[name] = self._loader(Indexed(dataset), val_sampler)
        self.val_loader = next(iter(self.val_loaders.values()), None)

    # --- state (what the checkpointer saves beside the weights) ----------------------
    def state_dict(self) -> dict:
        """The loop's own state: where it is, the best so far and the metrics rows."""
        return {
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "best_value": self.best_value,
            "best_epoch": self.best_epoch,
            "metrics_rows": self.rows,
        }

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.step_in_epoch = state["epoch"], state["step_in_epoch"]
        self.best_value, self.best_epoch = state["best_value"], state["best_epoch"]
        self.rows = state["metrics_rows"]
        self.partial = state.get("partial_epoch")

    # --- loop --------------------------------------------------------------------------
    def fit(self) -> dict:
        lock = out_lock.OutputLock(self.out_dir)
        failed = None
        if self.main:
            try:
                lock.acquire()
            except VcloudError as err:
                failed = err
        # Every rank leaves together; a rank 0 that stopped alone would hang the others.
        if dist_utils.any_rank(failed is not None, self.device):
            raise failed or VcloudError(f"{self.out_dir}: rank 0 could not lock the output folder")
        try:
            return self._fit()
        finally:
            self.checkpointer.close()
            lock.release()

    def _fit(self) -> dict:
        self.checkpointer.remove_leftover_temps()
        if self.main:
            for name, content in self.task.artifacts.items():
                (self.out_dir / f"{name}.json").write_text(json.dumps(content, indent=1))
        if self.checkpointer.load():
            log.info("stage %d already finished (%s); nothing to do", self.task.stage, self.checkpointer.latest)
            return {"finished": True, "best_value": self.best_value}
        # Without a validation set there is nothing to compare with: the last epoch is best as usual.
        if self.task.validate_initial and self.val_loader is not None and self.epoch == 0 and self.step_in_epoch == 0:
            self._validate_initial()
        with ckpt.StopRequest() as stop:
            while self.epoch < self.cfg.epochs:
                record = self._train_epoch(stop)
                record.update(self._validate())
                self._end_epoch(record)
        return {"finished": True, "best_value": self.best_value}

    def _validate_initial(self) -> None:
        """Score the untrained model as epoch -1; it is best.pt until an epoch beats it.

        Not committed to latest.pt on its own: a run killed before epoch 0 ends starts fresh and
        redoes it; a stop inside epoch 0 saves it with the rows and the best weights.
        """
        record = {"epoch": -1, **self._validate()}
        value = self._selection_value(record)
        self.best_value, self.best_epoch = value, -1
        self.checkpointer.keep_best()
        self.checkpointer.write_best()
        record["best"] = True
        self._finish_record(record)
        self.rows = [r for r in self.rows if r.get("epoch") != -1] + [record]
        self.checkpointer.write_views(record)
        if self.main:
            log.info(
                "stage %d before training: val_%s %.4f (the value to beat)",
                self.task.stage,
                self.task.best_metric,
                value,
            )

    def _end_epoch(self, record: dict) -> None:
        """Judge the epoch, then commit it (Checkpointer.commit_epoch: latest.pt, then its views)."""
        value = self._selection_value(record)
        passes = self._passes_guard(record)  # judged (and kept in the row) on every epoch
        improved = value > self.best_value and passes
        if improved:
            self.best_value, self.best_epoch = value, self.epoch
            self.checkpointer.keep_best()
        record["best"] = improved
        self._finish_record(record)
        self.rows.append(record)
        self.epoch += 1
        self.step_in_epoch = 0
        self.partial = None
        self.checkpointer.commit_epoch(record, finished=self.epoch >= self.cfg.epochs, improved=improved)
        if self.main:
            shown = {
                k: (round(v, 4) if isinstance(v, float) else v)
                for k, v in record.items()
                if k not in ("wall_time", "val_per_sample")
            }
            log.info("stage %d epoch %d: %s", self.task.stage, record["epoch"], shown)

    def _selection_value(self, record: dict) -> float:
        """What best.pt is chosen on: val_score with several protocols, else val_<best_metric>."""
        key = "val_score" if "val_score" in record else f"val_{self.task.best_metric}"
        return float(record.get(key, -math.inf))

    def _passes_guard(self, record: dict) -> bool:
        """With several protocols and a validated start: the epoch loses to the start (row -1) on
        no protocol by more than the paired SE (guard()); the verdict is kept in the row."""
        start = next((r for r in self.rows if r.get("epoch") == -1), None)
        if "val_per_sample" not in record or start is None or "val_per_sample" not in start:
            return True
        verdict = guard(record["val_per_sample"], start["val_per_sample"])
        record["guard"] = verdict
        refused = [name for name, v in verdict.items() if not v["ok"]]
        if refused:
            log.info(
                "stage %d epoch %d: not a candidate, loses to its start on %s (%s)",
                self.task.stage,
                record["epoch"],
                ", ".join(refused),
                verdict,
            )
        return not refused

    def _loader(self, dataset: Dataset, sampler) -> DataLoader:
        return DataLoader(dataset, sampler=sampler, **loader_kwargs(self.data_cfg, batch_size=self.cfg.batch_size))

    def _autocast(self):
        device_type = "cuda" if self.device == "cuda" else "cpu"
        return torch.autocast(device_type, dtype=torch.bfloat16, enabled=self.cfg.bf16)

    def _train_epoch(self, stop) -> dict:
        outside = torch.get_num_threads()
        if self.step_threads:
            torch.set_num_threads(self.step_threads)
        try:
            return self._train_steps(stop)
        finally:
            torch.set_num_threads(outside)

    def _train_steps(self, stop) -> dict:
        extra = self.task.on_epoch_start(self.epoch) if self.task.on_epoch_start else {}
        self.sampler.set_epoch(self.epoch, start=self.step_in_epoch * self.cfg.batch_size)
        self.ddp_model.train()
        # Sums carried over from the part of this epoch that ran before a stop, so the logged
        # loss averages every step of the epoch, not only those after the resume.
        loss_sum, steps, samples, wait, before = self._restore_partial()
        start = time.perf_counter()
        bar = tqdm(
            total=self.steps_per_epoch,
            initial=self.step_in_epoch,
            desc=f"stage{self.task.stage} epoch {self.epoch}",
            disable=not self.progress or None,
        )
        fetch_start = time.perf_counter()
        for batch in self.train_loader:
            wait += time.perf_counter() - fetch_start
            batch = _to(batch, self.device)
            with self._autocast():
                loss = self.task.loss(self.ddp_model, batch)
            if not torch.isfinite(loss.detach()).all():
                latest = self.checkpointer.latest
                kept = (
                    f"the last good checkpoint {latest} is kept" if latest.exists() else "no checkpoint was written yet"
                )
                raise TrainingDiverged(
                    f"stage {self.task.stage}, epoch {self.epoch}, step {self.step_in_epoch}: loss is "
                    f"{loss.item()}; stopped, {kept}"
                )
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if self.cfg.grad_clip:
                nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
            self.optimizer.step()
            self.scheduler.step()
            self.step_in_epoch += 1
            value = loss.item()
            loss_sum += value
            steps += 1
            samples += len(next(iter(batch.values())))
            bar.update(1)
            bar.set_postfix(loss=f"{value:.4f}")
            # Every rank stops at the same step (a lone rank leaving would hang the others).
            if dist_utils.any_rank(stop.requested, self.device):
                bar.close()
                elapsed = before + time.perf_counter() - start
                self.checkpointer.save(partial=self._gather_partial(loss_sum, steps, samples, wait, elapsed))
                raise StopRequested(
                    f"stage {self.task.stage}: {stop.signal_name} at epoch {self.epoch} step "
                    f"{self.step_in_epoch}; wrote {self.checkpointer.latest}, rerun to resume"
                )
            fetch_start = time.perf_counter()
        bar.close()
        elapsed = before + time.perf_counter() - start
        totals = dist_utils.all_reduce_sum(torch.tensor([loss_sum, float(steps)], dtype=torch.float64), self.device)
        return {
            "epoch": self.epoch,
            "loss": float(totals[0]) / max(float(totals[1]), 1.0),
            "lr": self.scheduler.get_last_lr()[0],
            "samples_per_s": samples * self.env.world_size / max(elapsed, 1e-9),
            "data_wait_fraction": wait / max(elapsed, 1e-9),
            "epoch_s": elapsed,
            **extra,
        }

    def _gather_partial(self, loss_sum: float, steps: int, samples: int, wait: float, elapsed: float) -> dict:
        """Every rank's running sums of the interrupted epoch, for rank 0 to save."""
        mine = torch.tensor([loss_sum, float(steps), float(samples), wait, elapsed], dtype=torch.float64)
        rows = [mine]
        if self.env.world_size > 1:
            import torch.distributed as dist

            on = self.device if self.device != "cuda" else torch.device("cuda", torch.cuda.current_device())
            rows = [torch.zeros_like(mine, device=on) for _ in range(self.env.world_size)]
            dist.all_gather(rows, mine.to(on))
        per_rank = [[float(v) for v in row.cpu().tolist()] for row in rows]
        return {"world_size": self.env.world_size, "per_rank": per_rank}

    def _restore_partial(self) -> tuple[float, int, int, float, float]:
        partial, self.partial = self.partial, None
        if not partial or self.step_in_epoch == 0:
            return 0.0, 0, 0, 0.0, 0.0
        per_rank = partial["per_rank"]
        if partial["world_size"] == self.env.world_size:
            row = per_rank[self.env.rank]
        elif self.env.rank == 0:  # another world size: rank 0 carries the totals
            row = [sum(column) for column in zip(*per_rank)]
            row[4] = max(r[4] for r in per_rank)
        else:
            row = [0.0] * 5
        return row[0], int(row[1]), int(row[2]), row[3], row[4]

    @torch.no_grad()
    def _validate(self) -> dict:
        """Mean metrics of every validation protocol: val_<metric> for the fixed one (val_set),
        val_<protocol>_<metric> for the others; with several, also val_score (the mean over
        protocols of the mean best_metric) and val_per_sample (protocol -> best_metric per
        sample, in sample order, gathered over ranks) for the guard."""
        if not self.val_loaders:
            return {}
        self.model.eval()
        record: dict = {}
        per_sample: dict[str, list[float]] = {}
        for name, loader in self.val_loaders.items():
            acc: MetricAccumulator | None = None
            size = len(loader.dataset)
            sums, counts = torch.zeros(size, dtype=torch.float64), torch.zeros(size, dtype=torch.float64)
            for batch in loader:
                index = batch.pop("val_index")
                batch = _to(batch, self.device)
                with self._autocast():
                    values = self.task.validate(self.model, batch)
                acc = acc or MetricAccumulator(tuple(values))
                acc.update({k: v.float() for k, v in values.items()})
                sums.index_add_(0, index, values[self.task.best_metric].detach().to("cpu", torch.float64))
                counts.index_add_(0, index, torch.ones(len(index), dtype=torch.float64))
            assert acc is not None, f"validation protocol {name} has no sample on this rank"
            means = acc.compute(reduce_fn=dist_utils.all_reduce_sum_fn(self.device))
            prefix = "val_" if name == FIXED else f"val_{name}_"
            record.update({f"{prefix}{k}": float(v) for k, v in means.items()})
            sums = dist_utils.all_reduce_sum(sums, self.device)
            counts = dist_utils.all_reduce_sum(counts, self.device)
            per_sample[name] = [round(float(v), 5) for v in (sums / counts.clamp(min=1)).tolist()]
        if len(per_sample) > 1:
            means = [
                record[f"val_{self.task.best_metric}" if n == FIXED else f"val_{n}_{self.task.best_metric}"]
                for n in per_sample
            ]
            record["val_score"] = float(sum(means) / len(means))
            record["val_per_sample"] = per_sample
        return record

    def _finish_record(self, record: dict) -> None:
        record.update(
            peak_memory_mb=_peak_memory_mb(self.device),
            world_size=self.env.world_size,
            wall_time=time.time(),
            **self.task.summary,
        )
        record.update(records.plain(record))  # loadable from latest.pt with weights_only
