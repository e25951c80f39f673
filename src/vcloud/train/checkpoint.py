"""Checkpoints: atomic writes, pickle-free loads, RNG state, the resume rule and stop signals.

A checkpoint is one dict saved with torch.save and read back with
torch.load(weights_only=True), so nothing we write needs pickle to load. Layout:

    {
        **checkpoint_meta(stage=..., config_hash=...),  # format_version, stage, config_hash, versions
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

import logging
import random
import signal
from collections import OrderedDict
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from vcloud.errors import BadInputError
from vcloud.io import atomic_open, provenance
from vcloud.io import remove_leftover_temps as _remove_temps

log = logging.getLogger(__name__)

FORMAT_VERSION = 1

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


def load_checkpoint(path: Path, *, mmap: bool = False) -> dict:
    """Read a checkpoint onto the CPU without pickle; BadInputError (one line) if unusable.

    `mmap=True` maps tensors lazily instead of reading them (cheap when only the meta is needed).
    """
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"{path}: checkpoint not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as err:  # truncated zip, foreign pickle, I/O error: all mean "unusable"
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise BadInputError(f"{path}: not a readable checkpoint ({type(err).__name__}: {first})") from None
    if not isinstance(state, dict) or "format_version" not in state:
        raise BadInputError(f"{path}: not a vcloud checkpoint (no format_version)")
    version = state["format_version"]
    if version != FORMAT_VERSION:
        raise BadInputError(
            f"{path}: checkpoint format_version {version!r}, this vcloud reads {FORMAT_VERSION}; "
            "delete the file to start this stage fresh"
        )
    return state


def checkpoint_meta(*, stage: int, config_hash: str) -> dict:
    """What every checkpoint records about where it came from; spread into the top level."""
    return {
        "format_version": FORMAT_VERSION,
        **provenance(),
        "torch_version": str(torch.__version__),  # TorchVersion is a str subclass: not loadable
        "stage": int(stage),
        "config_hash": str(config_hash),
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
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


def resume_decision(latest: Path, best: Path, config_hash: str, *, stage: int | None = None) -> str:
    """Decide whether a stage starts "fresh" or "resume"s from `latest`.

    Rules, in order:

    0. latest.pt or best.pt of another stage         -> BadInputError (never overwritten)
    1. no latest.pt                                  -> "fresh"
    2. latest.pt written under another config hash   -> "fresh" (hyperparameters changed;
       resuming would mix two experiments)
    3. latest.pt finished and best.pt missing        -> "fresh" (the stage completed and its
       output was removed to force a rerun: `snakemake -R train_stage1`, or an upstream stage
       was retrained so snakemake reruns this one)
    4. latest.pt not finished                        -> "resume" (interrupted run: time limit,
       preemption, crash, StopRequest). A missing best.pt is re-created from the best
       weights kept in latest.pt: snakemake deletes the output of an interrupted job
    5. latest.pt finished and best.pt present        -> "resume" (nothing left to do: the
       trainer sees finished=True, re-syncs best.pt and metrics.jsonl, and exits)

    Rules 3 and 4 tell a deliberate rerun from an interruption by the `finished` flag, which
    the trainer commits last, after best.pt exists (see Trainer._end_epoch). A finished stage
    therefore always had a complete best.pt, and only a rerun request removes it.

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
    saved_hash = state.get("config_hash")
    if saved_hash != config_hash:
        log.info(
            "starting fresh: hyperparameters changed (%s has config hash %s, the config now %s)",
            latest,
            saved_hash,
            config_hash,
        )
        return "fresh"
    finished = bool(state.get("finished", False))
    if finished and not best.exists():
        log.info("starting fresh: %s is finished but %s is missing (output removed to force a rerun)", latest, best)
        return "fresh"
    if finished:
        log.info("resuming: %s is finished and %s exists; nothing left to do", latest, best)
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
