# Input functions and path helpers shared by every rules file (get_* / is_*).
from pathlib import Path

from vcloud.data.layout import discover_rois, parse_roi
from vcloud.data.splits import assign_splits

DATA = config["data"]
PATHS = config["paths"]
PREPARED = PATHS["prepared"]


wildcard_constraints:
    roi=r"ROIs\d{4}_\d+",
    split="train|val|test",


def is_synthetic():
    return config["synthetic"]["enabled"]


def get_raw_dir():
    return PATHS["synthetic_raw"] if is_synthetic() else DATA["raw_dir"]


def get_rois():
    """ROIs to prepare: the synthetic list, the configured list, or every ROI on disk."""
    if is_synthetic():
        return [parse_roi(text) for text in config["synthetic"]["rois"]]
    if DATA["rois"] != "all":
        return [parse_roi(text) for text in DATA["rois"]]
    raw = Path(DATA["raw_dir"])
    if not raw.is_dir():
        raise WorkflowError(f"data.raw_dir: {raw} is not a folder")
    found = discover_rois(raw)
    if not found:
        raise WorkflowError(f"data.raw_dir: no ROIsXXXX/<roi> folder under {raw}")
    return found


def get_split_rois(split):
    splits = assign_splits(
        get_rois(), test=DATA["splits"]["test"], val=DATA["splits"]["val"]
    )
    if not splits[split]:
        raise WorkflowError(
            f"data.splits: split '{split}' has no ROI among the ROIs to prepare"
        )
    return splits[split]


def get_prepared_roi(roi):
    return f"{PREPARED}/rois/{roi.slug}.zarr"


def get_split_store(split):
    return f"{PREPARED}/{split}.zarr"


def get_prepare_input(wildcards):
    """The synthetic tree (a rule output) or the ROI folder of the real dataset on disk."""
    if is_synthetic():
        return {"raw": rules.synth_raw.output.raw}
    roi = parse_roi(wildcards.roi)
    return {"raw": f"{DATA['raw_dir']}/{roi.rois}/{roi.roi}"}


def get_wind_table():
    if is_synthetic():
        return f"{PATHS['synthetic_raw']}/wind.csv"
    return DATA["wind_table"]


def get_final_outputs():
    return [get_split_store(split) for split in ("train", "val", "test")]


def get_resources(rule_name):
    return config["resources"][rule_name]
