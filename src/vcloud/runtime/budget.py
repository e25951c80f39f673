"""The data budget: files and bytes a run will keep on each storage area, against its quota.

LUMI counts files as well as bytes (/scratch: 50 TB and 2,000,000 files per project; /projappl:
50 GB and 100,000 files; LUMI user guide, storage). SEN12MS-CR-TS extracted is 1-2 million TIFF
files, so a run that extracts it, or writes one file per image, stops with a quota error part-way
through. `vcloud doctor` and the workflow's start-up check on a cluster config compute, before
anything is submitted, what the run will hold:

- raw: the downloaded archives (counted as they are) or the files of an extracted tree;
- archive indexes (results/prepared/index/), exact when built, else estimated;
- prepared stores: FILES_PER_LOCATION files per location plus STORE_METADATA_FILES per store,
  at most the uncompressed pixels in bytes (compression only lowers it);
- checkpoints, evaluation, viewer and report files under paths.results;
- logs and benchmark files (three per job on SLURM: log, benchmark, SLURM output);

and assign each to the quota area (cluster.quotas) whose path holds it. Over a quota is an error
of one line naming the area and the numbers. The locations come from the archive indexes (exact),
or from the tree listing; archives without an index yet are estimated from their size (said so).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from vcloud.constants import S1_BANDS, S2_BANDS

# Files of a prepared store: one shard per image variable per location plus a fixed part per
# store (the store module's own figures, checked against a real store by its tests).
from vcloud.data.store import FILES_PER_LOCATION, STORE_METADATA_FILES
from vcloud.registry import STAGES

# Split stores hard-link the per-ROI shards (one inode, one copy of the pixels): metadata only.
SPLITS = ("train", "val", "test")
# Bytes per seek point of an archive index (a 32 KiB window) and per member (table entry).
INDEX_POINT_BYTES = 32 * 1024 + 32
INDEX_MEMBER_BYTES = 40
# Without an index the number of images in an archive is estimated from its size, assuming the
# gzip stream halves the TIFFs (more images, hence more locations: the estimate errs high).
ASSUMED_ARCHIVE_RATIO = 0.5
# A checkpoint holds the weights and Adam's two moments: 12 bytes per parameter (fp32).
CHECKPOINT_BYTES_PER_PARAM = 12
CHECKPOINT_FALLBACK_BYTES = 4 << 30  # per checkpoint file when torch cannot count parameters
RESULT_FILES_PER_STAGE = 4  # best.pt, latest.pt, metrics.jsonl, eval/stage<n>.json
VIEWER_FILES_PER_SAMPLE = 9  # one PNG per layer
LOG_FILES_PER_JOB = 3  # logs/<rule>/*.log, benchmarks/<rule>/*.tsv, logs/slurm/*
LOG_BYTES_PER_JOB = 1 << 20


@dataclass
class Item:
    what: str
    path: Path
    files: int
    bytes: int
    estimated: bool = False


@dataclass
class Budget:
    items: list[Item] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    locations: int = 0
    rois: int = 0


def image_bytes(patch_size: int) -> int:
    """Uncompressed bytes of one date of one location: S2 uint16, S1 float32, cloud_prob uint8."""
    pixels = patch_size * patch_size
    return pixels * (len(S2_BANDS) * 2 + len(S1_BANDS) * 4 + 1)


def location_bytes(patch_size: int, times: int) -> int:
    return times * (image_bytes(patch_size) + 64)  # + per-date metadata (dates, cover, masks)


# ----------------------------------------------------------------------------- raw data


def _raw_paths(config: dict) -> list[Path]:
    if config["synthetic"]["enabled"]:
        return [Path(config["paths"]["synthetic_raw"])]
    raw = config["data"]["raw"]
    return [Path(p) for p in ([raw] if isinstance(raw, str) else raw)]


def _wanted(config: dict, found):
    rois = config["data"]["rois"]
    if rois == "all":
        return set(found)
    from vcloud.data.layout import parse_roi

    return {parse_roi(text) for text in rois} & set(found)


def raw_budget(config: dict, budget: Budget) -> dict:
    """Raw items into `budget`; returns roi -> locations (estimated ones flagged in notes)."""
    from vcloud.data.archive import archives_under, classify, index_path, parse_archive_name, read_index, rois_in
    from vcloud.data.layout import discover_rois, parse_name

    data = config["data"]
    times, size = data["times"], data["patch_size"]
    index_dir = Path(config["paths"]["prepared"]) / "index"
    locations: dict = {}
    if config["synthetic"]["enabled"]:
        from vcloud.data.layout import parse_roi

        for text in config["synthetic"]["rois"]:
            locations[parse_roi(text)] = config["synthetic"]["patches"]
        n = sum(locations.values())
        budget.items.append(
            Item(
                "raw (synthetic)",
                _raw_paths(config)[0],
                2 * n * times + 20,
                n * times * image_bytes(size),
                estimated=True,
            )
        )
        return locations
    from vcloud.data.locations import folder_source

    if (folder := folder_source(config)) is not None:
        return _folder_budget(folder, size, budget)
    for raw in _raw_paths(config):
        if not raw.exists():
            budget.notes.append(f"data.raw: {raw} not found; its data are not counted")
            continue
        if classify(raw) == "tree":
            files, nbytes, per_roi = _tree_listing(raw, times=times)
            budget.items.append(Item("raw (extracted tree)", raw, files, nbytes, estimated=True))
            for roi in discover_rois(raw):
                locations[roi] = max(locations.get(roi, 0), per_roi.get(roi, 0))
            continue
        for archive in archives_under(raw):
            name = parse_archive_name(archive.name)
            size_on_disk = archive.stat().st_size
            budget.items.append(Item("raw archives", archive, 1, size_on_disk))
            found = None
            for folder in (index_dir, None):
                if index_path(archive, folder).exists():
                    found = read_index(archive, index_dir=folder, check=False, header_only=True)
                    break
            if found is not None:
                budget.items.append(Item("archive indexes", found.path, 1, found.path.stat().st_size))
                for roi_text, folders in found.rois.items():
                    patches = set()
                    for (_kind, _), members in folders.items():
                        for m in members:
                            try:
                                patches.add(parse_name(m.name.rsplit("/", 1)[-1]).patch)
                            except ValueError:
                                continue
                    from vcloud.data.layout import parse_roi

                    roi = parse_roi(roi_text)
                    locations[roi] = max(locations.get(roi, 0), len(patches))
                continue
            # No index yet: images ~ size / (ratio x image size), spread over the archive's ROIs.
            bands, width = (len(S2_BANDS), 2) if name.kind == "s2" else (len(S1_BANDS), 4)
            per_image = max(1, int(ASSUMED_ARCHIVE_RATIO * size * size * bands * width))
            images = size_on_disk // per_image
            rois = rois_in(name)
            per_roi = -(-images // (times * len(rois)))
            for roi in rois:
                locations[roi] = max(locations.get(roi, 0), per_roi)
            points = images * per_image * 2 // (4 << 20) + 1
            index_file = index_path(archive, index_dir)
            budget.items.append(
                Item(
                    "archive indexes",
                    index_file,
                    1,
                    points * INDEX_POINT_BYTES + images * INDEX_MEMBER_BYTES,
                    estimated=True,
                )
            )
            budget.notes.append(
                f"{archive.name}: no index yet, locations estimated from its size "
                f"(exact after `vcloud index --index-dir {index_dir} {archive}`)"
            )
    return locations


def _folder_budget(folder, size: int, budget: Budget) -> dict:
    """Your own locations (data.source: folder): their files as they are on disk, and each one's
    patches from its scenes' headers (the grid `vcloud prepare` cuts); roi -> patches."""
    from vcloud.data.folder import FolderSource
    from vcloud.errors import BadInputError

    files = nbytes = 0
    locations: dict = {}
    for location in folder.locations:
        found = [path for path in location.path.rglob("*") if path.is_file()]
        files += len(found)
        nbytes += sum(path.stat().st_size for path in found)
        try:
            locations[location.roi] = len(FolderSource(location.path, size=size).patches)
        except BadInputError as err:  # prepare refuses it too, in the same words
            budget.notes.append(f"data.locations: {location.name}: {err}; its patches are not counted")
    budget.items.append(Item("raw (your locations)", folder.root, files, nbytes))
    return locations


def _tree_listing(root: Path, *, times: int) -> tuple[int, int, dict]:
    """(files, bytes, roi -> locations) of an extracted tree: every time folder is listed (no
    stat per file: on Lustre that is the slow part); bytes from one folder's sizes per ROI."""
    from vcloud.data.layout import discover_rois, parse_name

    files = nbytes = 0
    per_roi = {}
    for roi in discover_rois(root):
        patches = set()
        for kind in ("S1", "S2"):
            sample_sizes = None
            for t in range(times):
                folder = root / roi.rois / str(roi.roi) / kind / str(t)
                try:
                    entries = list(os.scandir(folder))
                except OSError:
                    continue
                names = [e for e in entries if e.is_file()]
                files += len(names)
                if sample_sizes is None and names:
                    sample_sizes = sum(e.stat().st_size for e in names) / len(names)
                nbytes += int(len(names) * (sample_sizes or 0))
                for entry in names:
                    try:
                        patches.add(parse_name(entry.name).patch)
                    except ValueError:
                        continue
        per_roi[roi] = len(patches)
    return files, nbytes, per_roi


# ----------------------------------------------------------------------------- the run


def data_budget(config: dict, model_set=None) -> Budget:
    """Everything the run keeps on disk, per item (paths as configured)."""
    from vcloud.config.experiments import research_plan
    from vcloud.config.identities import research_jobs

    budget = Budget()
    data, paths = config["data"], config["paths"]
    found = raw_budget(config, budget)
    from vcloud.data.locations import folder_source

    folder = folder_source(config)
    own = config["synthetic"]["enabled"] or folder is not None  # every ROI found is wanted
    wanted = set(found) if own else _wanted(config, found)
    locations = sum(found[roi] for roi in wanted)
    budget.locations, budget.rois = locations, len(wanted)
    prepared = Path(paths["prepared"])
    times = data["times"] if folder is None else folder.times  # a folder's stores: its longest series
    per_location = location_bytes(data["patch_size"], times)
    budget.items.append(
        Item(
            "prepared stores (per ROI)",
            prepared / "rois",
            FILES_PER_LOCATION * locations + (STORE_METADATA_FILES + 1) * len(wanted),
            per_location * locations,
            estimated=True,
        )
    )
    budget.items.append(
        Item(
            "prepared stores (split views)",
            prepared,
            STORE_METADATA_FILES * len(SPLITS),
            len(SPLITS) << 20,
            estimated=True,
        )
    )
    results = Path(paths["results"])
    checkpoint = _checkpoint_bytes(model_set, budget)
    viewer = config.get("viewer", {}).get("samples", 12) * VIEWER_FILES_PER_SAMPLE + 3
    trained, what = {stage.name: 1 for stage in STAGES}, "checkpoints, metrics, evaluation"
    plan = research_plan(config)
    if plan is not None:  # experiments x seeds: each stage once per identity (vcloud.config.identities.research_jobs)
        fan_out = research_jobs(*plan)
        trained = {stage.name: fan_out[stage.train_rule][0] for stage in STAGES}
        what += f" ({sum(trained.values())} stage trainings for {len(plan[0])} runs, experiments x seeds)"
    budget.items.append(
        Item(
            what,
            results,
            sum(trained.values()) * RESULT_FILES_PER_STAGE,
            2 * sum(checkpoint[name] * count for name, count in trained.items()),
            estimated=True,
        )
    )
    budget.items.append(Item("viewer and report", results, viewer + 12, viewer << 16, estimated=True))
    archives = sum(1 for item in budget.items if item.what == "raw archives")
    data_jobs = len(wanted) + archives + len(SPLITS)
    jobs, logs = data_jobs + 4 + 4 + 5, "logs and benchmarks"
    if plan is not None:  # every run's trainings, evaluations, fixed protocols, wind cache, tables
        runs = len(plan[0])  # and model config (run_config), then compare and the accounting
        jobs = data_jobs + sum(count for count, _ in fan_out.values()) + runs + 2
        logs += f" ({jobs:,} jobs of {runs} runs)"
    budget.items.append(Item(logs, Path("logs"), LOG_FILES_PER_JOB * jobs, LOG_BYTES_PER_JOB * jobs, estimated=True))
    return budget


def _checkpoint_bytes(model_set, budget: Budget) -> dict[str, int]:
    """Bytes of one checkpoint file per stage (weights + Adam moments)."""
    if model_set is not None:
        try:
            from vcloud.models.memory import section_parameters

            # Each stage's checkpoint holds the model it trains (the registry's model_section):
            # stage 3 fine-tunes the stage-1 CFDT, not the refiner.
            sections = {stage.model_section for stage in STAGES}
            counts = {section: section_parameters(model_set, section) for section in sections}
            return {stage.name: CHECKPOINT_BYTES_PER_PARAM * counts[stage.model_section] for stage in STAGES}
        except ImportError:  # torch is not on a LUMI login node
            pass
    budget.notes.append(
        f"checkpoints: parameters not counted (no torch here); {CHECKPOINT_FALLBACK_BYTES >> 30} "
        "GiB per checkpoint assumed"
    )
    return {stage.name: CHECKPOINT_FALLBACK_BYTES for stage in STAGES}


# ----------------------------------------------------------------------------- quotas


def _area_of(path: Path, areas: dict[str, Path]) -> str | None:
    candidates = {Path(os.path.abspath(path)), Path(os.path.realpath(path))}
    for name, root in areas.items():
        for root_form in {Path(os.path.abspath(root)), Path(os.path.realpath(root))}:
            if any(c == root_form or root_form in c.parents for c in candidates):
                return name
    return None


def check_budget(config: dict, model_set, report) -> Budget | None:
    """The budget table into report.lines, one error per quota exceeded (doctor's Report)."""
    quotas = (config.get("cluster") or {}).get("quotas")
    if not quotas:
        return None
    account = config["cluster"].get("account", "")
    areas = {name: Path(str(q["path"]).format(account=account)) for name, q in quotas.items()}
    budget = data_budget(config, model_set)
    totals = {name: [0, 0] for name in quotas}
    report.lines.append(f"data budget ({budget.rois} ROIs, {budget.locations} locations; ~ marks estimates):")
    for item in budget.items:
        area = _area_of(item.path, areas)
        mark = "~" if item.estimated else " "
        report.lines.append(
            f"  {item.what:<34} {mark}{item.files:>11,} files {mark}{_size(item.bytes):>10}  {area or 'no quota area'}"
        )
        if area is not None:
            totals[area][0] += item.files
            totals[area][1] += item.bytes
    for name, (files, nbytes) in totals.items():
        quota = quotas[name]
        report.lines.append(
            f"  {name}: {files:,} of {int(quota['files']):,} files "
            f"({100 * files / quota['files']:.1f} %), {_size(nbytes)} of "
            f"{_size(quota['bytes'])} ({100 * nbytes / quota['bytes']:.1f} %)"
        )
        if files > quota["files"]:
            report.errors.append(
                f"cluster.quotas.{name}: the run keeps {files:,} files on {areas[name]}, more "
                f"than its quota of {int(quota['files']):,} files"
            )
        if nbytes > quota["bytes"]:
            report.errors.append(
                f"cluster.quotas.{name}: the run keeps {_size(nbytes)} on {areas[name]}, more "
                f"than its quota of {_size(quota['bytes'])}"
            )
    report.warnings.extend(f"data budget: {note}" for note in budget.notes)
    report.warnings.extend(download_fit(config, quotas, areas))
    return budget


# The dataset as downloaded (docs/data.md): 20 archives, about 1.2 TiB, read in place.
DATASET_ARCHIVES = 20
DATASET_BYTES = int(1.2 * 2**40)


def download_fit(config: dict, quotas: dict, areas: dict[str, Path]) -> list[str]:
    """Before the download (data.raw not there, every ROI wanted): whether the dataset's 1.2 TiB
    fit the quota area that will hold them; the budget cannot count what is not there yet."""
    if config["synthetic"]["enabled"] or config["data"]["rois"] != "all":
        return []
    found = []
    for raw in _raw_paths(config):
        if raw.exists():
            continue
        area = _area_of(raw, areas)
        if area is None:
            found.append(f"data budget: data.raw: {raw} is in no quota area of cluster.quotas; the dataset is ~1.2 TiB")
        elif quotas[area]["bytes"] < DATASET_BYTES:
            found.append(
                f"data budget: data.raw: the dataset as downloaded (~1.2 TiB, {DATASET_ARCHIVES} archives) is more than "
                f"the {_size(quotas[area]['bytes'])} quota of {area} ({areas[area]}) that would hold it: ask for more "
                "before downloading"
            )
    return found


def _size(nbytes: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(nbytes) < 1000 or unit == "PB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1000
    return f"{nbytes:.1f} PB"
