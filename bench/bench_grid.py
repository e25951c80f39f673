"""A small research grid through the workflow, to tell a design change from seed noise: S1
dropout 0.25 (the model configs' value) against 0, three seeds each, and within every run the
refiner on (stage 2) against off (stage 1, its draft).

The grid is the workflow's own (`experiments:` and `seeds:`, docs/workflow.md): every run's
stages trained and scored on val and test, then `vcloud compare` (results/compare.json). Printed
as one JSON object:

- `s1_dropout`: per split, stage and protocol, the seed means of both experiments and the
  difference 0 - 0.25 paired sample by sample and seed by seed, with its 95 % interval (the seed
  level and the location clustering: evaluation/stats.py seeded_difference);
- `refiner`: per experiment, split and protocol, stage 2 - stage 1 paired the same way (the
  same samples, the same seeds);
- `distinguishable`: each of those whose interval excludes 0.

    python bench/bench_grid.py --workdir DIR [--seeds 0 1 2] [--configfile FILE]

DIR is made (or reused: snakemake redoes nothing finished); the default data and models are the
embedded default's (the small synthetic dataset, config/models/small.yaml). Not a test: 100
jobs, about 25 minutes on an idle 2-core machine (docs/evaluation.md, "A grid over seeds").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
from vcloud.evaluation.compare import _pooled, _read  # noqa: E402
from vcloud.evaluation.stats import seeded_difference  # noqa: E402

BASELINE = "s1_dropout_025"
OTHER = "s1_dropout_0"
PROTOCOLS = ("fixed", "natural")  # the simulated-cloud protocol, the natural ones pooled


def grid_config(seeds: list[int]) -> dict:
    return {
        "experiments": [{"name": BASELINE}, {"name": OTHER, "overrides": {"data": {"s1_dropout": 0.0}}}],
        "seeds": seeds,
        "compare": {"baseline": BASELINE},
    }


def run_grid(workdir: Path, seeds: list[int], configfile: Path | None) -> float:
    grid = workdir / "grid.yaml"
    grid.write_text(yaml.safe_dump(grid_config(seeds)))
    files = [*([str(configfile)] if configfile else []), str(grid)]
    command = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--cores", "all", "-d", str(workdir)]
    command += ["results/compare.json", "--configfile", *files]  # the target first: --configfile takes the rest
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=sys.stderr)
    return time.perf_counter() - started


def _interval(diff: dict) -> dict:
    return {
        "difference_db": round(diff["difference"], 3),
        "ci95_db": None if diff["ci"] is None else [round(v, 3) for v in diff["ci"]],
        "per_seed_db": [round(v, 3) for v in diff["per_seed"]],
        "se_seed_db": None if diff["se_seed"] is None else round(diff["se_seed"], 3),
        "se_location_db": None if diff.get("se_location") is None else round(diff["se_location"], 3),
        "samples": diff.get("samples"),
        "locations": diff.get("locations"),
    }


def s1_dropout_rows(comparison: dict) -> list[dict]:
    rows = []
    for row in comparison["rows"]:
        if row["experiment"] != OTHER or row["protocol"] not in PROTOCOLS or row["difference"] is None:
            continue
        base = next(
            r
            for r in comparison["rows"]
            if (r["split"], r["stage"], r["protocol"], r["experiment"])
            == (row["split"], row["stage"], row["protocol"], BASELINE)
        )
        rows.append(
            {
                "split": row["split"],
                "stage": row["stage"],
                "protocol": row["protocol"],
                "mean_psnr_db": {BASELINE: round(base["mean"], 3), OTHER: round(row["mean"], 3)},
                "std_over_seeds_db": {BASELINE: _round(base["std"]), OTHER: _round(row["std"])},
                f"{OTHER} - {BASELINE}": _interval(row["difference"]),
            }
        )
    return rows


def _round(value):
    return None if value is None else round(value, 3)


def report_of(workdir: Path, experiment: str, seed: int, stage: int, split: str) -> Path:
    suffix = "" if split == "test" else f".{split}"
    path = workdir / "results" / experiment / f"seed{seed}" / "eval" / f"stage{stage}{suffix}.json"
    if not path.is_file():
        raise SystemExit(f"{path}: missing (a stage shared with another run? this grid shares none)")
    return path


def refiner_rows(workdir: Path, seeds: list[int]) -> list[dict]:
    rows = []
    for experiment in (BASELINE, OTHER):
        for split in ("val", "test"):
            got = {
                stage: [_read(report_of(workdir, experiment, s, stage, split))["protocols"] for s in seeds]
                for stage in (1, 2)
            }
            for protocol in PROTOCOLS:
                refined = [_pooled(p, protocol) for p in got[2]]
                draft = [_pooled(p, protocol) for p in got[1]]
                if any(v is None for v in refined + draft):
                    continue
                if any(r[2] != d[2] for r, d in zip(refined, draft)):
                    raise SystemExit(f"{experiment} {split} {protocol}: stages 1 and 2 scored on different samples")
                diff = seeded_difference([r[0] for r in refined], [d[0] for d in draft], groups=refined[0][1])
                rows.append(
                    {"experiment": experiment, "split": split, "protocol": protocol, "stage2 - stage1": _interval(diff)}
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--configfile", type=Path, help="a workflow config under the grid (default: the embedded one)")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    wall = run_grid(args.workdir, args.seeds, args.configfile)
    comparison = json.loads((args.workdir / "results" / "compare.json").read_text())
    s1 = s1_dropout_rows(comparison)
    refiner = refiner_rows(args.workdir, args.seeds)

    def excludes_zero(interval: dict) -> bool:
        ci = interval["ci95_db"]
        return ci is not None and (ci[0] > 0 or ci[1] < 0)

    distinguishable = [
        f"s1_dropout {r['split']} stage {r['stage']} {r['protocol']}: {r[f'{OTHER} - {BASELINE}']['difference_db']:+.3f} dB"
        for r in s1
        if excludes_zero(r[f"{OTHER} - {BASELINE}"])
    ] + [
        f"refiner {r['experiment']} {r['split']} {r['protocol']}: {r['stage2 - stage1']['difference_db']:+.3f} dB"
        for r in refiner
        if excludes_zero(r["stage2 - stage1"])
    ]
    print(
        json.dumps(
            {
                "grid": grid_config(args.seeds),
                "decided_on": comparison.get("decided_on"),
                "wall_s": round(wall, 1),
                "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                "s1_dropout": s1,
                "refiner": refiner,
                "distinguishable": distinguishable,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
