"""Paired statistics: how sure is "method A beats method B" on the same samples?

Two methods scored on the same samples differ by d_i = a_i - b_i per sample; the difference
of their means is mean(d), and its standard error is the paired one,

    se = std(d, ddof=1) / sqrt(n),

much smaller than the unpaired sqrt(se_a^2 + se_b^2) when both methods find the same samples
hard. Samples of one location (the fixed protocol scores every clear target once per cloud
kind) are not independent; `se_location` treats locations as the units (cluster-robust, CR1):

    e_i = d_i - mean(d),  S_g = sum of e_i over location g,  G locations,
    se_location = sqrt(G / (G - 1) * sum_g S_g^2) / n.

With one sample per location (the reference and uncrtaints protocols) S_g = e_i and
se_location = sqrt(n / (n - 1) * sum e_i^2) / n = se exactly.
A percentile bootstrap over locations (resampling whole locations) gives a confidence interval
when asked (`resamples` > 0); it is seeded, so a report is reproducible.

Across training seeds (`seeded_difference`, vcloud compare): two experiments trained under the
same S seeds and scored on the same samples differ by d_si = a_si - b_si (seed s of one against
seed s of the other). The difference is mean(d); its uncertainty has two levels, the seeds (how
much the difference moves when the models are trained again) and the samples (which locations the
test split holds):

    se_seed^2 = var_s(mean_i d_si) / S            (the per-seed differences' spread, ddof 1)
    se_location = se_location of the seed-averaged differences mean_s d_si (above)
    se^2 = se_seed^2 + se_location^2,

with a t interval whose degrees of freedom are Welch-Satterthwaite's for the two parts
(S - 1 and G - 1). The seed x location interaction enters both parts, so the interval is on the
wide side, never the narrow one. With one seed the seed level is absent (se = se_location, G - 1
degrees of freedom): one seed says nothing about training noise, and the table says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

HIGHER_IS_BETTER = {"psnr": True, "ssim": True, "sam": False, "mae": False, "rmse": False}


def paired_difference(
    a: Sequence[float],
    b: Sequence[float],
    *,
    groups: Sequence | None = None,
    resamples: int = 0,
    level: float = 0.95,
    seed: int = 0,
) -> dict:
    """Mean of a - b over the same samples with its paired standard error (None below 2 samples).

    groups: the location of each sample, for se_location and the bootstrap's resampling unit.
    """
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired values need equal 1-d shapes, got {a.shape} and {b.shape}")
    d = a - b
    n = len(d)
    out: dict = {"samples": n, "mean_a": _mean(a), "mean_b": _mean(b), "difference": _mean(d)}
    out["se"] = float(d.std(ddof=1) / math.sqrt(n)) if n >= 2 else None
    if groups is not None:
        labels = np.asarray(groups)
        if labels.shape != d.shape:
            raise ValueError(f"groups need one label per sample: {labels.shape} for {d.shape}")
        _, group = np.unique(labels, return_inverse=True)
        count = int(group.max()) + 1 if n else 0
        out["locations"] = count
        if count >= 2:
            sums = np.bincount(group, weights=d - d.mean(), minlength=count)
            out["se_location"] = float(math.sqrt(count / (count - 1) * np.sum(sums**2)) / n)
        else:
            out["se_location"] = None
    else:
        group = np.arange(n)
    if resamples > 0 and n >= 2:
        out["ci"] = bootstrap_ci(d, group, resamples=resamples, level=level, seed=seed)
        out["ci_level"] = level
    return out


def bootstrap_ci(d: np.ndarray, group: np.ndarray, *, resamples: int, level: float, seed: int) -> list[float]:
    """Percentile interval of the mean difference, resampling whole groups with replacement."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must lie in (0, 1), got {level}")
    count = int(group.max()) + 1
    sums = np.bincount(group, weights=d, minlength=count)
    sizes = np.bincount(group, minlength=count).astype(np.float64)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, count, size=(resamples, count))  # (R, G)
    means = sums[picks].sum(axis=1) / sizes[picks].sum(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return [float(low), float(high)]


def compare(result: dict, method: str, other: str, *, resamples: int = 0, seed: int = 0) -> dict:
    """Paired differences `method - other` per metric, overall and per cloud class.

    result: one protocol's output of the scorer (evaluate.score): `per_sample` values of every
    method on the same samples, `cloud_class` and `location` of each sample. A positive PSNR or
    SSIM difference, or a negative SAM, MAE or RMSE one, means `method` is better.
    """
    a, b = result[method]["per_sample"], result[other]["per_sample"]
    classes = np.asarray(result["cloud_class"])
    locations = result.get("location")
    locations = np.asarray(locations) if locations is not None else None
    out: dict = {"method": method, "other": other, "overall": {}, "by_class": {}}
    for metric in a:
        kw = {"resamples": resamples, "seed": seed}
        out["overall"][metric] = paired_difference(a[metric], b[metric], groups=locations, **kw)
        for name in dict.fromkeys(classes.tolist()):
            mask = classes == name
            groups = None if locations is None else locations[mask]
            sub = paired_difference(np.asarray(a[metric])[mask], np.asarray(b[metric])[mask], groups=groups, **kw)
            out["by_class"].setdefault(name, {})[metric] = sub
    return out


def paired_report(
    result: dict, *, method: str = "model", others: Sequence[str] | None = None, resamples: int = 0, seed: int = 0
) -> dict:
    """`method` against every other method of a scored protocol: {other: compare(...)}."""
    if others is None:
        others = [k for k, v in result.items() if isinstance(v, dict) and "per_sample" in v and k != method]
    return {other: compare(result, method, other, resamples=resamples, seed=seed) for other in others}


def seeded_difference(
    a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], *, groups: Sequence, level: float = 0.95
) -> dict:
    """Mean of a - b over seeds x samples, with the seed level and the location clustering.

    a, b: (S, n) values of two experiments, row s of both from training seed s, column i from the
    same sample; groups: the location of each sample (n). Returns the `paired_difference` keys of
    the seed-averaged values (samples, locations, se_location, ...) with `difference` over every
    seed, `seeds`, `per_seed` (each seed's mean difference), `se_seed` (None below 2 seeds), `se`
    (both levels), `df` and the t interval `ci` at `level` (None where se is unknown).
    """
    from scipy.stats import t as student_t

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 2 or a.shape[0] < 1:
        raise ValueError(f"seeded values need equal (seeds, samples) shapes, got {a.shape} and {b.shape}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must lie in (0, 1), got {level}")
    seeds = a.shape[0]
    out = paired_difference(a.mean(axis=0), b.mean(axis=0), groups=groups)
    per_seed = (a - b).mean(axis=1)
    out.update(seeds=seeds, per_seed=[float(v) for v in per_seed], difference=float(per_seed.mean()))
    out["se_seed"] = float(per_seed.std(ddof=1) / math.sqrt(seeds)) if seeds >= 2 else None
    loc, groups_n = out.get("se_location"), out.get("locations") or 0
    parts = [(v**2, dof) for v, dof in ((out["se_seed"], seeds - 1), (loc, groups_n - 1)) if v is not None]
    out.update(se=None, df=None, ci=None, ci_level=level)
    if not parts:
        return out
    variance = sum(v for v, _ in parts)
    out["se"] = math.sqrt(variance)
    if variance == 0.0:
        out["ci"] = [out["difference"], out["difference"]]
        return out
    out["df"] = variance**2 / sum(v**2 / dof for v, dof in parts)
    half = float(student_t.ppf(0.5 + level / 2.0, out["df"])) * out["se"]
    out["ci"] = [out["difference"] - half, out["difference"] + half]
    return out


def headline_difference(a: Sequence[float], b: Sequence[float], *, groups: Sequence, level: float = 0.95) -> dict:
    """a - b on the same samples as a report opens with it: the paired difference, its t interval at
    `level` from the location-clustered standard error (G - 1 degrees of freedom; the sample one,
    n - 1, when the samples come from one location), and the samples a wins (a > b)."""
    from scipy.stats import t as student_t

    out = paired_difference(a, b, groups=groups)
    se, dof = out.get("se_location"), (out.get("locations") or 0) - 1
    if se is None:
        se, dof = out["se"], out["samples"] - 1
    out["wins"] = int(np.sum(np.asarray(a, np.float64) > np.asarray(b, np.float64)))
    out.update(ci=None, ci_level=level, ci_se=se)
    if se is not None and dof >= 1:
        half = float(student_t.ppf(0.5 + level / 2.0, dof)) * se
        out["ci"] = [out["difference"] - half, out["difference"] + half]
    return out


def _mean(values: np.ndarray) -> float | None:
    return float(values.mean()) if len(values) else None
