"""Train/val/test assignment of ROIs: the official lists from config, train = every other ROI."""

from __future__ import annotations

from collections.abc import Iterable

from vcloud.constants import SPLITS
from vcloud.data.layout import RoiId, parse_roi


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
