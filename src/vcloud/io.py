"""One home for writing outputs whole and for recording where they came from.

Every output a later step reads is written beside its final place under a temporary name and
renamed over it only when complete, so a reader (or a rerun after a kill) sees the old file,
the new file or nothing, never half of one. The temporary name is `.NAME.tmp-PID`: hidden,
in the same folder (a rename across file systems is not atomic) and recognisable, so that
`remove_leftover_temps` can delete what a killed write left behind.

Provenance: stores and checkpoints record the package version and the git revision of the
source tree they were made with (`provenance`).

Reading back: `read_npz_with_meta` opens the npz files vcloud writes (arrays plus a JSON
"meta" entry) and turns anything unreadable into one line naming the file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

TEMP_MARK = ".tmp-"


def one_line(err: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def read_npz_with_meta(
    path: Path, *, what: str, array_keys: Iterable[str], check_meta: Callable[[dict], None] | None = None
) -> tuple[dict, dict]:
    """The arrays `array_keys` and the JSON object stored as "meta" of an npz (no pickles).

    `check_meta(meta)` runs before any array is read (a wrong format or version is named
    before a missing array). Anything unreadable or missing: BadInputError of one line,
    "<path>: not a <what>, missing ..." or "<path>: not a readable <what> (<error>)".
    """
    import numpy as np

    from vcloud.errors import BadInputError, VcloudError

    try:
        with np.load(path, allow_pickle=False) as npz:
            if "meta" not in npz.files:
                raise BadInputError(f"{path}: not a {what}, missing meta")
            meta = json.loads(str(npz["meta"][()]))
            if not isinstance(meta, dict):
                raise BadInputError(f"{path}: not a {what}, meta is not a JSON object")
            if check_meta is not None:
                check_meta(meta)
            keys = list(array_keys)
            missing = [name for name in keys if name not in npz.files]
            if missing:
                raise BadInputError(f"{path}: not a {what}, missing {', '.join(missing)}")
            arrays = {name: npz[name] for name in keys}
    except VcloudError:
        raise
    except (OSError, ValueError, EOFError, KeyError, AttributeError, zipfile.BadZipFile, zlib.error) as err:
        raise BadInputError(f"{path}: not a readable {what} ({one_line(err)})") from err
    return arrays, meta


def temp_path(path: Path) -> Path:
    """The temporary name beside `path` that this process writes it under: `.NAME.tmp-PID`."""
    path = Path(path)
    return path.with_name(f".{path.name}{TEMP_MARK}{os.getpid()}")


def remove_path(path: Path) -> None:
    """Remove a file, a symlink or a whole folder; nothing if there is nothing."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


@contextmanager
def atomic_output(out: Path, *, durable: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside `out` to write a file or a folder to.

    When the block ends normally the temporary replaces `out`; when it raises (or is killed
    by an exception such as KeyboardInterrupt) the temporary is removed and an existing `out`
    stays as it was. A file replaces a file in one rename; a folder (or anything replacing a
    folder) first moves the old one aside, since a rename cannot replace a non-empty folder.
    durable=True also flushes a written file and the folder entry to disk (fsync), so that a
    power loss right after the rename cannot leave an empty file under the final name.
    Parent folders are created.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(out)
    remove_path(tmp)
    try:
        yield tmp
        if durable and tmp.is_file():
            _fsync(tmp, os.O_RDONLY)
        if (tmp.is_dir() and not tmp.is_symlink()) or (out.is_dir() and not out.is_symlink()):
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            remove_path(old)
            if out.exists() or out.is_symlink():
                os.replace(out, old)
            os.replace(tmp, out)
            remove_path(old)
        else:
            os.replace(tmp, out)
    except BaseException:
        remove_path(tmp)
        raise
    if durable:
        _fsync(out.parent, os.O_RDONLY)


@contextmanager
def atomic_open(out: Path, mode: str = "w", *, durable: bool = True, **open_args) -> Iterator[IO]:
    """`open(out, mode)` for writing, through `atomic_output`: `out` appears only when complete."""
    if not mode.startswith("w"):
        raise ValueError(f"atomic_open: mode {mode!r}; only a new file can be written atomically")
    with atomic_output(out, durable=durable) as tmp, open(tmp, mode, **open_args) as handle:
        yield handle


def atomic_write_bytes(out: Path, data: bytes, *, durable: bool = True) -> None:
    """Write `data` to `out` atomically (see `atomic_output`)."""
    with atomic_open(out, "wb", durable=durable) as handle:
        handle.write(data)


def atomic_write_text(out: Path, text: str, *, encoding: str = "utf-8", durable: bool = True) -> None:
    """Write `text` to `out` atomically (see `atomic_output`); newlines are written as given."""
    with atomic_open(out, "w", durable=durable, encoding=encoding, newline="") as handle:
        handle.write(text)


def atomic_write_json(out: Path, value, *, durable: bool = True, **dumps_args) -> None:
    """Write `json.dumps(value, **dumps_args)` to `out` atomically (see `atomic_output`)."""
    atomic_write_text(out, json.dumps(value, **dumps_args), durable=durable)


def fresh_staging_dir(parent: Path, prefix: str = ".staging") -> Path:
    """Create and return an empty folder `parent/PREFIX-PID` to stage files that the caller
    then renames into `parent` one by one; the caller removes it when done (try/finally,
    `remove_path`). Folders `PREFIX-*` that killed runs left in `parent` are removed first.
    """
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    for stale in parent.glob(f"{prefix}-*"):
        remove_path(stale)
    staging = parent / f"{prefix}-{os.getpid()}"
    staging.mkdir()
    return staging


def remove_leftover_temps(folder: Path) -> list[Path]:
    """Delete the `.NAME.tmp-PID` files that killed writes left in `folder`; returns them.

    Call it only when no other process writes into `folder` (holding its lock, say): then
    every such file is a leftover, whatever its pid. Folders and other names are kept.
    """
    removed = []
    for tmp in sorted(Path(folder).glob(f".*{TEMP_MARK}*")):
        if tmp.is_file() and tmp.name.rsplit(TEMP_MARK, 1)[1].isdigit():
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def git_revision() -> str:
    """The git revision of the source tree the package runs from, or 'unknown'."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def provenance() -> dict[str, str]:
    """What every store and checkpoint records about the code that made it."""
    from vcloud import __version__

    return {"vcloud_version": __version__, "git_revision": git_revision()}


def _fsync(path: Path, flags: int) -> None:
    """fsync a file or a folder; harmless where the file system cannot (some cannot open folders)."""
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
