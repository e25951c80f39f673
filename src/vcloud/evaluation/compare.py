"""Stage against stage: what each stage adds over the one before it, on every protocol.

`vcloud compare-stages` reads the evaluation reports of the stages (results/eval/stage<n>.json,
each scored on the same samples of every protocol) and writes, per protocol and for the
natural-cloud protocols pooled ("natural": reference + uncrtaints), each stage's mean PSNR (and
its mean |error| on the pixels where the reconstructed date is seen, `seen_mae`) and the paired
difference of each stage with the stage before it (registry order, the stages that
remove clouds: those the viewer shows), with its paired standard error and the one clustered by
location. The README's quality table is pasted from its Markdown.
"""

from __future__ import annotations

import json
from pathlib import Path

from vcloud.errors import BadInputError
from vcloud.evaluation.stats import paired_difference
from vcloud.io import atomic_write_json, atomic_write_text

NATURAL = ("reference", "uncrtaints")  # the protocols with the raw tree's own clouds
METRIC = "psnr"


def _read(path: Path) -> dict:
    try:
        report = json.loads(Path(path).read_text())
        report["stage"], report["protocols"]  # noqa: B018 (the keys this reads)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise BadInputError(f"{path}: not an evaluation report ({type(err).__name__}: {err})") from None
    return report


def _samples(result: dict) -> tuple[list[float], list] | None:
    model = result.get("model")
    if not model:
        return None
    return model["per_sample"][METRIC], [
        f"{result.get('protocol', {}).get('protocol')}:{loc}" for loc in result["location"]
    ]


def compare_stages(reports: list[Path], *, stages: tuple[int, ...]) -> dict:
    """{"stages": [...], "protocols": {name: {"samples", "mean": {stage: PSNR}, "difference":
    {"<n> - <m>": paired_difference}}}} for the given reports; `stages`: which are compared with
    the one before them (in that order)."""
    by_stage = {}
    for path in reports:
        report = _read(path)
        by_stage[int(report["stage"])] = (path, report["protocols"])
    order = [n for n in stages if n in by_stage]
    names = sorted({name for _, protocols in by_stage.values() for name in protocols}, key=_protocol_order)
    out: dict = {"metric": METRIC, "stages": order, "protocols": {}}
    for name in [*names, "natural"]:
        parts = NATURAL if name == "natural" else (name,)
        values = {}
        for n in order:
            path, protocols = by_stage[n]
            got = [_samples(protocols[p]) for p in parts if p in protocols]
            got = [g for g in got if g is not None]
            if got:
                values[n] = ([v for g in got for v in g[0]], [loc for g in got for loc in g[1]])
        if not values:
            continue
        entry: dict = {
            "samples": len(next(iter(values.values()))[0]),
            "mean": {str(n): _mean(v[0]) for n, v in values.items()},
            "difference": {},
        }
        if name != "natural":  # the error where the reconstructed date is seen (scoring.score)
            entry["seen_mae"] = {str(n): by_stage[n][1][name].get("model", {}).get("seen_mae") for n in values}
        if name == "natural":
            entry["pooled"] = list(parts)
        for before, after in zip(order, order[1:]):
            if before not in values or after not in values:
                continue
            (a, loc_a), (b, loc_b) = values[after], values[before]
            if loc_a != loc_b:
                raise BadInputError(
                    f"protocol {name}: stages {before} and {after} were scored on different samples "
                    f"({by_stage[before][0]}, {by_stage[after][0]}); evaluate both on the same store"
                )
            entry["difference"][f"{after} - {before}"] = paired_difference(a, b, groups=loc_a)
        out["protocols"][name] = entry
    return out


def _mean(values: list[float]) -> float | None:
    return float(sum(values) / len(values)) if values else None


def _protocol_order(name: str) -> tuple[int, str]:
    known = ("fixed", "reference", "uncrtaints")
    return (known.index(name) if name in known else len(known), name)


def markdown(comparison: dict) -> str:
    """The comparison as a Markdown table: protocol, samples, each stage's PSNR, each step's
    difference ± paired SE (location-clustered SE in brackets)."""
    order = comparison["stages"]
    steps = [f"{b} - {a}" for a, b in zip(order, order[1:])]
    header = ["protocol", "samples", *[f"stage {n}" for n in order], *[f"stage {s}" for s in steps]]
    lines = ["| " + " | ".join(header) + " |", "| --- | " + " | ".join(["--:"] * (len(header) - 1)) + " |"]
    for name, entry in comparison["protocols"].items():
        label = f"{name} ({' + '.join(entry['pooled'])})" if "pooled" in entry else name
        means = [_fmt(entry["mean"].get(str(n))) for n in order]
        diffs = []
        for step in steps:
            d = entry["difference"].get(step)
            if d is None or d["difference"] is None:
                diffs.append("")
                continue
            se = "" if d["se"] is None else f" ± {d['se']:.2f}"
            cluster = "" if d.get("se_location") is None else f" ({d['se_location']:.2f})"
            diffs.append(f"{d['difference']:+.2f}{se}{cluster}")
        lines.append("| " + " | ".join([label, str(entry["samples"]), *means, *diffs]) + " |")
    seen = [(name, e["seen_mae"]) for name, e in comparison["protocols"].items() if e.get("seen_mae")]
    if seen:
        lines += [
            "",
            "Mean |error| (S2 0..1) where the reconstructed date is seen (cloud probability < 0.4):",
            "",
            "| protocol | " + " | ".join(f"stage {n}" for n in order) + " |",
            "| --- | " + " | ".join(["--:"] * len(order)) + " |",
        ]
        for name, values in seen:
            cells = ["" if values.get(str(n)) is None else f"{values[str(n)]:.5f}" for n in order]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def write_comparison(
    reports: list[Path], out: Path, *, stages: tuple[int, ...], markdown_out: Path | None = None
) -> dict:
    comparison = compare_stages(reports, stages=stages)
    atomic_write_json(out, comparison, indent=1)
    if markdown_out is not None:
        atomic_write_text(markdown_out, markdown(comparison))
    return comparison
