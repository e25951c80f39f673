"""One training run per output folder: a lock file naming its holder (host, pid, SLURM job).

Two runs on one folder would overwrite each other's checkpoints and interleave metrics.jsonl
(both exit 0, so nobody notices). It happens for real: a snakemake restarted while its old job
still runs on SLURM, or a stage started by hand beside the workflow.

The lock is `<out>/.train.lock`, a small JSON file made atomically with content (written to a
temp file, then hard-linked into place: `link` fails when the name exists, on local disks and
Lustre alike, so exactly one run wins and nobody ever reads a half-written lock).

A lock left by a run that died without releasing it (SIGKILL, node failure) is stale and is
taken over when that can be known for sure:
- same host and the process is gone (or its pid now belongs to a younger process);
- the same SLURM job id as ours: a requeued or restarted job never runs beside itself;
- another host, and `squeue` says that SLURM job no longer exists.
Otherwise the second run fails with one line naming the folder and the holder.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

from vcloud.errors import VcloudError

log = logging.getLogger(__name__)

LOCK_NAME = ".train.lock"


class LockHeld(VcloudError):
    """Another run holds the output folder."""


def _process_start(pid: int) -> str | None:
    """Start time of a process in clock ticks since boot (tells a reused pid apart)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22, counted after the command name


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    now = _process_start(pid)
    return start is None or now is None or now == start


def _slurm_job_gone(job_id: str) -> bool:
    """True only when squeue answers and does not know the job (it ended)."""
    if not shutil.which("squeue"):
        return False
    try:
        proc = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    if proc.returncode == 0:
        return proc.stdout.strip() == ""
    return "invalid job id" in proc.stderr.lower()


def describe_holder(holder: dict) -> str:
    job = holder.get("slurm_job_id")
    return (
        f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, "
        f"SLURM job {job if job else 'none'}, since {holder.get('since', '?')}"
    )


class OutputLock:
    """Hold `<folder>/.train.lock` for the life of a run (context manager)."""

    def __init__(self, folder: Path, *, environ=os.environ) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.me = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "start": _process_start(os.getpid()),
            "slurm_job_id": environ.get("SLURM_JOB_ID") or None,
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "token": uuid.uuid4().hex,
        }
        self.held = False

    def acquire(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        for _ in range(5):  # a takeover race may need another round
            if self._create():
                self.held = True
                return
            holder = self._read()
            if holder is None:
                continue  # released (or taken over) while we looked
            reason = self._stale(holder)
            if reason is None:
                raise LockHeld(
                    f"{self.folder}: another training run holds this folder ({describe_holder(holder)}); "
                    f"wait for it, or remove {self.path} if that run is gone"
                )
            if self._take_over(holder):
                log.warning("%s: took over a stale lock (%s): %s", self.folder, describe_holder(holder), reason)
        raise LockHeld(f"{self.folder}: could not take the lock {self.path} (others keep taking it)")

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        holder = self._read()
        if holder is not None and holder.get("token") == self.me["token"]:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    # --- internals ------------------------------------------------------------------------
    def _create(self) -> bool:
        tmp = self.folder / f"{LOCK_NAME}.tmp-{os.getpid()}"
        tmp.write_text(json.dumps(self.me))
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def _read(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {"host": "?", "pid": "?", "token": None}  # not ours to judge: a person should look

    def _stale(self, holder: dict) -> str | None:
        """Why the holder is certainly gone, or None when it may still run."""
        job = holder.get("slurm_job_id")
        if job and job == self.me["slurm_job_id"]:
            return f"the same SLURM job {job} (restarted or requeued)"
        pid = holder.get("pid")
        if holder.get("host") == self.me["host"] and isinstance(pid, int):
            if pid != os.getpid() and not _alive(pid, holder.get("start")):
                return f"process {pid} no longer runs on this host"
            return None
        if job and _slurm_job_gone(str(job)):
            return f"SLURM job {job} has ended"
        return None

    def _take_over(self, holder: dict) -> bool:
        """Move the stale lock aside, and put it back if it turned out not to be the stale one."""
        aside = self.folder / f"{LOCK_NAME}.stale-{os.getpid()}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        try:
            moved = json.loads(aside.read_text())
        except (OSError, ValueError):
            moved = {}
        if moved.get("token") != holder.get("token"):
            try:  # a live run's fresh lock: give it back (link fails if yet another run took the name)
                os.link(aside, self.path)
            except FileExistsError:
                pass
            aside.unlink(missing_ok=True)
            return False
        aside.unlink(missing_ok=True)
        return True
