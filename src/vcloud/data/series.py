"""A location's series around one date: which other dates a sample takes (the context policy),
and the simple answers a user computes from the series by hand (the series composites).

Context policy (`data.context` of the model config; one setting for training, the protocols
that are ours and `vcloud predict`):

- nearest: the usable dates nearest in days to the target (equal distances: the earlier date).
- clearest: the usable dates within +-window_days of the target, least cloud first (cover in
  steps of COVER_STEP, so that 1 % more cloud does not outrank a date a month nearer), nearer
  first among equals. Too few within the window: the nearest dates beyond it fill the rest
  (fallback "beyond_window").
- random: drawn from every usable date of the series, without regard to time or cloud (how
  SEN12MS-CR-TS models were trained before the policy existed; training only).

A location with fewer usable other dates than the model takes repeats dates (fallback
"repeated"); one with none repeats the target itself ("target_only"). Every sample records its
dates and its fallback, and the evaluation counts the fallbacks (docs/evaluation.md).

Series composites: for a target date, from every usable date of the series but the target
(the target is hidden: it is what is scored), per pixel:

- nearest_clear_date: the whole image of the clear date (cover <= clear_max_cover) nearest in
  days; none clear: the least cloudy date.
- clear_median: the median of the pixel's clear values within +-window_days; where the pixel is
  clear on no date of the window, the nearest clear value (below).
- nearest_clear_value: the value of the nearest date on which the pixel is clear (gap filling);
  clear nowhere: the least cloudy date's value.
- least_cloudy: the whole image of the least cloudy date within +-window_days (the whole series
  when the window holds none).
- mosaic: the mean of the pixel's clear values over the context dates the model sees (AllClear's
  mosaicing of its inputs); clear on none of them: the least cloudy context date's value.

- clear_median_kept: clear_median where the target is not seen (its cloud probability at or above
  the threshold), the target as seen elsewhere: a user who masks the clouds and fills them.

The others are the whole image, the target hidden whole (../shared/GAPFILL.md's protocol): a thin
cloud under the threshold is not kept then. Which is stronger depends on the clouds; the
evaluation takes the strongest of all of them (evaluation/scoring.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

POLICIES = ("nearest", "clearest", "random")
FALLBACKS = ("beyond_window", "repeated", "target_only")
COVER_STEP = 0.05  # clearest: covers within one step count as equal; the nearer date wins
COMPOSITES = (
    "nearest_clear_date",
    "clear_median",
    "nearest_clear_value",
    "least_cloudy",
    "mosaic",
    "clear_median_kept",
)


@dataclass(frozen=True)
class Context:
    """The dates of one sample, in time order, the target's slot, and why (None: the policy held)."""

    dates: tuple[int, ...]
    slot: int
    fallback: str | None = None


def choose_context(
    days: np.ndarray,
    cover: np.ndarray,
    usable: np.ndarray,
    target: int,
    count: int,
    *,
    policy: str,
    window_days: int,
    rng: np.random.Generator | None = None,
) -> Context:
    """`count` dates including `target`, chosen by `policy` (module docstring).

    days (T,) int day numbers; cover (T,) cloud cover 0..1 (NaN: as cloudy as can be); usable (T,)
    bool; the target need not be usable (an unlabelled or predicted date)."""
    if policy not in POLICIES:
        raise ValueError(f"data.context.policy: {policy!r} is not one of {', '.join(POLICIES)}")
    if window_days < 1:
        raise ValueError(f"data.context.window_days: {window_days} must be at least 1")
    others = np.flatnonzero(np.asarray(usable, dtype=bool))
    others = others[others != target]
    need = count - 1
    fallback = None
    if need == 0:
        chosen: list[int] = []
    elif len(others) == 0:
        chosen, fallback = [target] * need, "target_only"
    elif policy == "random":
        if rng is None:
            raise ValueError("data.context.policy random needs a generator (training's sample seed)")
        replace = len(others) < need
        chosen = rng.choice(others, size=need, replace=replace).tolist()
        fallback = "repeated" if replace else None
    else:
        distance = np.abs(days[others].astype(np.int64) - int(days[target]))
        by_time = others[np.lexsort((others, distance))]
        if policy == "nearest":
            chosen = by_time[:need].tolist()
        else:
            inside = distance <= window_days
            steps = np.floor(np.nan_to_num(cover[others], nan=1.0) / COVER_STEP)
            ranked = others[inside][np.lexsort((others[inside], distance[inside], steps[inside]))]
            chosen = ranked[:need].tolist()
            if len(chosen) < need:
                beyond = [int(o) for o in by_time if o not in set(chosen)]
                chosen += beyond[: need - len(chosen)]
                fallback = "beyond_window"
        if len(chosen) < need:  # fewer usable dates than the model takes: repeated, nearest first
            chosen = (chosen * need)[:need]
            fallback = "repeated"
    dates = sorted([target, *(int(c) for c in chosen)])
    return Context(tuple(dates), dates.index(target), fallback)


def composites(
    s2: np.ndarray,
    clear: np.ndarray,
    days: np.ndarray,
    target_day: int,
    *,
    target: np.ndarray,
    target_seen: np.ndarray,
    context: np.ndarray,
    window_days: int,
    clear_max_cover: float,
) -> dict[str, np.ndarray]:
    """Every series composite for one target (module docstring), each (C, H, W) float32.

    s2 (N, C, H, W) float 0..1: every usable date of the series but the target; clear (N, H, W)
    bool: where each is clear; days (N,) their day numbers; target (C, H, W): the target as the
    model sees it (clouded); target_seen (H, W) bool: its pixels seen clear (clear_median_kept keeps them); context (N,)
    bool: the dates among the model's context (mosaic)."""
    if len(s2) == 0:  # nothing to fill from: the target as seen is every answer
        return {name: target.astype(np.float32) for name in COMPOSITES}
    s2 = s2.astype(np.float32, copy=False)
    distance = np.abs(days.astype(np.int64) - int(target_day))
    cover = 1.0 - clear.mean(axis=(1, 2))
    least = int(np.argmin(cover))
    by_time = np.lexsort((np.arange(len(days)), distance))

    gap_fill = s2[least].copy()
    filled = np.zeros(clear.shape[1:], dtype=bool)
    for n in by_time[::-1]:  # nearest last: it wins
        gap_fill[:, clear[n]] = s2[n][:, clear[n]]
        filled |= clear[n]

    candidates = np.flatnonzero(cover <= clear_max_cover)
    nearest = candidates[np.argmin(distance[candidates])] if len(candidates) else least

    window = distance <= window_days
    in_window = np.flatnonzero(window)
    median = gap_fill.copy()
    if len(in_window):
        values = np.where(clear[in_window][:, None], s2[in_window], np.nan)
        any_clear = clear[in_window].any(axis=0)
        with np.errstate(all="ignore"):
            median[:, any_clear] = np.nanmedian(values[:, :, any_clear], axis=0)
    window_least = in_window[np.argmin(cover[in_window])] if len(in_window) else least

    seen_by = np.flatnonzero(context)
    if len(seen_by):
        weights = clear[seen_by].astype(np.float32)  # (K, H, W)
        total = weights.sum(axis=0)
        mosaic = s2[seen_by[np.argmin(cover[seen_by])]].copy()
        mean = (s2[seen_by] * weights[:, None]).sum(axis=0) / np.maximum(total, 1.0)
        mosaic[:, total > 0] = mean[:, total > 0]
    else:
        mosaic = s2[least].copy()

    answers = {
        "nearest_clear_date": s2[nearest],
        "clear_median": median,
        "nearest_clear_value": gap_fill,
        "least_cloudy": s2[window_least],
        "mosaic": mosaic,
        "clear_median_kept": np.where(np.asarray(target_seen, dtype=bool)[None], target, median),
    }
    return {name: image.astype(np.float32) for name, image in answers.items()}
