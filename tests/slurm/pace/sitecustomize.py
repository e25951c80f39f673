"""Test-only pacing for the SLURM wall-time test (tests/slurm/test_slurm.py): makes the first
job of a `vcloud train` slow on purpose, so that a one-minute job is surely warned mid-training,
while the resumed job and the uninterrupted reference run at full speed.

Python imports `sitecustomize` at start-up from PYTHONPATH; the test puts a copy of this folder
there (under a bind, so the container stand-in sees it) and sets VCLOUD_TEST_PACE_STEP_S. With
that set, a `vcloud train ... --out DIR` process (the word after the program is `train`) that finds no DIR/latest.pt at start sleeps
that many seconds after every optimizer step (with VCLOUD_TEST_PACE_ONLY=NAME[,NAME...], only when DIR is
named so). Sleeping changes no number: the weights stay
those of an unpaced run. Anything else (snakemake, the resumed job, no variable) is untouched.

With VCLOUD_TEST_SLURM_POLL_S=N, a snakemake that loads the SLURM executor plugin waits at most N
seconds between two status checks. The plugin (2.8) adds 10 s to its wait after every check that
finds no job finished, up to 180 s, whatever `--seconds-between-status-checks` says: right against
a site's busy scheduler, but on the one-node test cluster a sequence of short jobs spends most of
its time waiting for snakemake to look (tens of seconds after each job). The cap changes when a
finished job is seen, not what any job does.
"""

import os
import sys
from pathlib import Path


def _out_dir(argv: list[str]) -> Path | None:
    for i, word in enumerate(argv):
        if word == "--out" and i + 1 < len(argv):
            return Path(argv[i + 1])
        if word.startswith("--out="):
            return Path(word.split("=", 1)[1])
    return None


def _pace() -> None:
    seconds = float(os.environ.get("VCLOUD_TEST_PACE_STEP_S") or 0)
    argv = getattr(sys, "argv", [])
    out = _out_dir(argv)
    if seconds <= 0 or argv[1:2] != ["train"] or out is None or (out / "latest.pt").exists():
        return
    if out.name not in os.environ.get("VCLOUD_TEST_PACE_ONLY", out.name).split(","):  # e.g. "stage1,stage2"
        return
    import time

    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: time.sleep(seconds))
    print(f"pace: {seconds:g} s after every optimizer step (first job of {out})", file=sys.stderr, flush=True)


class _CapPolling:
    """An import hook: once `snakemake_executor_plugin_slurm` is imported, its executor's wait
    between status checks is capped at VCLOUD_TEST_SLURM_POLL_S seconds."""

    name = "snakemake_executor_plugin_slurm"

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            cap = float(os.environ["VCLOUD_TEST_SLURM_POLL_S"])
            wait = module.Executor.__mro__[1].next_seconds_between_status_checks  # RemoteExecutor's property
            module.Executor.next_seconds_between_status_checks = property(
                wait.fget, lambda executor, seconds: wait.fset(executor, min(seconds, cap))
            )

        spec.loader.exec_module = exec_module
        return spec


_pace()
if os.environ.get("VCLOUD_TEST_SLURM_POLL_S"):
    sys.meta_path.insert(0, _CapPolling())
