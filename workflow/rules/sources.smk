# The raw data's input functions (get_* / is_*): where the raw inputs lie (the synthetic data,
# data.raw's downloaded archives or extracted tree, or your own locations with data.source:
# folder), the ROIs to prepare and their splits, and what synth_raw, index_archive, prepare_roi
# (data.smk) and era5_wind (wind.smk) read and are given.
from types import SimpleNamespace

from vcloud.data.archive import archive_for, classify, discover_raw_rois, index_file
from vcloud.data.layout import parse_roi
from vcloud.data.splits import assign_splits


def is_synthetic():
    return config["synthetic"]["enabled"]


def get_raw_paths():
    """Raw inputs: the synthetic folder, data.raw (a path or a list of paths), or data.folder."""
    if FOLDER:
        return [str(FOLDER.root)]
    if is_synthetic():
        return [PATHS["synthetic_raw"]]
    raw = DATA["raw"]
    return [raw] if isinstance(raw, str) else list(raw)


def is_archive_input():
    """The raw data are downloaded archives (read in place), not an extracted tree."""
    if FOLDER:
        return False
    if is_synthetic():
        return config["synthetic"]["archives"]
    return any(classify(Path(path)) != "tree" for path in get_raw_paths())


def get_index_dir():
    return f"{PREPARED}/index"


def get_synthetic_outputs():
    """synth_raw's outputs: the archives that hold the synthetic ROIs, or the tree folder."""
    root = PATHS["synthetic_raw"]
    if not config["synthetic"]["archives"]:
        return {"raw": directory(root)}
    rois = [parse_roi(text) for text in config["synthetic"]["rois"]]
    names = sorted(
        {archive_for(roi, kind).filename for roi in rois for kind in ("s1", "s2")}
    )
    files = {"archives": [f"{root}/{name}" for name in names]}
    files.update(wind=f"{root}/wind.csv", truth=f"{root}/truth.csv")
    return files


def find_archive(name):
    """The downloaded (or synthetic) archive of that name among the raw paths."""
    for raw in get_raw_paths():
        path = Path(raw)
        candidate = path if path.name == name else path / name
        if is_synthetic() or candidate.is_file():
            return str(candidate)
    raise WorkflowError(
        f"data.raw: no archive {name} under {', '.join(get_raw_paths())}"
    )


def get_synthetic_root(output):
    """The folder synth_raw writes: its directory output, or the folder of its archives."""
    return output.raw if "raw" in output.keys() else str(Path(output.wind).parent)


def get_archive(wildcards):
    return find_archive(wildcards.archive)


def get_rois():
    """ROIs to prepare: the synthetic list, the configured list, or every ROI of the raw data;
    or your own locations (data.source: folder)."""
    if FOLDER:
        return list(FOLDER.locations)
    if is_synthetic():
        return [parse_roi(text) for text in config["synthetic"]["rois"]]
    if DATA["rois"] != "all":
        return [parse_roi(text) for text in DATA["rois"]]
    found = discover_raw_rois([Path(p) for p in get_raw_paths()])
    if not found:
        raise WorkflowError(
            f"data.raw: no ROI in {', '.join(get_raw_paths())} (no SEN12MS-CR-TS archive, "
            "no ROIsXXXX/<roi> folder)"
        )
    return found


def get_split_rois(split):
    if FOLDER:
        return FOLDER.split(split)  # never empty: checked while parsing
    splits = assign_splits(
        get_rois(), test=DATA["splits"]["test"], val=DATA["splits"]["val"]
    )
    if not splits[split]:
        raise WorkflowError(
            f"data.splits: split '{split}' has no ROI among the ROIs to prepare"
        )
    return splits[split]


def get_prepared_roi(roi):
    return RUN.roi_store(roi.slug)


def get_prepare_input(wildcards):
    """The ROI's two archives and their indexes, or its folder of an extracted tree."""
    if FOLDER:
        return {"raw": str(FOLDER.get(wildcards.roi).path)}
    roi = parse_roi(wildcards.roi)
    if is_archive_input():
        names = [archive_for(roi, kind).filename for kind in ("s1", "s2")]
        archives = [find_archive(name) for name in names]
        return {
            "archives": archives,
            "indexes": [index_file(archive, get_index_dir()) for archive in archives],
        }
    if is_synthetic():
        return {"raw": rules.synth_raw.output.raw}
    for raw in get_raw_paths():
        folder = Path(raw) / roi.rois / str(roi.roi)
        if folder.is_dir():
            return {"raw": str(folder)}
    raise WorkflowError(
        f"data.raw: ROI {roi} not found under {', '.join(get_raw_paths())}"
    )


def get_raw_flags():
    return " ".join(f"--raw {shlex.quote(str(path))}" for path in get_raw_paths())


def get_prepare_raw_flags(wildcards):
    """prepare_roi's --raw: every raw path, or the one location's folder (data.source: folder)."""
    if FOLDER:
        return f"--raw {shlex.quote(str(FOLDER.get(wildcards.roi).path))}"
    return get_raw_flags()


def get_roi_id(wildcards):
    """prepare_roi's --roi: the ROI of the file name, or a location's (ROIs9000/<n>)."""
    if FOLDER:
        return str(FOLDER.get(wildcards.roi).roi)
    return str(parse_roi(wildcards.roi))


def get_times():
    """Dates per location in every store: data.times, or the longest of your own series."""
    return FOLDER.times if FOLDER else DATA["times"]


def get_wind_table():
    """The wind prepare_roi stores: the synthetic tree's wind.csv, data.wind_table, or None."""
    if is_synthetic():
        return f"{PATHS['synthetic_raw']}/wind.csv"
    return DATA["wind_table"]


def get_wind_input(wildcards):
    """prepare_roi's wind as an input, so that rule era5_wind runs first when it makes it.
    (The synthetic wind.csv comes inside the synth_raw folder, already an input.)"""
    table = None if is_synthetic() else DATA["wind_table"]
    return {"wind": table} if table else {}


def get_era5_rois():
    return [] if is_synthetic() else get_rois()


def get_era5_flags():
    """era5_wind's places: each of your own locations' folder and ROI (as prepare_roi's --raw and
    --roi), or the raw paths, their indexes and the ROIs."""
    if FOLDER:
        return " ".join(
            f"--location {shlex.quote(str(location.path))} {location.roi}"
            for location in FOLDER.locations
        )
    rois = " ".join(f"--roi {roi}" for roi in get_era5_rois())
    return f"{get_raw_flags()} --index-dir {get_index_dir()} {rois}"


def get_era5_input():
    """The raw inputs whose places and dates need wind (real data only): what prepare_roi reads,
    or your own locations' S2 GeoTIFFs (headers and names give places and dates)."""
    if FOLDER:
        return sorted(str(path) for loc in FOLDER.locations for path in loc.s2_files())
    files = []
    for roi in get_era5_rois():
        for value in get_prepare_input(SimpleNamespace(roi=roi.slug)).values():
            files.extend([value] if isinstance(value, str) else value)
    return sorted(set(files))
