"""Per-epoch records: metrics.jsonl and TensorBoard event files, both views of the resume state.

The rows of every finished epoch live in latest.pt (they are small), so neither file is ever
the only copy: each is rewritten from those rows after the epoch is committed and again at every
start. A kill between the commit and the write, or in the middle of it, can therefore neither
lose a row nor log one twice - appending would do both (a row written, then the epoch redone
after a resume; or the epoch committed and the row never written).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from vcloud.errors import ConfigError
from vcloud.io import atomic_open

TENSORBOARD_DIR = "tensorboard"
_NOT_SCALARS = {"epoch", "wall_time", "world_size", "best"}


def plain(record: dict) -> dict:
    """A JSON round trip: only str/int/float/bool/None/list/dict remain (checkpoint-loadable)."""
    return json.loads(json.dumps(record))


def write_metrics(path: Path, rows: list[dict]) -> None:
    """Replace `path` with one JSON line per row, atomically (temp file, fsync, rename)."""
    with atomic_open(path, "w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def read_metrics(path: Path) -> list[dict]:
    """Rows of an existing metrics.jsonl (a torn last line, from an older vcloud, is dropped)."""
    rows = []
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return rows
    for line in lines:
        try:
            rows.append(json.loads(line))
        except ValueError:
            break
    return rows


def scalars(row: dict) -> dict[str, float]:
    """TensorBoard tags of one metrics row: train/*, val/*, and run/* for throughput and memory."""
    out = {}
    for key, value in row.items():
        if key in _NOT_SCALARS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value):
            continue
        if key.startswith("val_"):
            tag = f"val/{key[4:]}"
        elif key in ("loss", "lr"):
            tag = f"train/{key}"
        else:
            tag = f"run/{key}"
        out[tag] = float(value)
    return out


class TensorBoardLog:
    """Event files in `<out>/tensorboard/`, rebuilt from the rows at each start (rank 0 only).

    Old event files are removed first, so a resumed run shows each epoch exactly once instead
    of the interrupted run's points plus the redone ones.
    """

    def __init__(self, out_dir: Path, *, stage: int) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise ConfigError(
                f"stage{stage}.train.tensorboard is true but TensorBoard cannot be imported ({err}); "
                "pip install tensorboard, or set it to false"
            ) from None
        self.folder = Path(out_dir) / TENSORBOARD_DIR
        if self.folder.is_dir():
            for old in self.folder.glob("events.out.tfevents.*"):
                old.unlink()
        self.writer = SummaryWriter(log_dir=str(self.folder))

    def add(self, row: dict) -> None:
        for tag, value in scalars(row).items():
            self.writer.add_scalar(tag, value, global_step=int(row["epoch"]), walltime=row.get("wall_time"))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
