"""Small research grids through the workflow, to tell a design change from seed noise, three
seeds each:

- `--grid s1_dropout` (the default): S1 dropout 0.25 (the model configs' value) against 0, and
  within every run the refiner on (stage 2) against off (stage 1, its draft);
- `--grid stage3`: stage 3's design, re-decided on val: the shipped one (loss on the refined
  output, gradient through the sampler's last step, natural pairs) against the loss on the bare
  draft (`loss_on: draft`), the gradient through both sampler steps (`grad_steps: 2`) and no
  natural pairs (`natural_pairs: 0`); and stage 3 against stage 2 within the shipped runs.

The grid is the workflow's own (`experiments:` and `seeds:`, docs/workflow.md): every run's
stages trained and scored on val and test, then `vcloud compare` (results/compare.json). The
first experiment of both grids is the default configuration under one name, so the two grids
share a workdir: the stage-3 grid's variants read its stages 0-2 and train stage 3 alone.
Printed as one JSON object:

- `rows`: per split, stage and protocol, the seed means of the baseline and the other
  experiment and their difference paired sample by sample and seed by seed, with its 95 %
  interval (the seed level and the location clustering: evaluation/stats.py seeded_difference);
- `stages`: per experiment, split and protocol, a stage against the one before it (2 - 1 or
  3 - 2) paired the same way (the same samples, the same seeds);
- `distinguishable`: each of those whose interval excludes 0.

    python bench/bench_grid.py --workdir DIR [--grid s1_dropout|stage3] [--seeds 0 1 2] [--configfile FILE]

DIR is made (or reused: snakemake redoes nothing finished); the default data and models are the
embedded default's (the small synthetic dataset, config/models/small.yaml). Not a test: the
s1_dropout grid is 100 jobs, about 25 minutes on an idle 2-core machine; the stage3 grid after
it 37 jobs (9 stage-3 trainings), about 20 (docs/evaluation.md, "A grid over seeds").
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

BASELINE = "s1_dropout_025"  # the default configuration: the model configs' S1 dropout is 0.25
PROTOCOLS = ("fixed", "natural")  # the simulated-cloud protocol, the natural ones pooled


def self_training(**keys) -> dict:
    return {"stage3": {"self_training": keys}}


# grid -> (its experiments after the baseline: name -> overrides, the stages compared within runs)
GRIDS = {
    "s1_dropout": ({"s1_dropout_0": {"data": {"s1_dropout": 0.0}}}, (2, 1)),
    "stage3": (
        {
            "s3_loss_on_draft": self_training(loss_on="draft"),
            "s3_grad_steps_2": self_training(grad_steps=2),
            "s3_no_natural_pairs": self_training(natural_pairs=0),
        },
        (3, 2),
    ),
}


def grid_config(grid: str, seeds: list[int]) -> dict:
    others = GRIDS[grid][0]
    return {
        "experiments": [{"name": BASELINE}, *({"name": n, "overrides": o} for n, o in others.items())],
        "seeds": seeds,
        "compare": {"baseline": BASELINE},
    }


def run_grid(workdir: Path, grid_name: str, seeds: list[int], configfile: Path | None) -> float:
    grid = workdir / f"grid-{grid_name}.yaml"
    grid.write_text(yaml.safe_dump(grid_config(grid_name, seeds)))
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


def experiment_rows(comparison: dict, others) -> list[dict]:
    """Each other experiment's rows of compare.json against the baseline's, where they differ
    (a stage shared with the baseline is the same weights: no row)."""
    rows = []
    for row in comparison["rows"]:
        if row["experiment"] not in others or row["protocol"] not in PROTOCOLS or row["difference"] is None:
            continue
        if row.get("shared_with_baseline"):
            continue
        base = next(
            r
            for r in comparison["rows"]
            if (r["split"], r["stage"], r["protocol"], r["experiment"])
            == (row["split"], row["stage"], row["protocol"], BASELINE)
        )
        other = row["experiment"]
        rows.append(
            {
                "split": row["split"],
                "stage": row["stage"],
                "protocol": row["protocol"],
                "experiment": other,
                "mean_psnr_db": {BASELINE: round(base["mean"], 3), other: round(row["mean"], 3)},
                "std_over_seeds_db": {BASELINE: _round(base["std"]), other: _round(row["std"])},
                "difference": _interval(row["difference"]),
            }
        )
    return rows


def _round(value):
    return None if value is None else round(value, 3)


def report_of(workdir: Path, experiment: str, seed: int, stage: int, split: str) -> Path:
    """A run's report of a stage; a stage it shares is scored in the baseline's folder."""
    suffix = "" if split == "test" else f".{split}"
    for owner in (experiment, BASELINE):
        path = workdir / "results" / owner / f"seed{seed}" / "eval" / f"stage{stage}{suffix}.json"
        if path.is_file():
            return path
    raise SystemExit(f"{path}: missing, nor in {experiment}'s folder")


def stage_rows(workdir: Path, experiments, seeds: list[int], upper: int, lower: int) -> list[dict]:
    """Stage `upper` against stage `lower` within each run, paired by sample and seed."""
    rows = []
    for experiment in experiments:
        for split in ("val", "test"):
            got = {
                stage: [_read(report_of(workdir, experiment, s, stage, split))["protocols"] for s in seeds]
                for stage in (lower, upper)
            }
            for protocol in PROTOCOLS:
                high = [_pooled(p, protocol) for p in got[upper]]
                low = [_pooled(p, protocol) for p in got[lower]]
                if any(v is None for v in high + low):
                    continue
                if any(h[2] != d[2] for h, d in zip(high, low)):
                    raise SystemExit(
                        f"{experiment} {split} {protocol}: stages {lower} and {upper} on different samples"
                    )
                diff = seeded_difference([h[0] for h in high], [d[0] for d in low], groups=high[0][1])
                rows.append(
                    {
                        "experiment": experiment,
                        "split": split,
                        "protocol": protocol,
                        f"stage{upper} - stage{lower}": _interval(diff),
                    }
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--grid", choices=sorted(GRIDS), default="s1_dropout")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--configfile", type=Path, help="a workflow config under the grid (default: the embedded one)")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    others, (upper, lower) = GRIDS[args.grid]
    wall = run_grid(args.workdir, args.grid, args.seeds, args.configfile)
    comparison = json.loads((args.workdir / "results" / "compare.json").read_text())
    rows = experiment_rows(comparison, others)
    stages = stage_rows(args.workdir, [BASELINE, *others], args.seeds, upper, lower)
    within = f"stage{upper} - stage{lower}"

    def excludes_zero(interval: dict) -> bool:
        ci = interval["ci95_db"]
        return ci is not None and (ci[0] > 0 or ci[1] < 0)

    distinguishable = [
        f"{r['experiment']} - {BASELINE} {r['split']} stage {r['stage']} {r['protocol']}: "
        f"{r['difference']['difference_db']:+.3f} dB"
        for r in rows
        if excludes_zero(r["difference"])
    ] + [
        f"{within} {r['experiment']} {r['split']} {r['protocol']}: {r[within]['difference_db']:+.3f} dB"
        for r in stages
        if excludes_zero(r[within])
    ]
    print(
        json.dumps(
            {
                "grid": grid_config(args.grid, args.seeds),
                "decided_on": comparison.get("decided_on"),
                "wall_s": round(wall, 1),
                "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                "rows": rows,
                "stages": stages,
                "distinguishable": distinguishable,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
