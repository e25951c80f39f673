"""Stage against stage: what each stage adds over the one before it, on every protocol.

`vcloud compare-stages` reads the evaluation reports of the stages (results/eval/stage<n>.json,
each scored on the same samples of every protocol) and writes, per protocol and for the
natural-cloud protocols pooled ("natural": reference + uncrtaints), each stage's mean PSNR (and
its mean |error| on the pixels where the reconstructed date is seen, `seen_mae`) and the paired
difference of each stage with the stage before it (registry order, the stages that
remove clouds: those the viewer shows), with its paired standard error and the one clustered by
location. Per stage and protocol it also has the stage against the strongest simple answer (the
report's `strongest`: the baseline of the highest mean PSNR on those samples, with the paired
difference, its t interval and the samples the stage wins), and its Markdown opens with those
lines. The README's quality table is pasted from its Markdown.

Run against run (`vcloud compare`, research runs): the evaluation reports of every experiment x
seed; per experiment, stage and protocol the mean over seeds with each seed's value and their
standard deviation, and the difference from a baseline experiment, paired sample by sample and
seed by seed, with a confidence interval that has a seed level over the location clustering
(stats.seeded_difference). Every row also has the model against the strongest simple answer of its
own reports (`strongest`: the baseline of the highest seed-averaged mean PSNR, the seeded
difference from it with its interval, and the samples won), and the Markdown opens with one line
per experiment and stage saying whether the model beats it. Reports of before the series
baselines, or without `strongest`, compare all the same: the strongest of the baselines they have.
Runs scored on different samples are refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

from vcloud.errors import BadInputError
from vcloud.evaluation.stats import headline_difference, paired_difference, seeded_difference
from vcloud.io import atomic_write_json, atomic_write_text

NATURAL = ("reference", "uncrtaints")  # the protocols with the raw tree's own clouds
METRIC = "psnr"
STRONGEST = "Against the strongest simple answer"  # the title of the lines every report opens with


# --- the model against the strongest simple answer (scoring.strongest, read or recomputed) ----


def baselines_of(result: dict) -> list[str]:
    """The baselines one protocol's result scored beside the model, in the report's order: every
    method with per-sample PSNR but the model (a report of before the series baselines: its three)."""
    return [
        name
        for name, value in result.items()
        if name != "model" and isinstance(value, dict) and METRIC in (value.get("per_sample") or {})
    ]


def _mean_psnr(method: dict) -> float:
    mean = (method.get("mean") or {}).get(METRIC)
    return float(mean) if mean is not None else float(_mean(method["per_sample"][METRIC]))


def strongest_of(result: dict, *, level: float = 0.95) -> dict | None:
    """The model against the strongest baseline of one scored protocol: the report's own
    `strongest` (scoring.strongest), or, for a report written before it, the same computed from
    its per-sample values (the baseline of the highest mean PSNR, stats.headline_difference).
    None: no model values or no baseline."""
    if "strongest" in result:
        return result["strongest"]
    model = (result.get("model") or {}).get("per_sample", {}).get(METRIC)
    names = baselines_of(result)
    if not model or not names or "location" not in result:
        return None
    best = max(names, key=lambda name: _mean_psnr(result[name]))
    paired = headline_difference(model, result[best]["per_sample"][METRIC], groups=result["location"], level=level)
    return {"baseline": best, **paired}


def verdict(ci: list[float] | None) -> str:
    """Whether an interval of model - strongest says the model beats it, in words."""
    low, high = ci if ci else (None, None)
    if low is not None and low > 0:
        return "beats it"
    if high is not None and high < 0:
        return "loses to it"
    return "does not beat it (the interval holds zero)"


def headline(strongest: dict | None) -> str | None:
    """One line, scoring.headline's words for a `strongest` entry (None: there is none)."""
    if not strongest:
        return None
    low, high = strongest["ci"] if strongest.get("ci") else (None, None)
    interval = f"[{low:+.2f}, {high:+.2f}]" if low is not None else "[no interval: one location]"
    return (
        f"model - {strongest['baseline']} (the strongest simple answer): {strongest['difference']:+.2f} dB PSNR "
        f"{interval} at {strongest['ci_level']:.0%}, wins {strongest['wins']} of {strongest['samples']}: "
        f"the model {verdict(strongest.get('ci'))}"
    )


def fallbacks(result: dict) -> str | None:
    """The context policy's fallbacks of one protocol's samples, counted (data/series.py): 'context
    policy fallbacks: beyond_window 3, repeated 1 (of 57 samples)'; None where none was needed."""
    counts = (result.get("context") or {}).get("fallbacks") or {}
    if not any(counts.values()):
        return None
    text = ", ".join(f"{name} {count}" for name, count in counts.items() if count)
    return f"context policy fallbacks: {text} (of {result.get('samples', '?')} samples)"


def read_evaluation(path: Path) -> dict:
    """An evaluation report (results/eval/stage<n>.json); BadInputError in one line naming the file."""
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
    {"<n> - <m>": paired_difference}, "strongest": {stage: strongest_of}}}} for the given reports
    (no "strongest" for the pooled "natural"); `stages`: which are compared with the one before them
    (in that order)."""
    by_stage = {}
    for path in reports:
        report = read_evaluation(path)
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
            # each stage against the strongest baseline of its own report (natural: none, the
            # pooled protocols have different baselines)
            best = {str(n): strongest_of(by_stage[n][1][name]) for n in values}
            entry["strongest"] = {n: s for n, s in best.items() if s}
        if name == "natural":  # the protocols scored (uncrtaints is not on your own imagery)
            entry["pooled"] = [p for p in parts if any(_samples(by_stage[n][1].get(p, {})) for n in order)]
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


def stage_headlines(comparison: dict) -> list[str]:
    """compare_stages' lines of each stage against the strongest simple answer, per protocol."""
    lines = []
    for n in comparison["stages"]:
        for name, entry in comparison["protocols"].items():
            text = headline((entry.get("strongest") or {}).get(str(n)))
            if text:
                lines.append(f"stage {n}, {name}: {text}")
    return lines


def markdown(comparison: dict) -> str:
    """The comparison as Markdown: first each stage against the strongest simple answer (per
    protocol), then a table: protocol, samples, each stage's PSNR, each step's difference ± paired
    SE (location-clustered SE in brackets)."""
    order = comparison["stages"]
    steps = [f"{b} - {a}" for a, b in zip(order, order[1:])]
    header = ["protocol", "samples", *[f"stage {n}" for n in order], *[f"stage {s}" for s in steps]]
    opening = stage_headlines(comparison)
    lines = [f"{STRONGEST}:", "", *[f"- {line}" for line in opening], ""] if opening else []
    lines += ["| " + " | ".join(header) + " |", "| --- | " + " | ".join(["--:"] * (len(header) - 1)) + " |"]
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


# --- research runs: experiment against experiment, over seeds ---------------------------------


def _sample_key(result: dict) -> tuple:
    """What makes two scorings the same samples: the protocol's settings, each sample's location
    and cloud class, in order."""
    return (
        json.dumps(result.get("protocol"), sort_keys=True),
        tuple(result["location"]),
        tuple(result["cloud_class"]),
    )


def _pooled(protocols: dict, name: str) -> tuple[list[float], list, tuple] | None:
    """A protocol's (or the pooled natural protocols') model values, locations and sample key."""
    parts = NATURAL if name == "natural" else (name,)
    found = [(protocols[p], _samples(protocols[p])) for p in parts if p in protocols]
    found = [(result, got) for result, got in found if got is not None]
    if not found:
        return None
    values = [v for _, got in found for v in got[0]]
    locations = [loc for _, got in found for loc in got[1]]
    return values, locations, tuple(_sample_key(result) for result, _ in found)


def compare_runs(
    reports: list[tuple[str, int | None, Path]],
    *,
    baseline: str,
    val_reports: list[tuple[str, int | None, Path]] = (),
    level: float = 0.95,
) -> dict:
    """Every experiment against `baseline`, per stage and protocol (and "natural", pooled), on the
    val split where its reports are given (the split designs are chosen on) and on test.

    reports, val_reports: (experiment, seed, evaluation report) of every run and stage on test and
    on val. Returns {"metric", "baseline", "experiments", "seeds", "decided_on": "val" (or "test"
    without val reports), "rows": [{split, experiment, stage, protocol, samples, per_seed: {seed:
    mean}, mean, std, difference: seeded_difference against the baseline (None for the
    baseline), shared_with_baseline: every seed's report is the baseline's own file, strongest:
    the model against the strongest baseline of its own reports over seeds (_seeded_strongest;
    None for "natural" and for reports without baselines)}]}. Refused
    (BadInputError, one line): a baseline without reports, two runs of one split, stage and
    protocol scored on different samples, an experiment whose seeds are not the baseline's.
    """
    out: dict = {"metric": METRIC, "baseline": baseline, "decided_on": "val" if val_reports else "test", "rows": []}
    for split, given in (("val", val_reports), ("test", reports)):
        if not given:
            continue
        runs: dict[tuple[str, int], dict] = {}  # (experiment, stage) -> {seed: (path, protocols)}
        experiments: list[str] = []
        for experiment, seed, path in given:
            report = read_evaluation(path)
            experiments += [] if experiment in experiments else [experiment]
            runs.setdefault((experiment, int(report["stage"])), {})[seed] = (Path(path), report["protocols"])
        if baseline not in experiments:
            raise BadInputError(
                f"--baseline: {baseline!r} has no {split} report (experiments: {', '.join(experiments)})"
            )
        out["experiments"] = experiments
        out["seeds"] = sorted({s for by_seed in runs.values() for s in by_seed}, key=lambda s: -1 if s is None else s)
        for stage in sorted({stage for _, stage in runs}):
            names = sorted(
                {n for e in experiments for _, protocols in runs.get((e, stage), {}).values() for n in protocols},
                key=_protocol_order,
            )
            for name in [*names, "natural"]:
                values = _stage_values(runs, experiments, stage, name)
                base = values.get(baseline)
                for experiment, by_seed in values.items():
                    row = _row(experiment, stage, name, by_seed, base, baseline, level)
                    out["rows"].append({"split": split, **row})
    return out


def _stage_values(runs: dict, experiments: list[str], stage: int, name: str) -> dict:
    """{experiment: {seed: (values, locations, path, the protocol's result or None for "natural")}}
    of one stage and protocol, every run checked to be scored on the first run's samples."""
    values: dict = {}
    first = None
    for experiment in experiments:
        for seed, (path, protocols) in sorted(runs.get((experiment, stage), {}).items(), key=lambda kv: str(kv[0])):
            got = _pooled(protocols, name)
            if got is None:
                continue
            if first is None:
                first = (path, got[2])
            elif got[2] != first[1]:
                raise BadInputError(
                    f"protocol {name}, stage {stage}: {first[0]} and {path} were scored on different samples; "
                    "compare runs evaluated on the same store with the same protocol settings"
                )
            # the protocol's result too (its baselines); the pooled protocols' have different ones
            result = protocols[name] if name != "natural" else None
            values.setdefault(experiment, {})[seed] = (got[0], got[1], path, result)
    return values


def _row(experiment, stage, name, by_seed, base, baseline, level) -> dict:
    import numpy as np

    means = {seed: _mean(v) for seed, (v, *_) in by_seed.items()}
    spread = np.std(list(means.values()), ddof=1) if len(means) >= 2 else None
    row = {
        "experiment": experiment,
        "stage": stage,
        "protocol": name,
        "samples": len(next(iter(by_seed.values()))[0]),
        "per_seed": {str(seed): mean for seed, mean in means.items()},
        "mean": _mean(list(means.values())),
        "std": None if spread is None else float(spread),
        "difference": None,
        "strongest": _seeded_strongest(by_seed, level),
    }
    if experiment == baseline or base is None:
        return row
    if set(by_seed) != set(base):
        raise BadInputError(
            f"experiment {experiment}, stage {stage}: seeds {sorted(map(str, by_seed))} are not the baseline's "
            f"({sorted(map(str, base))}); pairs need the same seeds"
        )
    order = sorted(by_seed, key=str)
    a = [by_seed[seed][0] for seed in order]
    b = [base[seed][0] for seed in order]
    row["difference"] = seeded_difference(a, b, groups=by_seed[order[0]][1], level=level)
    # Every seed's report is the baseline's own file: the same trained stage, shared, not a result.
    row["shared_with_baseline"] = all(by_seed[seed][2] == base[seed][2] for seed in order)
    return row


def _seeded_strongest(by_seed: dict, level: float) -> dict | None:
    """One experiment's model against the strongest simple answer of its own reports, over seeds:
    the baseline every seed's report has with the highest seed-averaged mean PSNR (chosen after the
    fact: the hardest comparison), stats.seeded_difference of the model's per-sample PSNR against
    it (seed by seed, location-clustered), `wins` (the samples where the model's seed-averaged PSNR
    is above the baseline's) and `baseline_mean`, `candidates` (the baselines it was chosen from).
    None for the pooled protocols (no common set of baselines) or reports without baselines."""
    import numpy as np

    order = sorted(by_seed, key=str)
    results = [by_seed[seed][3] for seed in order]
    if any(result is None for result in results):
        return None
    names = [name for name in baselines_of(results[0]) if all(name in baselines_of(r) for r in results[1:])]
    if not names:
        return None
    means = {name: float(np.mean([_mean_psnr(result[name]) for result in results])) for name in names}
    best = max(names, key=lambda name: means[name])
    a = np.asarray([by_seed[seed][0] for seed in order], np.float64)
    b = np.asarray([result[best]["per_sample"][METRIC] for result in results], np.float64)
    difference = seeded_difference(a, b, groups=by_seed[order[0]][1], level=level)
    wins = int(np.sum(a.mean(axis=0) > b.mean(axis=0)))
    return {"baseline": best, "baseline_mean": means[best], "candidates": names, **difference, "wins": wins}


def runs_headlines(comparison: dict, *, split: str = "test", stages: tuple[int, ...] | None = None) -> list[dict]:
    """One line per experiment and stage of `split` (the one that reports): for every protocol the
    model against the strongest simple answer over seeds and whether it beats it. [{"experiment",
    "stage", "text"}]; `stages`: only these (None: every one)."""
    lines = []
    rows = [r for r in comparison["rows"] if r["split"] == split and r.get("strongest")]
    experiments = list(dict.fromkeys(r["experiment"] for r in rows))
    for experiment in experiments:
        for stage in sorted({r["stage"] for r in rows if r["experiment"] == experiment}):
            if stages is not None and stage not in stages:
                continue
            mine = sorted(
                (r for r in rows if r["experiment"] == experiment and r["stage"] == stage),
                key=lambda r: _protocol_order(r["protocol"]),
            )
            parts = [f"{r['protocol']}: {_strongest_clause(r['strongest'])}" for r in mine]
            seeds = mine[0]["strongest"]["seeds"]
            over = "one seed" if seeds == 1 else f"{seeds} seeds"
            text = f"{experiment}, stage {stage} ({split}, {over}): " + "; ".join(parts)
            lines.append({"experiment": experiment, "stage": stage, "text": text})
    return lines


def _strongest_clause(s: dict) -> str:
    """'model - series_clear_median +0.50 dB PSNR [-0.20, +1.20] at 95%, wins 3 of 4: does not beat it'."""
    ci = "" if s["ci"] is None else f" [{s['ci'][0]:+.2f}, {s['ci'][1]:+.2f}] at {s['ci_level']:.0%}"
    return (
        f"model - {s['baseline']} {s['difference']:+.2f} dB PSNR{ci}, wins {s['wins']} of {s['samples']}: "
        f"the model {verdict(s['ci'])}"
    )


def _strongest_cell(row: dict) -> str:
    s = row.get("strongest")
    if not s:
        return ""
    ci = "" if s["ci"] is None else f" [{s['ci'][0]:+.2f}, {s['ci'][1]:+.2f}]"
    one = "" if s.get("se_seed") is not None else " (one seed)"
    return f"{s['baseline']}: {s['difference']:+.2f}{ci}{one}, wins {s['wins']} of {s['samples']}"


def runs_markdown(comparison: dict) -> str:
    """The comparison of runs as Markdown: first one line per experiment and stage of the model
    against the strongest simple answer (runs_headlines), then one table per stage, a row per
    protocol and experiment with each seed's PSNR, the mean ± std over seeds, the paired difference
    from the baseline with its interval and, where the reports have baselines, the difference from
    the strongest of them."""
    layout = runs_tables(comparison)
    header = layout["header"]
    opening = [f"- {line['text']}" for line in layout["headlines"]]
    lines = [f"{STRONGEST} (the test split, over seeds):", "", *opening, ""] if opening else []
    lines += [layout["notes"][0], "", layout["notes"][1]]
    for table in layout["tables"]:
        lines += ["", f"### Stage {table['stage']}", "", "| " + " | ".join(header) + " |"]
        lines.append("| --- | --- | --- | " + " | ".join(["--:"] * (len(header) - 3)) + " |")
        lines += ["| " + " | ".join(row["cells"]) + " |" for row in table["rows"]]
    return "\n".join(lines) + "\n"


def runs_tables(comparison: dict, *, markup: bool = True) -> dict:
    """The comparison of runs laid out once for every reader of it (results/compare.md, the
    viewer's "Experiments compared"): {"notes": [what the numbers are, which split decides],
    "header": [...], "tables": [{"stage", "rows": [{"split", "experiment", "cells": [...]}]}],
    "headlines": runs_headlines(comparison)}, every cell formatted. `markup`: the notes' names in
    Markdown code and bold (else plain text).
    """
    code, strong = (lambda s: f"`{s}`", lambda s: f"**{s}**") if markup else (str, str)
    seeds = [str(s) for s in comparison["seeds"]]
    baseline = comparison["baseline"]
    level = next((r["difference"]["ci_level"] for r in comparison["rows"] if r["difference"]), 0.95)
    decided = comparison["decided_on"]
    notes = [
        f"Mean {comparison['metric'].upper()} (dB) per run; difference from {code(baseline)}, "
        f"paired by sample and seed, with its {level:.0%} interval (seed level and location clustering).",
        f"Designs are chosen on the {strong(decided)} split (rows {code(decided)})"
        + ("; the test rows report what was chosen, nothing is chosen on them." if decided == "val" else "."),
    ]
    columns = [f"seed {s}" if s != "None" else "value" for s in seeds]
    header = ["protocol", "split", "experiment", "samples", *columns, "mean ± std", "difference [CI]"]
    # Reports without baselines (none has a strongest) keep the table they had.
    strongest = any(r.get("strongest") for r in comparison["rows"])
    if strongest:
        header.append("strongest simple answer: model - it [CI], wins")
    tables = []
    for stage in sorted({r["stage"] for r in comparison["rows"]}):
        rows = sorted(
            (r for r in comparison["rows"] if r["stage"] == stage),
            key=lambda r: (_protocol_order(r["protocol"]), r["split"] != "val"),
        )
        laid = []
        for r in rows:
            std = "" if r["std"] is None else f" ± {r['std']:.2f}"
            cells = [r["protocol"], r["split"], r["experiment"], str(r["samples"])]
            cells += [_fmt(r["per_seed"].get(s)) for s in seeds]
            cells += [f"{_fmt(r['mean'])}{std}", _difference(r, baseline)]
            cells += [_strongest_cell(r)] if strongest else []
            laid.append({"split": r["split"], "experiment": r["experiment"], "cells": cells})
        tables.append({"stage": stage, "rows": laid})
    return {"notes": notes, "header": header, "tables": tables, "headlines": runs_headlines(comparison)}


def read_run_comparison(path: Path) -> dict:
    """vcloud compare's JSON (results/compare.json), checked by laying it out (runs_tables):
    BadInputError in one line naming the file when it is not one."""
    try:
        comparison = json.loads(Path(path).read_text())
        if not isinstance(comparison, dict):
            raise TypeError(f"a JSON {type(comparison).__name__}, not an object")
        missing = [key for key in ("metric", "baseline", "decided_on", "seeds", "rows") if key not in comparison]
        if missing:
            raise ValueError(f"it lacks {', '.join(missing)}")
        if not comparison["rows"]:
            raise ValueError("its rows are empty")
        runs_tables(comparison)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as err:
        raise BadInputError(
            f"{path}: not a comparison of runs from vcloud compare ({type(err).__name__}: {err})"
        ) from None
    return comparison


def _difference(row: dict, baseline: str) -> str:
    d = row["difference"]
    if d is None:
        return "baseline" if row["experiment"] == baseline else ""
    if row.get("shared_with_baseline"):
        return f"same stage as {baseline}"
    ci = "" if d["ci"] is None else f" [{d['ci'][0]:+.2f}, {d['ci'][1]:+.2f}]"
    return f"{d['difference']:+.2f}{ci}" + ("" if d["se_seed"] is not None else " (one seed)")


def write_run_comparison(
    reports: list[tuple[str, int | None, Path]],
    out: Path,
    *,
    baseline: str,
    val_reports: list[tuple[str, int | None, Path]] = (),
    markdown_out: Path | None = None,
) -> dict:
    comparison = compare_runs(reports, baseline=baseline, val_reports=val_reports)
    if markdown_out is not None:
        text = runs_markdown(comparison)
    atomic_write_json(out, comparison, indent=1)
    if markdown_out is not None:
        atomic_write_text(markdown_out, text)
    return comparison
