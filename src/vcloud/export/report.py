"""Figures and tables for `snakemake --report`: training curves, evaluation tables, accounting.

- `plot_curves`: one PNG per stage from results/stage<n>/metrics.jsonl (training loss, val PSNR
  and samples/s per epoch; a resumed run's repeated epochs count once, the last line wins).
- `evaluation_tables`: one HTML page of every results/eval/stage<n>.json, opening with each stage
  against the strongest simple answer per protocol (and the context policy's fallbacks, counted);
  then each protocol's setup, mean metrics per protocol and method, paired differences stage -
  baseline with standard errors, and PSNR per cloud class (optionally the same as Markdown).
- `accounting`: wall time of every job from benchmarks/<rule>/*.tsv (column `s`), with
  CPU-hours = threads x hours and GPU-hours = gpus x nodes x hours from the rule's resources
  entry (the config key is the rule's name; a rule without one counts as 1 thread, no GPU, and is named on the page), per rule and per stage, as TSV and HTML.
"""

from __future__ import annotations

import csv
import html
import json
from dataclasses import dataclass
from pathlib import Path

from vcloud.errors import BadInputError
from vcloud.io import atomic_open, atomic_output, atomic_write_text
from vcloud.registry import stage_of_rule

CURVES = (("loss", "training loss"), ("val_psnr", "validation PSNR (dB)"), ("samples_per_s", "samples/s"))
PAGE_STYLE = (
    "body{font:14px/1.4 system-ui,sans-serif;color:#1d232a;margin:12px}"
    "table{border-collapse:collapse;margin:6px 0 18px;font-variant-numeric:tabular-nums}"
    "th,td{padding:3px 10px;border-bottom:1px solid #d5dbe0;text-align:right}"
    "th:first-child,td:first-child,th.l,td.l{text-align:left}h2{font-size:16px}"
    "p{color:#5b6670;font-size:12px}"
)


def _page(title: str, body: str) -> str:
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{PAGE_STYLE}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>\n"
    )


def _table(header: list[str], rows: list[list[str]], *, left: int = 1) -> str:
    def cells(tag: str, values: list[str]) -> str:
        return "".join(
            f"<{tag}{' class=l' if i < left else ''}>{html.escape(str(v))}</{tag}>" for i, v in enumerate(values)
        )

    body = "".join(f"<tr>{cells('td', row)}</tr>" for row in rows)
    return f"<table><thead><tr>{cells('th', header)}</tr></thead><tbody>{body}</tbody></table>"


# --- training curves ---------------------------------------------------------------------


def read_metrics(path: Path) -> list[dict]:
    """Epoch records of a metrics.jsonl in epoch order; a repeated epoch keeps its last line."""
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"{path}: no such metrics file (has the stage been trained?)")
    epochs: dict[int, dict] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            epochs[int(record["epoch"])] = record
        except (ValueError, KeyError, TypeError) as err:
            raise BadInputError(f"{path}:{number}: not an epoch record ({err})") from err
    return [epochs[e] for e in sorted(epochs)]


def plot_curves(metrics: Path, out: Path, *, title: str) -> None:
    """Loss, val PSNR and samples/s against epoch, side by side, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    records = read_metrics(metrics)
    fig, axes = plt.subplots(1, len(CURVES), figsize=(11, 3.2), dpi=100, layout="constrained")
    for ax, (key, label) in zip(axes, CURVES):
        points = [(r["epoch"] + 1, r[key]) for r in records if isinstance(r.get(key), (int, float))]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.5, color="#1f6feb")
        else:
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    # A stage that validates its starting point first (trainer StageTask.validate_initial) has
    # a row "epoch": -1, drawn at 0 and not counted as an epoch.
    trained = sum(1 for r in records if r["epoch"] >= 0)
    start = " + the start at 0" if len(records) > trained else ""
    fig.suptitle(f"{title} ({trained} epochs{start}, {metrics})", fontsize=11)
    with atomic_output(out) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})
    plt.close(fig)


# --- evaluation tables --------------------------------------------------------------------


def evaluation_tables(reports: list[Path], out: Path, *, markdown: Path | None = None) -> None:
    """One HTML page with every stage's evaluation. It opens with each stage against the strongest
    simple answer, per protocol (scoring.headline: the paired difference from the baseline of the
    highest mean PSNR, its interval, the samples won, and whether the stage beats it), with the
    context policy's fallbacks counted where there are any; then, per stage, each protocol's setup,
    means per protocol and method, paired differences stage - baseline (mean ± SE, per cloud
    class), PSNR per cloud class.

    `markdown`: the same as Markdown (what the README's and docs' tables are pasted from).
    """
    from vcloud.evaluation import scoring  # torch: only where evaluation tables are made
    from vcloud.evaluation.compare import fallbacks, strongest_of

    sections, texts, opening = [], [], []
    for path in reports:
        try:
            report = json.loads(Path(path).read_text())
            protocols = report["protocols"]
            stage = report["stage"]
        except (OSError, ValueError, KeyError) as err:
            raise BadInputError(f"{path}: not an evaluation report ({err})") from err
        for protocol, result in protocols.items():
            # A report of before `strongest`: the same, from its per-sample values (compare.strongest_of).
            line = scoring.headline({"strongest": strongest_of(result)})
            counted = fallbacks(result)
            if line or counted:
                opening.append(f"stage {stage}, {protocol}: " + "; ".join(t for t in (line, counted) if t))
        class_rows = []
        for protocol, result in protocols.items():
            for method in scoring.METHODS:
                for cloud_class, values in result.get(method, {}).get("by_class", {}).items():
                    class_rows.append([protocol, method, cloud_class, str(values["samples"]), f"{values['psnr']:.2f}"])
        setups = "".join(f"<li>{html.escape(scoring.describe(result))}</li>" for result in protocols.values())
        sections.append(
            f"<h2>stage {stage}</h2><p>{html.escape(str(path))}, store {html.escape(str(report.get('store')))}</p>"
            f"<ul>{setups}</ul>"
            + _table(scoring.MEAN_HEADER, scoring.mean_rows(report), left=2)
            + _table(scoring.DIFFERENCE_HEADER, scoring.difference_rows(report), left=3)
            + _table(["protocol", "method", "cloud class", "samples", "PSNR dB"], class_rows, left=3)
        )
        texts.append(f"## stage {stage} ({path})\n\n{scoring.table(report)}\n")
    top = ""
    if opening:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in opening)
        top = f'<h2>Against the strongest simple answer</h2><ul id="strongest">{items}</ul>'
        texts.insert(0, "## Against the strongest simple answer\n\n" + "".join(f"- {x}\n" for x in opening))
    body = top + f"<p>{html.escape(EVALUATION_NOTE)}</p>" + "".join(sections)
    atomic_write_text(out, _page("Evaluation", body))
    if markdown is not None:
        atomic_write_text(markdown, "\n".join(texts))


# What the evaluation page says of its protocols and baselines (docs/evaluation.md tells it at length).
EVALUATION_NOTE = (
    "Metrics on the S2 0..1 scale (PSNR dB, SAM degrees). Protocols: fixed, seeded synthetic "
    "thin/thick/opaque clouds on clear dates; reference, clear dates of each location as the truth "
    "(evaluation.reference_truths) and T other dates with their natural clouds as the input; both "
    "take their input dates by the model's context policy (data.context: nearest, clearest within "
    "+-window_days, random), record every sample's dates and count the policy's fallbacks; "
    "uncrtaints, the published protocol (the reference loader's fixed sampler). 'model' is the "
    "stage itself. Baselines on the same samples: from the model's own input dates, on every "
    "protocol, least_cloudy_date, median_mosaic and nearest_clear_date; from every date of the "
    "series but the hidden truth, on fixed and reference only, the series_ baselines "
    "(series_nearest_clear_date, series_clear_median and series_least_cloudy within "
    "+-evaluation.series_window_days, series_nearest_clear_value per pixel, series_mosaic of the "
    "model's context dates; whole images, the truth hidden whole, but series_clear_median_kept, "
    "which keeps the truth's seen pixels and fills the rest): they see at least what the model "
    "sees. The strongest simple answer is the baseline of the highest mean PSNR on the protocol's "
    "samples, chosen after the fact (the hardest comparison); its interval is a t interval from "
    "the location-clustered standard error (per sample when the samples are of one location), and "
    "wins count the samples the model scores higher. Differences are model - baseline with the "
    "paired standard error over samples and, for PSNR, the one clustered by location."
)


# --- accounting ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleCost:
    rule: str
    stage: str
    jobs: int
    wall_s: float
    cpu_time_s: float
    threads: int
    gpus: int  # per job: gpus per node x nodes
    assumed: bool = False  # no resources entry: counted with DEFAULT_RESOURCES
    # What the cluster bills per wall hour of one job (entry "billing" of the resources JSON,
    # computed by vcloud.runtime.billing.billing from the job's actual resources); None locally.
    billed_unit: str | None = None  # the site's unit: "GPU-h" or "core-h" (LUMI), "BU-h" (Sigma2), ...
    billed_per_h: float | None = None

    @property
    def wall_h(self) -> float:
        return self.wall_s / 3600

    @property
    def cpu_h(self) -> float:
        return self.threads * self.wall_h

    @property
    def gpu_h(self) -> float:
        """Billed GPU hours where the site bills GPU hours (LUMI: 0.5 per GCD-hour on small-g);
        elsewhere, and without billing information, GPU-hours (gpus x wall hours)."""
        if self.billed_unit == "GPU-h":
            return self.billed_per_h * self.wall_h
        if self.billed_unit == "core-h":
            return 0.0
        return self.gpus * self.wall_h

    @property
    def billed(self) -> float | None:
        """What the site bills for the rule's jobs, in billed_unit; None without a cluster."""
        return None if self.billed_unit is None else self.billed_per_h * self.wall_h

    @property
    def billed_core_h(self) -> float:
        """Billed CPU core-hours of a CPU partition (LUMI small: max(cores, memory / 2 GB))."""
        return self.billed_per_h * self.wall_h if self.billed_unit == "core-h" else 0.0


DEFAULT_RESOURCES = {"threads": 1, "gpus": 0, "nodes": 1}  # a rule without an entry (snakemake's default)


def resources_of(rule: str, resources: dict) -> dict | None:
    """A rule's resources entry (the config key is the rule's name)."""
    return resources.get(rule)


DATA_RULES = ("synth_raw", "index_archive", "prepare_roi", "assemble_split", "era5_wind", "wind_cache")


def stage_of(rule: str) -> str:
    """The group a rule's hours are booked under: its stage's name (registry: train_stage<n>,
    evaluate_stage<n>), "data" or "export"."""
    stage = stage_of_rule(rule)
    if stage is not None:
        return stage.name
    return "data" if rule in DATA_RULES else "export"


def read_benchmark(path: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one benchmark TSV, summed over its repeats."""
    try:
        with open(path, newline="") as handle:
            rows = list(csv.DictReader(handle, delimiter="\t"))
        wall = sum(float(row["s"]) for row in rows)
        cpu = sum(float(row.get("cpu_time") or 0.0) for row in rows)
    except (OSError, KeyError, ValueError) as err:
        raise BadInputError(f"{path}: not a snakemake benchmark file ({err})") from err
    if not rows:
        raise BadInputError(f"{path}: benchmark file has no row")
    return wall, cpu


def collect_costs(benchmarks: Path, resources: dict) -> list[RuleCost]:
    """One RuleCost per rule folder under `benchmarks` that holds at least one TSV."""
    costs = []
    for folder in sorted(p for p in Path(benchmarks).iterdir() if p.is_dir()):
        files = sorted(folder.rglob("*.tsv"))  # research runs: benchmarks/<rule>/<experiment>/seed<k>/
        if not files:
            continue
        times = [read_benchmark(f) for f in files]
        found = resources_of(folder.name, resources)
        res = DEFAULT_RESOURCES if found is None else found
        bill = res.get("billing") or {}
        unit, per_hour = bill.get("unit"), bill.get("per_hour")
        if bill and (not isinstance(unit, str) or not unit or not isinstance(per_hour, (int, float))):
            raise BadInputError(
                f"--resources: {folder.name}: billing must be {{unit: the site's unit (GPU-h, core-h, BU-h), per_hour: number}}"
            )
        costs.append(
            RuleCost(
                rule=folder.name,
                stage=stage_of(folder.name),
                jobs=len(files),
                wall_s=sum(t[0] for t in times),
                cpu_time_s=sum(t[1] for t in times),
                threads=int(res["threads"]),
                gpus=int(res.get("gpus", 0)) * int(res.get("nodes", 1)),
                assumed=found is None,
                billed_unit=bill.get("unit"),
                billed_per_h=bill.get("per_hour"),
            )
        )
    return costs


COLUMNS = [
    "rule",
    "stage",
    "jobs",
    "threads",
    "gpus",
    "wall_s",
    "wall_h",
    "cpu_h",
    "cpu_time_h",
    "gpu_h",
    "billed_core_h",
    "billed",
    "billed_unit",
]


def _row(c: RuleCost) -> list[str]:
    return [
        c.rule,
        c.stage,
        str(c.jobs),
        str(c.threads),
        str(c.gpus),
        f"{c.wall_s:.2f}",
        f"{c.wall_h:.4f}",
        f"{c.cpu_h:.4f}",
        f"{c.cpu_time_s / 3600:.4f}",
        f"{c.gpu_h:.4f}",
        f"{c.billed_core_h:.4f}",
        "" if c.billed is None else f"{c.billed:.4f}",
        c.billed_unit or "",
    ]


def _totals(name: str, stage: str, costs: list[RuleCost]) -> list[str]:
    wall = sum(c.wall_s for c in costs)
    return [
        name,
        stage,
        str(sum(c.jobs for c in costs)),
        "",
        "",
        f"{wall:.2f}",
        f"{wall / 3600:.4f}",
        f"{sum(c.cpu_h for c in costs):.4f}",
        f"{sum(c.cpu_time_s for c in costs) / 3600:.4f}",
        f"{sum(c.gpu_h for c in costs):.4f}",
        f"{sum(c.billed_core_h for c in costs):.4f}",
        *_billed_total(costs),
    ]


def _billed_total(costs: list[RuleCost]) -> list[str]:
    """The billed column of a totals row: one sum where one unit, else each unit's own."""
    units = sorted({c.billed_unit for c in costs if c.billed_unit})
    if not units:
        return ["", ""]
    sums = {unit: sum(c.billed for c in costs if c.billed_unit == unit) for unit in units}
    if len(units) == 1:
        return [f"{sums[units[0]]:.4f}", units[0]]
    return [" + ".join(f"{value:.4f} {unit}" for unit, value in sums.items()), "mixed"]


def accounting(benchmarks: Path, resources: dict, *, tsv: Path, page: Path) -> list[RuleCost]:
    """Per-rule and per-stage wall, CPU and GPU hours; TSV for tools, HTML for the report."""
    if not Path(benchmarks).is_dir():
        raise BadInputError(f"{benchmarks}: no benchmarks folder")
    costs = collect_costs(benchmarks, resources)
    rows = [_row(c) for c in costs]
    stages = sorted({c.stage for c in costs}, key=lambda s: (s != "data", s == "export", s))
    stage_rows = [_totals("(all rules)", s, [c for c in costs if c.stage == s]) for s in stages]
    total = _totals("(total)", "all", costs)

    assumed = [c.rule for c in costs if c.assumed]
    note = (
        f"<p>No resources entry for {html.escape(', '.join(assumed))}: counted with 1 thread and no GPU.</p>"
        if assumed
        else ""
    )
    body = (
        "<p>Wall time of every job from benchmarks/&lt;rule&gt;/*.tsv (column s, summed over a rule's jobs). "
        "cpu_h = threads x wall hours; cpu_time_h = CPU time measured by snakemake. On a cluster, gpu_h and "
        "billed_core_h are what LUMI bills for each job's actual resources (LUMI user guide, "
        "docs/runjobs/lumi_env/billing.md: small-g/dev-g 0.5 x max(ceil(cores/8), ceil(memory/64 GB), GCDs) "
        "GPU-h per hour, standard-g 4 per node-hour, small max(cores, ceil(memory/2 GB)) core-h per hour); "
        "without a cluster section gpu_h = gpus x nodes x wall hours (0 on the default CPU configuration). "
        "billed is what the site bills for the rule's jobs in its own unit (billed_unit: LUMI's GPU-h or "
        "core-h, Sigma2's billing units BU-h, from the site file's billing formula). "
        "Jobs that ran after this table (the accounting itself) are not in it.</p>"
        + note
        + "<h2>per stage</h2>"
        + _table(COLUMNS, [*stage_rows, total], left=2)
        + "<h2>per rule</h2>"
        + _table(COLUMNS, rows, left=2)
    )
    with atomic_open(tsv, "w", newline="") as handle:
        csv.writer(handle, delimiter="\t", lineterminator="\n").writerows([COLUMNS, *rows, *stage_rows, total])
    atomic_write_text(page, _page("Accounting", body))
    return costs
