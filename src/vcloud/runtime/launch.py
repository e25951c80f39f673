"""`python3 -m vcloud.runtime.launch --ignore-usr1 COMMAND...`: run COMMAND with SIGUSR1 ignored.

SLURM's warning before the time limit (`--signal=USR1@S`) reaches every process of the job
step. A launcher that does not handle USR1 (torchrun's agent handles TERM, INT, HUP and QUIT
only) dies of it, and its step ends with the ranks still writing latest.pt. An ignored signal
stays ignored across exec, so the launcher survives; each rank installs its own handler
(vcloud.train.checkpoint.StopRequest), which replaces the inherited "ignore".
"""

from __future__ import annotations

import os
import signal
import sys


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "--ignore-usr1" or len(argv) < 2:
        print("usage: python3 -m vcloud.runtime.launch --ignore-usr1 COMMAND [ARG...]", file=sys.stderr)
        return 2
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        os.execvp(argv[1], argv[1:])
    except OSError as err:
        print(f"vcloud launch: {argv[1]}: {err.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
