"""Every stage against every simple answer on a real Level-2A series, with a temporal split.

    python bench/bench_realdata.py [--stages 0 1] [--seeds 0 1 2] [--design NAME KEY=VALUE ...]

The series is ../shared/realdata/worldcereal/00002806639B424A (its README: 118 dates of 10
bands with the product's SCL; one location, so the split is in time): prepared with `vcloud
prepare` as a user's plain folder, split by `vcloud assemble --keep/--drop` into train, val and
test date ranges (data/splits.py temporal_ranges, a gap of GAP_DAYS so that no cloud and no
context window is shared), then each design is trained with `vcloud train` under every seed and
scored with `vcloud evaluate` on val (where designs are chosen) and test (where they are
reported). A design is the small model config (config/models/small.yaml: its band set 10m_20m,
no wind scan: the folder brings no ERA5) with the changes given.

Prints one JSON object: per design, stage and split, the mean PSNR of the model and of every
baseline per protocol, and the model against the strongest baseline (the paired difference
over the seeds' mean per sample, its t interval clustered as the report's, the wins), plus
the fallbacks of the context policy. Never reads the pixels into the repository: the data stay
in ../shared/realdata.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
LOCATION = REPO.parent / "shared" / "realdata" / "worldcereal" / "00002806639B424A"
# val: late summer and autumn of the first year; test: autumn of the second; train: the
# months between, GAP_DAYS away from both.
SPLIT = {"val": ["2017-08-04", "2017-11-15"], "test": ["2018-09-01", "2018-11-27"], "gap_days": 30}
DESIGNS = {"T4": {}, "T8": {"data.input_dates": 8}}


def run(command: list[str], log: Path) -> None:
    with log.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=os.environ | {"OMP_NUM_THREADS": "2"})
    if done.returncode:
        sys.exit(f"{' '.join(command[:3])} failed ({done.returncode}): see {log}")


def prepare(work: Path) -> dict[str, Path]:
    from vcloud.data.splits import temporal_ranges

    store = work / "location.zarr"
    if not store.exists():
        run(
            ["vcloud", "prepare", "--raw", str(LOCATION), "--roi", "ROIs9000/1", "--out", str(store), "--size", "64"]
            + ["--bands", "10m_20m", "--level", "L2A", "--boa-offset", "0"],
            work / "prepare.log",
        )
    stores = {}
    for split, ranges in temporal_ranges(SPLIT).items():
        stores[split] = work / f"{split}.zarr"
        if not stores[split].exists():
            flags = [f for first, last in ranges.keep for f in ("--keep", first, last)]
            flags += [f for first, last in ranges.drop for f in ("--drop", first, last)]
            run(["vcloud", "assemble", "--out", str(stores[split]), *flags, str(store)], work / f"assemble_{split}.log")
    return stores


def model_config(work: Path, design: str, changes: dict, seed: int) -> Path:
    config = yaml.safe_load((REPO / "config" / "models" / "small.yaml").read_text())
    config["data"]["bands"] = "10m_20m"
    config["stage1"]["model"]["wind_scan"] = False
    for dotted, value in changes.items():
        section = config
        *parents, last = dotted.split(".")
        for part in parents:
            section = section.setdefault(part, {})
        section[last] = value
    for stage in range(4):
        config[f"stage{stage}"]["train"]["seed"] = seed
    path = work / design / f"seed{seed}" / "model.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


def train_and_score(work: Path, stores: dict, design: str, changes: dict, seed: int, stages: list[int]) -> dict:
    config = model_config(work, design, changes, seed)
    run_dir = config.parent
    reports = {}
    for stage in stages:
        out = run_dir / f"stage{stage}"
        upstream = [
            f
            for k in range(stage)
            if (run_dir / f"stage{k}" / "best.pt").exists()
            for f in (f"--stage{k}", str(run_dir / f"stage{k}" / "best.pt"))
        ]
        if not (out / "best.pt").exists():
            run(
                ["vcloud", "train", "--stage", str(stage), "--config", str(config), "--train", str(stores["train"])]
                + ["--val", str(stores["val"]), "--out", str(out), *upstream],
                run_dir / f"train{stage}.log",
            )
        for split in ("val", "test"):
            report = run_dir / f"eval{stage}.{split}.json"
            if not report.exists():
                run(
                    ["vcloud", "evaluate", "--stage", str(stage), "--store", str(stores[split]), "--out", str(report)]
                    + ["--config", str(config), *upstream, f"--stage{stage}", str(out / "best.pt")],
                    run_dir / f"eval{stage}.{split}.log",
                )
            reports[(stage, split)] = json.loads(report.read_text())
    return reports


def summarise(by_seed: list[dict], stage: int, split: str) -> dict:
    """The seeds' reports of one stage and split: means, and the model against the strongest
    baseline on the seed-averaged per-sample PSNR (scoring.strongest)."""
    from vcloud.evaluation.scoring import headline, strongest

    out = {}
    for protocol in ("fixed", "reference"):
        results = [reports[(stage, split)]["protocols"][protocol] for reports in by_seed]
        first = results[0]
        methods = [m for m in first if isinstance(first[m], dict) and "per_sample" in first[m]]
        merged = {"location": first["location"], "cloud_class": first["cloud_class"]}
        for method in methods:
            per_sample = np.mean([r[method]["per_sample"]["psnr"] for r in results], axis=0)
            merged[method] = {"mean": {"psnr": float(per_sample.mean())}, "per_sample": {"psnr": per_sample.tolist()}}
        baselines = [m for m in methods if m != "model"]
        merged["strongest"] = strongest(merged, baselines)
        out[protocol] = {
            "samples": first["samples"],
            "psnr": {m: round(merged[m]["mean"]["psnr"], 2) for m in methods},
            "model_per_seed": [round(r["model"]["mean"]["psnr"], 2) for r in results],
            "strongest": {
                k: v for k, v in merged["strongest"].items() if k in ("baseline", "difference", "ci", "wins", "samples")
            },
            "headline": headline(merged),
            "fallbacks": first.get("context", {}).get("fallbacks", {}),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/vcloud-bench-realdata"))
    parser.add_argument("--stages", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--design",
        nargs="+",
        action="append",
        metavar=("NAME", "KEY=VALUE"),
        help="a design: name and model-config changes",
    )
    args = parser.parse_args()
    if not LOCATION.is_dir():
        sys.exit(f"{LOCATION}: the shared real series is not beside the repository (../shared/realdata)")
    designs = (
        DESIGNS
        if not args.design
        else {d[0]: {k: yaml.safe_load(v) for k, v in (c.split("=", 1) for c in d[1:])} for d in args.design}
    )
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    stores = prepare(args.work)
    result: dict = {
        "benchmark": "realdata",
        "location": str(LOCATION.relative_to(REPO.parent)),
        "split": SPLIT,
        "designs": {},
    }
    for name, changes in designs.items():
        by_seed = [train_and_score(args.work, stores, name, changes, seed, args.stages) for seed in args.seeds]
        result["designs"][name] = {
            "changes": changes,
            "stages": {
                f"stage{s}": {split: summarise(by_seed, s, split) for split in ("val", "test")} for s in args.stages
            },
        }
    result["seeds"] = args.seeds
    result["seconds"] = round(time.time() - started, 1)
    sys.path.insert(0, str(REPO / "bench"))
    from common import emit

    emit(result)


if __name__ == "__main__":
    main()
