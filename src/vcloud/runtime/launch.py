"""`python3 -m vcloud.runtime.launch MODE COMMAND...`: start a rank's command the way a SLURM
job step needs it.

`--ignore-usr1 COMMAND...`: run COMMAND with SIGUSR1 ignored. SLURM's warning before the time
limit (`--signal=USR1@S`) reaches every process of the job step. A launcher that does not
handle USR1 (torchrun's agent handles TERM, INT, HUP and QUIT only) dies of it, and its step
ends with the ranks still writing latest.pt. An ignored signal stays ignored across exec, so
the launcher survives; each rank installs its own handler (vcloud.train.checkpoint.StopRequest),
which replaces the inherited "ignore".

`--warn-after SECONDS COMMAND...` (the dev-g rehearsal, `resources.<rule>.rehearse_warning`):
SLURM's warning, forced early, once per stage. When the command's `--out` folder holds no
latest.pt yet, COMMAND starts with SIGUSR1 ignored (so a warning before its handler exists is
harmless) and gets SIGUSR1 after SECONDS, then every few seconds until it exits: the trainer
writes latest.pt and exits 3, snakemake resubmits the rule, and the next job (latest.pt there)
runs COMMAND untouched and resumes. This rehearses warning -> checkpoint -> resubmission ->
resume on the real machine without waiting for a real time limit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

USAGE = "usage: python3 -m vcloud.runtime.launch (--ignore-usr1 | --warn-after SECONDS) COMMAND [ARG...]"
REPEAT_S = 5.0  # the warning again until the trainer's handler is installed and acts


def out_folder(command: list[str]) -> Path | None:
    """The --out folder of a `vcloud train` command line."""
    for i, word in enumerate(command):
        if word == "--out" and i + 1 < len(command):
            return Path(command[i + 1])
        if word.startswith("--out="):
            return Path(word.split("=", 1)[1])
    return None


def warn_after(seconds: float, command: list[str], *, repeat: float = REPEAT_S) -> int:
    out = out_folder(command)
    if out is None:
        print("vcloud launch: --warn-after needs a command with --out FOLDER", file=sys.stderr)
        return 2
    if (out / "latest.pt").exists():  # the resubmitted job: resume as a real one would
        os.execvp(command[0], command)
    print(
        f"vcloud launch: rehearsal: SIGUSR1 to the trainer after {seconds:g} s (a forced wall-time warning)",
        file=sys.stderr,
        flush=True,
    )
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # inherited by the child until its handler
    child = subprocess.Popen(command)
    for name in ("SIGTERM", "SIGINT"):  # a real stop reaches the trainer too
        signal.signal(getattr(signal, name), lambda signum, frame: child.send_signal(signum))
    deadline = time.monotonic() + seconds
    while child.poll() is None:
        if time.monotonic() >= deadline:
            child.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + repeat
        time.sleep(0.2)
    return child.returncode


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "--ignore-usr1":
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        try:
            os.execvp(argv[1], argv[1:])
        except OSError as err:
            print(f"vcloud launch: {argv[1]}: {err.strerror}", file=sys.stderr)
            return 127
    if len(argv) >= 3 and argv[0] == "--warn-after":
        try:
            seconds = float(argv[1])
        except ValueError:
            print(f"vcloud launch: --warn-after {argv[1]!r}: expected seconds", file=sys.stderr)
            return 2
        try:
            return warn_after(seconds, argv[2:])
        except OSError as err:
            print(f"vcloud launch: {argv[2]}: {err.strerror}", file=sys.stderr)
            return 127
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
