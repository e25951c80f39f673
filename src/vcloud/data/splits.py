"""Train/val/test assignment of ROIs: the official lists from config, train = every other ROI; or,
with one location or a few (data.temporal_split, docs/data.md "Your own locations"), val and test
as date ranges of every location, separated from the training dates by a gap of days."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable

from vcloud.constants import SPLITS
from vcloud.data.layout import RoiId, parse_roi
from vcloud.data.store import DateRanges
from vcloud.errors import ConfigError

TEMPORAL_KEYS = ("val", "test", "gap_days", "train")
ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def assign_splits(rois: Iterable[RoiId], *, test: Iterable[str], val: Iterable[str]) -> dict[str, list[RoiId]]:
    """Split the ROIs found. A ROI is matched by ROIs folder AND roi number (numbers repeat)."""
    test_ids = {parse_roi(text) for text in test}
    val_ids = {parse_roi(text) for text in val}
    both = test_ids & val_ids
    if both:
        raise ValueError(f"data.splits: {', '.join(map(str, sorted(both)))} listed in both test and val")
    splits: dict[str, list[RoiId]] = {name: [] for name in SPLITS}
    for roi in sorted(set(rois)):
        name = "test" if roi in test_ids else "val" if roi in val_ids else "train"
        splits[name].append(roi)
    return splits


def temporal_ranges(spec, *, key: str = "data.temporal_split") -> dict[str, DateRanges]:
    """One location is enough: val and test as date ranges of every location, the training dates the
    rest (or the `train` range), each more than `gap_days` days away from val and test, so that no
    cloud (a front lasts days) and no context window is shared. spec: {val: [FIRST, LAST], test:
    [FIRST, LAST], gap_days: N, train: [FIRST, LAST] (optional: else every other date)}; dates ISO
    (strings or YAML dates), both ends included.

    Returns the DateRanges each split store keeps (data/store.py assemble); ConfigError in one line
    naming the key: not a mapping, an unknown key, val, test or gap_days missing, a range that is
    not two dates in order, a gap that is not a whole number >= 0, val and test overlapping or
    not more than the gap apart, a training range that reaches within the gap of either."""
    if not isinstance(spec, dict):
        raise ConfigError(f"{key}: {_shown(spec)} is not {{val: [FIRST, LAST], test: [FIRST, LAST], gap_days: N}}")
    unknown = sorted(set(map(str, spec)) - set(TEMPORAL_KEYS))
    if unknown:
        raise ConfigError(f"{key}.{unknown[0]}: not a key of a temporal split ({', '.join(TEMPORAL_KEYS)})")
    for name in ("val", "test", "gap_days"):
        if name not in spec:
            raise ConfigError(
                f"{key}.{name}: missing (a temporal split needs val and test date ranges and gap_days, the days "
                "kept free around them)"
            )
    gap = spec["gap_days"]
    if not isinstance(gap, int) or isinstance(gap, bool) or gap < 0:
        raise ConfigError(f"{key}.gap_days: {_shown(gap)} is not a whole number of days >= 0")
    held = {name: _span(spec, name, key) for name in ("val", "test")}
    (a_name, a), (b_name, b) = sorted(held.items(), key=lambda item: item[1])
    apart = (b[0] - a[1]).days  # days from the earlier range's last date to the later one's first
    if apart <= gap:
        what = "overlaps" if apart <= 0 else f"starts {apart} day{'s' * (apart != 1)} after"
        raise ConfigError(
            f"{key}.{b_name}: {b[0]}..{b[1]} {what} {a_name} {a[0]}..{a[1]}; keep them more than gap_days ({gap}) "
            "days apart"
        )
    margin = dt.timedelta(days=gap)
    shields = {name: (first - margin, last + margin) for name, (first, last) in held.items()}
    keep: tuple[tuple[str, str], ...] = ()
    if "train" in spec:
        train = _span(spec, "train", key)
        for name, (near_first, near_last) in shields.items():
            if train[0] <= near_last and near_first <= train[1]:
                first, last = held[name]
                raise ConfigError(
                    f"{key}.train: {train[0]}..{train[1]} reaches within gap_days ({gap}) of {name} {first}..{last} "
                    f"({near_first}..{near_last} is kept free)"
                )
        keep = (_iso(train),)
    return {
        "train": DateRanges(keep=keep, drop=tuple(_iso(shields[name]) for name in ("val", "test"))),
        **{name: DateRanges(keep=(_iso(held[name]),)) for name in ("val", "test")},
    }


def _span(spec: dict, name: str, key: str) -> tuple[dt.date, dt.date]:
    """spec[name] as (first, last): two dates in order, else one line naming the key."""
    value = spec[name]
    try:
        if isinstance(value, str | bytes) or len(value) != 2:
            raise ValueError
        first, last = (iso_date(v) for v in value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}.{name}: {_shown(value)} is not [FIRST, LAST], two dates YYYY-MM-DD") from None
    if first > last:
        raise ConfigError(f"{key}.{name}: {first} is after {last} (give [FIRST, LAST])")
    return first, last


def iso_date(value) -> dt.date:
    """A date as YYYY-MM-DD text (or a YAML date); ValueError otherwise (20180101 too, on any Python)."""
    if type(value) is dt.date:
        return value
    if not isinstance(value, str) or not ISO_DATE.match(value):
        raise ValueError(f"{value!r} is not a date YYYY-MM-DD")
    return dt.date.fromisoformat(value)


def _iso(span: tuple[dt.date, dt.date]) -> tuple[str, str]:
    return span[0].isoformat(), span[1].isoformat()


def _shown(value) -> str:
    """A config value as the user wrote it (YAML dates as YYYY-MM-DD)."""
    return json.dumps(value, default=str)


def split_date_flags(folder, split: str) -> str:
    """`vcloud assemble`'s --keep/--drop for a store of `split` (rules assemble_split and
    split_location), after a space: the split's dates under data.temporal_split; "" (every date,
    the command as without it) otherwise. folder: data.source folder's FolderLocations
    (data/locations.py), or None."""
    ranges = folder.temporal if folder is not None else None
    return "" if ranges is None else " " + ranges[split].flags()


def split_location_store(prepared: str, split: str, location: str) -> str:
    """One location's store of one split's dates (rule split_location; what predict reads under
    data.temporal_split): <prepared>/<split>/<location>.zarr."""
    return f"{prepared}/{split}/{location}.zarr"
