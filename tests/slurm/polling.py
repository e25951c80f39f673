"""Snakemake's status polling at a test cluster's pace (tests/slurm/pace/sitecustomize.py): the
SLURM executor plugin waits up to 180 s between status checks, growing by 10 s per check that
finds nothing finished; on the one-node test cluster it looks every POLL_S seconds at most."""

import os
from pathlib import Path

PACE = Path(__file__).parent / "pace"
POLL_S = "3"


def fast_polling(env: dict[str, str], pace: Path = PACE) -> dict[str, str]:
    """`env` with the pacing folder first on PYTHONPATH (once) and the poll cap set."""
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(pace) not in path:
        path.insert(0, str(pace))
    env["PYTHONPATH"] = os.pathsep.join(path)
    env["VCLOUD_TEST_SLURM_POLL_S"] = POLL_S
    return env
