"""Checkpoints: atomic writes, pickle-free loads, RNG state, the resume rule, the Checkpointer
(one object that owns a stage's save, load and resume decision) and stop signals.

A checkpoint is one dict saved with torch.save and read back with
torch.load(weights_only=True), so nothing we write needs pickle to load. Layout:

    {
        **checkpoint_meta(stage=..., config_hash=..., resume_key=...),  # format_version, stage, identity, versions
        "finished": bool,             # latest.pt: True once the stage has run all its epochs
        "rng": capture_rng_state(),   # optional
        ...                           # model / optimizer state dicts, epoch, config, ...
    }

Only these types may appear (the torch 2.5 weights-only loader accepts them; numpy values,
torch.__version__ (a str subclass) and dataclasses do not qualify): dict, OrderedDict, list,
tuple, str, int, float, bool, None, torch.Tensor, torch.Size, torch.dtype. save_checkpoint
checks this before writing, so a bad value fails at the first save, not at the resume days
later.

Under DDP only rank 0 writes (the caller's job); every rank may read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import signal
from collections import OrderedDict
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

from vcloud.errors import BadInputError, VcloudError
from vcloud.io import atomic_open, provenance
from vcloud.io import remove_leftover_temps as _remove_temps
from vcloud.train import distributed, records
from vcloud.weights import FORMAT_VERSION, load_checkpoint

log = logging.getLogger(__name__)

_ALLOWED_LEAVES = (str, int, float, bool, type(None), torch.Tensor, torch.Size, torch.dtype)


# --- saving and loading -----------------------------------------------------------------------


def save_checkpoint(path: Path, state: dict) -> None:
    """Write `state` to `path` atomically: temp file beside it, fsync, then rename over it.

    On any error the temp file is removed and an existing checkpoint at `path` stays intact.
    Parent folders are created. Raises TypeError (naming the key) when `state` holds a value
    that torch.load(weights_only=True) would refuse.
    """
    path = Path(path)
    _check_loadable(state, "state")
    with atomic_open(path, "wb") as handle:
        torch.save(state, handle)


def checkpoint_meta(*, stage: int, config_hash: str, resume_key: str | None = None) -> dict:
    """What every checkpoint records about where it came from; spread into the top level.

    `resume_key` (the stage's whole identity, see resume_key()) defaults to `config_hash`.
    """
    return {
        "format_version": FORMAT_VERSION,
        **provenance(),
        "torch_version": str(torch.__version__),  # TorchVersion is a str subclass: not loadable
        "stage": int(stage),
        "config_hash": str(config_hash),
        "resume_key": str(resume_key or config_hash),
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _check_loadable(value, where: str) -> None:
    kind = type(value)
    if kind in (dict, OrderedDict):
        for key, item in value.items():
            if type(key) not in (str, int):
                raise TypeError(f"{where}: key {key!r} is a {type(key).__name__}; use str or int")
            _check_loadable(item, f"{where}[{key!r}]")
    elif kind in (list, tuple):
        for i, item in enumerate(value):
            _check_loadable(item, f"{where}[{i}]")
    elif kind in _ALLOWED_LEAVES or isinstance(value, torch.Tensor):
        return
    else:
        raise TypeError(
            f"{where}: a {kind.__module__}.{kind.__name__} cannot be loaded with weights_only=True; "
            "convert it to a tensor, number, string, list or dict"
        )


# --- random number generator state ------------------------------------------------------------


def capture_rng_state() -> dict:
    """Python, numpy (global) and torch CPU/CUDA generator states, weights_only-loadable.

    Only this process's generators: under DDP rank 0 writes the checkpoint, so other ranks
    restore rank 0's state unless the caller re-seeds them (e.g. from seed, epoch and rank).
    """
    version, internal, gauss_next = random.getstate()
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state = {
        "python": {"version": int(version), "internal": [int(v) for v in internal], "gauss_next": gauss_next},
        "numpy": {
            "bit_generator": str(name),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),  # uint32 values fit in int64
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.cpu() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(state: dict) -> None:
    """Undo capture_rng_state: the next random numbers are the ones that followed the capture."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
    npy = state["numpy"]
    keys = npy["keys"].numpy().astype(np.uint32)
    np.random.set_state((npy["bit_generator"], keys, npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available():
        count = torch.cuda.device_count()
        if count != len(cuda):
            log.warning(
                "checkpoint has CUDA RNG states for %d devices, %d visible now; restoring %d",
                len(cuda),
                count,
                min(count, len(cuda)),
            )
        for index, device_state in enumerate(cuda[:count]):
            torch.cuda.set_rng_state(device_state.cpu(), index)


# --- resume rule ----------------------------------------------------------------------------


def check_stage(path: Path, stage: int) -> None:
    """Refuse a checkpoint of another stage where this stage would write (one line)."""
    path = Path(path)
    if not path.exists():
        return
    found = load_checkpoint(path, mmap=True).get("stage")
    if found != stage:
        raise BadInputError(
            f"{path}: holds a stage {found} checkpoint, but this run trains stage {stage}; "
            "give this stage its own --out folder (nothing was overwritten)"
        )


def checkpoint_key(state: dict) -> str:
    """The identity a checkpoint was trained under (vcloud <= 0.1: its config hash)."""
    return str(state.get("resume_key") or state.get("config_hash"))


def weights_digest(path: Path) -> str:
    """sha256 (16 hex) of the weights in checkpoint `path`: names, dtypes, shapes and values.

    Only the weights: a best.pt re-written from latest.pt (other creation time, same weights)
    has the same digest.
    """
    model = load_checkpoint(path, mmap=True).get("model")
    if not isinstance(model, dict):
        raise BadInputError(f"{path}: holds no model weights")
    digest = hashlib.sha256()
    for name in sorted(model):
        tensor = model[name]
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy())  # no copy
    return digest.hexdigest()[:16]


def resume_key(config_hash: str, upstream_weights: dict[int, str] | None = None) -> str:
    """A stage's whole identity: its config hash (data, own settings, upstream identities,
    transitively: config/stage_hash.py) and the digests of the upstream weights it trains
    against, known only at run time. A stage with no upstream keeps its config hash."""
    if not upstream_weights:
        return str(config_hash)
    text = json.dumps(
        {"config": config_hash, "upstream_weights": {str(n): d for n, d in upstream_weights.items()}}, sort_keys=True
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def set_aside(latest: Path, old_key: str) -> Path:
    """Rename `latest` to latest.<old key prefix>.pt (a free name beside it); returns the new path."""
    latest = Path(latest)
    stem = f"{latest.stem}.{old_key[:8]}"
    target, n = latest.with_name(f"{stem}{latest.suffix}"), 2
    while target.exists():
        target, n = latest.with_name(f"{stem}.{n}{latest.suffix}"), n + 1
    os.replace(latest, target)
    return target


def resume_decision(
    latest: Path,
    best: Path,
    key: str,
    *,
    stage: int | None = None,
    fresh: bool = False,
    may_write: bool = True,
) -> str:
    """Decide whether a stage starts "fresh" or "resume"s from `latest`.

    Rules, in order:

    0. latest.pt or best.pt of another stage     -> BadInputError (never overwritten)
    1. no latest.pt                              -> "fresh"
    2. a fresh start asked for (`vcloud train --fresh`)
                                                 -> latest.pt set aside, "fresh"
    3. latest.pt of another identity (resume key: data, settings, upstream identities and
       upstream weights; see resume_key)         -> latest.pt set aside, "fresh": resuming
       would mix two experiments
    4. otherwise                                 -> "resume": an interrupted run goes on; a
       finished one re-creates best.pt and metrics.jsonl from latest.pt (snakemake deletes
       an incomplete job's outputs) and trains nothing

    A missing best.pt never means "train again": a finished latest.pt holds the best weights.
    Setting aside renames latest.pt to latest.<old key prefix>.pt beside it (never deleted)
    and logs one line naming both identities; only with `may_write` (rank 0 under DDP).

    A latest.pt that cannot be read, or has another format_version, raises BadInputError
    naming it rather than being silently discarded: atomic writes mean it was not half
    written by us, so a person should look (and delete it to start fresh).
    """
    latest, best = Path(latest), Path(best)
    if stage is not None:
        check_stage(latest, stage)
        check_stage(best, stage)
    if not latest.exists():
        log.info("starting fresh: no %s", latest)
        return "fresh"
    state = load_checkpoint(latest, mmap=True)
    saved = checkpoint_key(state)
    if fresh or saved != key:
        why = "a fresh start was asked for" if fresh else "another identity"
        if may_write:
            kept = set_aside(latest, saved)
            log.info(
                "starting fresh (%s): %s of identity %s set aside as %s; this run is identity %s",
                why,
                latest,
                saved,
                kept.name,
                key,
            )
        return "fresh"
    if state.get("finished", False):
        log.info("resuming: %s is finished; re-creating what is missing, training nothing", latest)
    else:
        log.info("resuming interrupted run from %s", latest)
    return "resume"


def remove_leftover_temps(folder: Path) -> list[Path]:
    """Delete `.NAME.tmp-PID` files that killed writes left in `folder`; returns them.

    Call it while holding the folder's lock: then no other process of ours writes there,
    and every such file is a leftover, whatever its pid.
    """
    removed = _remove_temps(folder)
    if removed:
        log.info("removed %d leftover temp file(s) of killed writes in %s", len(removed), folder)
    return removed


# --- the checkpointer --------------------------------------------------------------------------


class Checkpointer:
    """Owns a stage's checkpoints: save, load and the resume decision (torchtitan's checkpointer).

    It holds what a checkpoint is made of - the model, optimizer and scheduler, the RNG states
    and the loop's own state (`train_state`: anything with state_dict() / load_state_dict(), the
    Trainer: epoch, step, best value and epoch, metrics rows, an interrupted epoch's sums) - and
    the files of one output folder:

    - latest.pt: THE record of the stage (save()); the best weights ride along, so a best.pt that
      snakemake deleted is re-created, never retrained;
    - best.pt: the best weights (keep_best(), write_best());
    - metrics.jsonl and TensorBoard: views of the rows in latest.pt (write_views(), sync()).

    load() applies the resume rule (resume_decision: fresh, set aside, or resume) and restores
    everything; under DDP only rank 0 (`main`) writes, every rank reads.
    """

    def __init__(
        self,
        *,
        stage: int,
        out_dir: Path,
        model: torch.nn.Module,
        optimizer,
        scheduler,
        train_state,
        config: dict,
        config_hash: str,
        resume_key: str | None = None,
        resume_dir: Path | None = None,
        fresh: bool = False,
        main: bool = True,
        tensorboard: bool = False,
        best_metric: str = "psnr",
    ) -> None:
        self.stage, self.out_dir = stage, Path(out_dir)
        self.latest = Path(resume_dir or out_dir) / "latest.pt"
        self.best = self.out_dir / "best.pt"
        self.metrics_path = self.out_dir / "metrics.jsonl"
        self.model, self.optimizer, self.scheduler, self.train_state = model, optimizer, scheduler, train_state
        self.config, self.config_hash = config, config_hash
        self.resume_key, self.fresh, self.main = resume_key or config_hash, fresh, main
        self.use_tensorboard, self.best_metric = tensorboard, best_metric
        self.best_weights: dict | None = None  # a CPU copy of the best weights (rank 0)
        self.tensorboard = None  # records.TensorBoardLog once sync() ran with tensorboard on

    def meta(self) -> dict:
        return checkpoint_meta(stage=self.stage, config_hash=self.config_hash, resume_key=self.resume_key)

    def remove_leftover_temps(self) -> None:
        """Temp files of killed writes in the output (and resume) folder; rank 0, under the lock."""
        if self.main:
            for folder in {self.out_dir, self.latest.parent}:
                if folder.is_dir():
                    remove_leftover_temps(folder)

    # --- save ----------------------------------------------------------------------------
    def state(self, *, finished: bool = False, partial: dict | None = None) -> dict:
        """latest.pt's content: weights, optimizer, scheduler, RNG, the loop's state, best weights."""
        loop = self.train_state.state_dict()
        # When the best is the model saved here anyway (improved in the epoch just ended), a None
        # avoids a second copy.
        best_is_model = loop["step_in_epoch"] == 0 and loop["best_epoch"] == loop["epoch"] - 1
        return {
            **self.meta(),
            "config": self.config,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": capture_rng_state(),
            **loop,
            "best_model": None if best_is_model or self.best_weights is None else self.best_weights,
            "partial_epoch": partial,
            "finished": finished,
        }

    def save(self, *, finished: bool = False, partial: dict | None = None) -> None:
        """Commit latest.pt (rank 0, atomic); every rank waits for it."""
        if self.main:
            save_checkpoint(self.latest, self.state(finished=finished, partial=partial))
        distributed.barrier()

    def keep_best(self) -> None:
        """The model's weights now are the best: keep a CPU copy (rank 0) for best.pt and latest.pt."""
        if self.main:
            self.best_weights = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def write_best(self) -> None:
        """best.pt from the kept best weights (rank 0); the same bytes of weights every time."""
        if not self.main:
            return
        loop = self.train_state.state_dict()
        save_checkpoint(
            self.best,
            {
                **self.meta(),
                "config": self.config,
                "model": self.best_weights,
                "epoch": loop["best_epoch"] + 1,
                "best_value": loop["best_value"],
                "best_metric": self.best_metric,
            },
        )

    def write_views(self, record: dict) -> None:
        """metrics.jsonl from the loop's rows and `record` in TensorBoard (rank 0)."""
        if self.main:
            records.write_metrics(self.metrics_path, self.train_state.state_dict()["metrics_rows"])
            if self.tensorboard is not None:
                self.tensorboard.add(record)

    def commit_epoch(self, record: dict, *, finished: bool, improved: bool) -> None:
        """Commit an epoch so that a kill between any two writes loses none of it.

        1. latest.pt (atomic rename): THE commit - epoch, `finished`, the best weights and the
           metrics rows. A kill before it redoes the epoch; after it, nothing is trained again.
        2. best.pt, when improved (or deleted under us by snakemake): a view of the commit.
        3. metrics.jsonl and TensorBoard: views of the rows.
        A resumed run re-creates a missing or stale best.pt and metrics.jsonl (sync()).
        """
        self.save(finished=finished)
        has_best = self.train_state.state_dict()["best_epoch"] is not None
        if self.main and (improved or (has_best and not self.best.exists())):
            self.write_best()
        self.write_views(record)

    # --- load ----------------------------------------------------------------------------
    def load(self) -> bool:
        """Resume from latest.pt when the resume rule says so (resume_decision); True when the
        stage already finished. A fresh start removes this folder's best.pt and metrics.jsonl (a
        fresh run's are its own). Either way the views are then made to agree (sync())."""
        decision = resume_decision(
            self.latest, self.best, self.resume_key, stage=self.stage, fresh=self.fresh, may_write=self.main
        )
        if decision == "fresh":
            if self.main:
                self.metrics_path.unlink(missing_ok=True)
                self.best.unlink(missing_ok=True)
            self.sync()
            return False
        state = load_checkpoint(self.latest)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        restore_rng_state(state["rng"])
        if state.get("metrics_rows") is None:  # a latest.pt of vcloud <= 0.1.0: rows from the file
            state["metrics_rows"] = [
                r for r in records.read_metrics(self.metrics_path) if r.get("epoch", float("inf")) < state["epoch"]
            ]
        self._restore_best(state)
        self.train_state.load_state_dict(state)
        log.info(
            "stage %d: resuming from %s at epoch %d step %d",
            self.stage,
            self.latest,
            state["epoch"],
            state["step_in_epoch"],
        )
        self.sync()
        return bool(state["finished"])

    def _restore_best(self, state: dict) -> None:
        """The best weights and epoch of `state` (vcloud <= 0.1.0 kept them in best.pt only)."""
        if "best_epoch" in state:
            weights = state["best_model"]
            if weights is None and state["best_epoch"] is not None:
                weights = state["model"]  # the best was the model of this very checkpoint
        elif self.best.exists():
            saved = load_checkpoint(self.best)
            state["best_epoch"], weights = saved["epoch"] - 1, saved["model"]
        else:
            state["best_epoch"], weights, state["best_value"] = None, None, -float("inf")
        self.best_weights = weights if self.main else None

    def sync(self) -> None:
        """Make best.pt, metrics.jsonl and TensorBoard agree with the committed state (rank 0).

        Each is a view of latest.pt: a kill between the commit and its write, or a best.pt
        deleted by snakemake, is repaired here; an intact one is left as it is.
        """
        if not self.main:
            return
        loop = self.train_state.state_dict()
        if loop["best_epoch"] is None:
            # Not from any committed epoch (stage 2's epoch -1 best, written before the first
            # commit, or a best.pt of vcloud <= 0.1 ahead of its commit): redone, decided again.
            if self.best.exists():
                self.best.unlink()
        elif not self._best_matches(loop):
            log.info(
                "stage %d: re-creating %s (best of epoch %d) from %s",
                self.stage,
                self.best,
                loop["best_epoch"],
                self.latest,
            )
            self.write_best()
        if records.read_metrics(self.metrics_path) != loop["metrics_rows"]:
            records.write_metrics(self.metrics_path, loop["metrics_rows"])
        if self.use_tensorboard:
            self.tensorboard = records.TensorBoardLog(self.out_dir, stage=self.stage)
            for row in loop["metrics_rows"]:
                self.tensorboard.add(row)

    def _best_matches(self, loop: dict) -> bool:
        if not self.best.exists():
            return False
        try:
            saved = load_checkpoint(self.best, mmap=True)
        except VcloudError:
            return False
        return saved.get("epoch") == loop["best_epoch"] + 1 and saved.get("best_value") == loop["best_value"]

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()


# --- stop signals ---------------------------------------------------------------------------


class StopRequest:
    """Turn SIGTERM / SIGUSR1 into a flag the trainer polls at step boundaries.

    SLURM sends SIGTERM at the time limit (then SIGKILL after KillWait, often 30 s) and can
    send SIGUSR1 ahead of it (`#SBATCH --signal=B:USR1@300`, or without B: to the job step).
    The handler only sets the flag (no logging: not safe inside a signal handler); the
    trainer then writes latest.pt and exits non-zero (vcloud.errors.StopRequested ->
    EXIT_REQUEUE; zero would make Snakemake take the job as done). Previous handlers come back
    on close() or context exit. Handlers can only be installed from the main thread; from
    another thread nothing is installed and the flag never rises. Under DDP the ranks must
    agree before stopping (distributed.any_rank), or some would wait in the next collective.

        with StopRequest() as stop:
            for step in ...:
                ...
                if distributed.any_rank(stop.requested, device):
                    save latest.pt (rank 0); raise StopRequested(...)
    """

    def __init__(self, signals: tuple[int, ...] | None = None) -> None:
        if signals is None:
            signals = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGUSR1", None)) if s)
        self._signal_name: str | None = None
        self._previous: dict[int, object] = {}
        for signum in signals:
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread
                log.warning("cannot install a handler for %s outside the main thread", signal.Signals(signum).name)

    def _handle(self, signum, frame) -> None:
        if self._signal_name is None:
            self._signal_name = signal.Signals(signum).name

    @property
    def requested(self) -> bool:
        return self._signal_name is not None

    @property
    def signal_name(self) -> str | None:
        """Name of the first signal received ("SIGTERM", "SIGUSR1"), or None."""
        return self._signal_name

    def close(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def __enter__(self) -> StopRequest:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
