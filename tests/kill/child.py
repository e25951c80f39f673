"""`vcloud train` that SIGKILLs itself at one chosen point (the kill harness's child process).

    python -m tests.kill.child POINT N SECONDS -- <vcloud train arguments>
    python -m tests.kill.child --serve    (a fork server: one request per line, see serve())

POINT is where to die, at its N-th occurrence (with KILL_GROUP=1 the whole process group dies, e.g. snakemake): save_mid (inside torch.save, half a file
written), before_rename / after_rename (either side of an os.replace: checkpoints, metrics),
after_replace:NAME (right after an os.replace onto a file named NAME, e.g. after_replace:latest.pt),
validation (entering validation), term_leader (entering the N-th validation: SIGTERM to the process
group's leader, e.g. snakemake started in its own session, and go on; die right after the N-th
latest.pt commit: SLURM's SIGTERM, then SIGKILL, as an epoch ends), metrics (entering the metrics.jsonl write), timer (after
SECONDS of wall time from the start of training), none. Nothing here is known to the trainer:
the points are where its code calls torch.save, os.replace and so on.
"""

from __future__ import annotations

import os
import signal
import sys
import threading


def die() -> None:
    if os.environ.get("KILL_GROUP") == "1":  # the whole process group: snakemake and its jobs
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def install(point: str, n: int, seconds: float) -> None:
    import torch

    from vcloud.train import records, trainer

    count = {"n": 0}

    def hit() -> bool:
        count["n"] += 1
        return count["n"] == n

    if point == "save_mid":
        real = torch.save

        def save(obj, f, *args, **kwargs):
            if hit():
                f.write(b"PK\x03\x04 half a checkpoint")
                f.flush()
                die()
            return real(obj, f, *args, **kwargs)

        torch.save = save
    elif point in ("before_rename", "after_rename"):
        real_replace = os.replace

        def replace(src, dst, *args, **kwargs):
            dying = hit()
            if dying and point == "before_rename":
                die()
            real_replace(src, dst, *args, **kwargs)
            if dying:
                die()

        os.replace = replace  # the one os module: patches every atomic write (vcloud.io)
    elif point.startswith("after_replace:"):
        name = point.partition(":")[2]
        real_replace = os.replace

        def replace(src, dst, *args, **kwargs):
            real_replace(src, dst, *args, **kwargs)
            if os.path.basename(os.fspath(dst)) == name and hit():
                die()

        os.replace = replace
    elif point == "term_leader":
        real_validate = trainer.Trainer._validate
        real_replace = os.replace
        commits = {"n": 0}

        def validate(self):
            if hit():
                os.kill(os.getpgrp(), signal.SIGTERM)
            return real_validate(self)

        def replace(src, dst, *args, **kwargs):
            real_replace(src, dst, *args, **kwargs)
            if os.path.basename(os.fspath(dst)) == "latest.pt":
                commits["n"] += 1
                if commits["n"] == n:
                    die()

        trainer.Trainer._validate = validate
        os.replace = replace
    elif point == "validation":
        real_validate = trainer.Trainer._validate

        def validate(self):
            if hit():
                die()
            return real_validate(self)

        trainer.Trainer._validate = validate
    elif point == "metrics":
        real_write = records.write_metrics

        def write_metrics(path, rows):
            if hit():
                die()
            return real_write(path, rows)

        records.write_metrics = write_metrics
    elif point == "timer":
        real_fit = trainer.Trainer._fit

        def fit(self):
            timer = threading.Timer(seconds, die)
            timer.daemon = True
            timer.start()
            return real_fit(self)

        trainer.Trainer._fit = fit
    elif point != "none":
        raise SystemExit(f"unknown point {point}")


def fix_validation_scores(scores: str) -> None:
    """VAL_PSNR_BY_EPOCH="1,3,2": the validation PSNR of each epoch (where the best falls)."""
    from vcloud.train import trainer

    by_epoch = [float(v) for v in scores.split(",")]
    real_validate = trainer.Trainer._validate

    def validate(self):
        metrics = real_validate(self)
        metrics["val_psnr"] = by_epoch[self.epoch]
        if "val_score" in metrics:  # chosen on several protocols: the scripted value decides
            metrics["val_score"] = by_epoch[self.epoch]
        return metrics

    trainer.Trainer._validate = validate


def serve() -> int:
    """A fork server for a chain of kills: torch and vcloud are imported once, then each request
    (a JSON line on stdin: {"point", "n", "seconds", "args", "log"}) runs `vcloud train ARGS` in a
    forked child that installs its kill point, its stdout and stderr in the file `log`; the reply
    is a JSON line on stdout: {"returncode"}, negative for the signal that ended the child, as
    subprocess gives it. Each child is a process of its own, killed as any other; what the fork
    saves is only the import (about 2.5 s of CPU per process here). The server runs nothing of
    torch's itself before it forks, so no thread pool exists to be copied half-held."""
    import json
    import traceback

    import torch

    from vcloud.cli import main as vcloud
    from vcloud.train import records, trainer  # noqa: F401 - imported once, patched in the children

    torch.set_num_threads(1)  # as main(): identical arithmetic in every process
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the child: its kill point, then the training; never back into the loop
            code = 1
            try:
                fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                install(request["point"], int(request["n"]), float(request["seconds"]))
                code = vcloud(["train", *request["args"]]) or 0
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print(json.dumps({"returncode": code}), flush=True)
    return 0


def main() -> int:
    if sys.argv[1:] == ["--serve"]:
        return serve()
    point, n, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    assert sys.argv[4] == "--"
    import torch

    torch.set_num_threads(1)  # identical arithmetic in every process, and fair to a busy machine
    if os.environ.get("VAL_PSNR_BY_EPOCH"):
        fix_validation_scores(os.environ["VAL_PSNR_BY_EPOCH"])
    install(point, n, seconds)
    from vcloud.cli import main as vcloud

    return vcloud(["train", *sys.argv[5:]])


if __name__ == "__main__":
    sys.exit(main())
