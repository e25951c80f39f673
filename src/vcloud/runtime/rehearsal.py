"""The rehearsal's closing summary (`vcloud rehearsal-summary`), and what the doctor makes of it.

The rehearsal (config/rehearsal.yaml over a site's run file) runs every rule of the real run on
the site's rehearsal partition or QOS for about 1 GPU-h. Its summary gathers what only the real
machine can say: the GPUs each rank sees and the GPU runtime (HIP or CUDA version), the
environment image's stamp, the MIOpen cache (AMD), each rank's CPU mask, peak GPU memory of each
stage (stage 1 against `vcloud memory`'s estimate), the forced wall-time warning's resume, the
collectives' transport (RCCL or NCCL), and the time per sample of each stage, turned into the
epoch minutes of the full run for the site's run file (minutes_of_epoch at stage_samples: the
samples per epoch it records beside them, from which the bill scales a run of other samples per
epoch). It passes when every stage finished, one resumed after the
forced warning, and the transport check passed (when it ran). `vcloud doctor` recommends the
rehearsal until a passing summary exists for the current environment image.
A rehearsal of a grid (experiments, seeds) tries one run of it (vcloud.config.experiments.
rehearsed_run); its summary names that run's experiment and seed.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from vcloud.io import atomic_write_text
from vcloud.registry import STAGES

RANK_LINE = re.compile(
    r"rank (\d+)/(\d+) .*? device (\S+)(?: of (\d+))?(?: \(((?:hip|cuda) [^)]+)\))? .*?cpu affinity ([0-9a-fA-Fx]+|n/a)"
)
RESUMED = "resuming from"


def _rows(path: Path) -> list[dict]:
    rows = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return rows
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def stage_summary(*, results: Path, logs: Path, stage) -> dict:
    """What one stage's files say: finished, resumed, time per sample, peak memory, ranks."""
    rows = _rows(results / stage.folder / "metrics.jsonl")
    log_path = logs / stage.train_rule / f"{stage.train_rule}.log"
    text = log_path.read_text(errors="replace") if log_path.is_file() else ""
    ranks = [
        {"rank": int(m[1]), "world": int(m[2]), "device": m[3], "devices": m[4], "runtime": m[5], "cpu_mask": m[6]}
        for m in RANK_LINE.finditer(text)
    ]
    per_sample = [
        1 / r["samples_per_s"]
        for r in rows
        if isinstance(r.get("samples_per_s"), (int, float)) and r["samples_per_s"] > 0
    ]
    return {
        "finished": (results / stage.folder / "best.pt").is_file(),
        "epochs": len(rows),
        "resumed": RESUMED in text,
        "seconds_per_sample": min(per_sample) if per_sample else None,
        "peak_memory_gb": max((r.get("peak_memory_mb", 0) for r in rows), default=0) / 1024 or None,
        "ranks": ranks,
    }


def summarize(
    *,
    results: Path,
    logs: Path,
    stamp: str | None,
    miopen_cache: str | None,
    transport: Path | None,
    full_samples_per_epoch: dict[str, int] | None = None,
    train_locations: int | None = None,
    stage1_estimate_gb: float | None = None,
    run: dict | None = None,
) -> dict:
    stages = {stage.name: stage_summary(results=Path(results), logs=Path(logs), stage=stage) for stage in STAGES}
    transport_report = json.loads(Path(transport).read_text()) if transport and Path(transport).is_file() else None
    ranks = [r for s in stages.values() for r in s["ranks"]]
    runtime = next((r["runtime"] for r in ranks if r["runtime"]), None) or _transport_runtime(transport_report)
    devices = next((int(r["devices"]) for r in ranks if r["devices"]), None)
    epoch_minutes = {}
    for name, found in stages.items():
        samples = (full_samples_per_epoch or {}).get(name)
        if samples and found["seconds_per_sample"]:
            epoch_minutes[f"train_{name}"] = round(minutes_of_epoch(samples, found["seconds_per_sample"]), 1)
    problems = [f"{name}: not finished" for name, s in stages.items() if not s["finished"]]
    if not any(s["resumed"] for s in stages.values()):
        problems.append("no stage resumed after the forced wall-time warning (resources.<rule>.rehearse_warning)")
    if transport is not None and not (transport_report or {}).get("ok"):
        problems.append("the transport check of the collectives did not pass (rehearse_transport)")
    return {
        "passed": not problems,
        "problems": problems,
        "run": run,  # a grid's rehearsal: {"experiment", "seed"} of the one run tried; None: a single run
        "stamp": stamp,
        "gpus_visible": devices,
        "gpu_runtime": runtime,
        "miopen_cache": miopen_cache,
        "cpu_masks": sorted({r["cpu_mask"] for r in ranks}),
        "stage1_memory": {"peak_gb": stages["stage1"]["peak_memory_gb"], "estimate_gb": stage1_estimate_gb},
        "transport": transport_report,
        "epoch_minutes": epoch_minutes,
        # What epoch_minutes are for: the full run's samples per epoch of each stage, and the
        # training locations that "one per location" was counted as (the bill scales from them).
        "epoch_samples": {
            f"train_{name}": samples
            for name, samples in (full_samples_per_epoch or {}).items()
            if f"train_{name}" in epoch_minutes
        },
        "train_locations": train_locations,
        "stages": stages,
    }


def lines(summary: dict) -> list[str]:
    """The summary for people (the rule's log)."""
    out = [f"rehearsal: {'PASSED' if summary['passed'] else 'FAILED'}"]
    out += [f"  problem: {p}" for p in summary["problems"]]
    if run := summary.get("run"):
        seed = "" if run.get("seed") is None else f", seed {run['seed']}"
        out.append(f"  rehearsed one run of the grid: experiment {run['experiment']}{seed}")
    runtime = (summary["gpu_runtime"] or "none seen").replace("hip", "HIP").replace("cuda", "CUDA")
    out.append(f"  GPUs visible {summary['gpus_visible']}, GPU runtime {runtime}, image {summary['stamp']}")
    cache = f"MIOpen cache {summary['miopen_cache']}, " if summary["miopen_cache"] else ""
    out.append(f"  {cache}CPU masks {', '.join(summary['cpu_masks']) or '-'}")
    mem = summary["stage1_memory"]
    out.append(f"  stage 1 peak {mem['peak_gb']} GB against the estimate {mem['estimate_gb']} GB")
    for name, stage in summary["stages"].items():
        out.append(
            f"  {name}: finished {stage['finished']}, resumed {stage['resumed']}, "
            f"{stage['seconds_per_sample']} s per sample, peak {stage['peak_memory_gb']} GB"
        )
    for rule, minutes in summary["epoch_minutes"].items():
        out.append(f"  resources.{rule}.epoch_minutes: {minutes} (measured; put it in the site's run file)")
    return out


def _transport_runtime(report: dict | None) -> str | None:
    """The GPU runtime the transport step's report names (HIP or CUDA), as the rank lines do."""
    for key in ("hip", "cuda"):
        if (report or {}).get(key):
            return f"{key} {report[key]}"
    return None


def write(summary: dict, out: Path) -> None:
    atomic_write_text(Path(out), json.dumps(summary, indent=2, default=str) + "\n")


def doctor_warning(config: dict, stamp: str | None) -> str | None:
    """The doctor's recommendation while no passing rehearsal exists for this environment."""
    from vcloud.runtime.image import same_code

    section = config.get("rehearsal") or {}
    if section.get("enabled"):
        return None  # this is the rehearsal
    path = Path(section.get("summary") or "results-rehearsal/rehearsal.json")
    command = "snakemake --profile lumi --configfile config/lumi.yaml config/lumi-rehearsal.yaml"
    failed = path.with_name(path.name + ".failed")
    try:
        summary = json.loads((path if path.is_file() else failed).read_text())
    except (OSError, ValueError):
        return f"rehearsal: none yet ({path}); rehearse on dev-g first (< 1 GPU-h): `{command}`"
    if not summary.get("passed"):
        return f"rehearsal: {path} did not pass ({'; '.join(summary.get('problems') or ['?'])}); rerun `{command}`"
    if stamp and not (summary.get("stamp") and same_code(summary["stamp"], stamp)):
        return f"rehearsal: {path} passed with another environment image ({summary.get('stamp')}); rerun `{command}`"
    return None


def stage_samples(model_set, stage_name: str, train_locations: int | None) -> int | None:
    """Samples per epoch of a stage's training (train/stages.py): its own samples_per_epoch, else
    data.samples_per_epoch, else one per training location (None while those are not counted)."""
    section = getattr(model_set, stage_name)
    samples = getattr(section.train, "samples_per_epoch", None) or model_set.data.samples_per_epoch or train_locations
    return None if samples is None else int(math.ceil(samples))


def minutes_of_epoch(samples: int, seconds_per_sample: float) -> float:
    """Minutes of an epoch of `samples` at a time per sample: how the rehearsal's measured time
    becomes the full run's epoch minutes, and how the bill moves an epoch time measured (or
    configured) at one samples per epoch to a run of another (vcloud.runtime.bill)."""
    return samples * seconds_per_sample / 60


def full_epoch_samples(model_config: Path, full_model_config: Path | None, train_locations: int) -> dict[str, int]:
    """Samples per epoch of each stage in the full run (stage_samples)."""
    from vcloud.config import load_model_config

    cfg = load_model_config(full_model_config or model_config)
    return {stage.name: stage_samples(cfg, stage.name, train_locations) for stage in STAGES}


def _passing_summary(config: dict) -> dict:
    """The passing rehearsal's summary the real run reads ({} for the rehearsal itself, or while
    none passed)."""
    section = config.get("rehearsal") or {}
    if section.get("enabled"):
        return {}
    path = Path(section.get("summary") or "results-rehearsal/rehearsal.json")
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) and summary.get("passed") else {}


def rehearsed_epoch_minutes(config: dict) -> dict[str, float]:
    """The full run's epoch minutes measured by a passing rehearsal (train rule -> minutes), for
    the retries and the bill until the real run measures its own; none for the rehearsal."""
    found = _passing_summary(config).get("epoch_minutes") or {}
    return {rule: float(m) for rule, m in found.items() if isinstance(m, (int, float)) and m > 0}


def rehearsed_epoch_samples(config: dict) -> tuple[dict[str, int], int | None]:
    """(train rule -> the samples per epoch its rehearsed epoch minutes are for, the training
    locations counted for them) of the passing rehearsal; ({}, None) where it does not say (a
    summary written before it did)."""
    summary = _passing_summary(config)
    found = summary.get("epoch_samples") or {}
    locations = summary.get("train_locations")
    samples = {rule: int(n) for rule, n in found.items() if isinstance(n, int) and n > 0}
    return samples, locations if isinstance(locations, int) and locations > 0 else None
