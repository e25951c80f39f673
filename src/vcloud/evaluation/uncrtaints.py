"""Protocol `uncrtaints`: the published evaluation samples of SEN12MS-CR-TS, on a prepared store.

The reference loader (UnCRtainTS data/dataLoader.py, `SEN12MSCRTS(sampler="fixed",
n_input_samples=T, min_cov, max_cov, cloud_masks="s2cloudless_mask")`) makes one sample per
location (patch) from its s2cloudless cloud coverage per date (the mean of the binary mask):
- target: the least cloudy date, `np.argsort(coverage)[0]`. Equal minima are common (many dates
  of a location are fully clear), and which of them comes first is up to numpy's unstable
  quicksort: numpy <= 1.24 (the reference pins 1.18.5 / 1.21.6) runs an introsort whose pick
  we reproduce exactly (`reference_argsort`), where numpy >= 2 on x86 sorts with SIMD
  (x86-simd-sort) and picks differently. Checked against numpy 1.24.4's argsort on 200,000
  random series of 1-40 dates: the same full order every time. On 150,000 30-date series with
  about 30 % fully clear dates, the earliest minimum (np.argmin) and numpy 2.4's argsort each
  pick another target than numpy 1.24 in 57 % of them; the pairing files hold coverage, not
  targets, so this choice is made at load time by whatever numpy runs;
- inputs: the first T dates, in time order, whose coverage lies in [min_cov, max_cov]; with the
  default [0, 1] simply dates 0..T-1, so the target may be one of them. Only when fewer than T
  qualify: the first T dates other than the target.
- match (the reference's "coverage bin"): False when fewer than T dates qualified or the
  target's coverage is above 1e-3. Reported, not filtered on (the reference scores every sample).

The protocol is SEN12MS-CR-TS's: a store of your own imagery (a plain folder, data/folder.py) has
no sample of it (said in one line; `vcloud evaluate` reports it as not run, validation leaves it
out), whatever its series and mask.

Coverage comes from the store's `cloud_cover` (the same s2cloudless mask and post-processing),
or from the dataset authors' released pairing file for the test split,
`generic_{T}_test_all_s2cloudless_mask.npy` (the reference's `--import_data_path`).

That file is `np.save` of a pickled dict, written by the reference's
util/pre_compute_data_samples.py with sample_type "generic" (FIELD-FACTS.md names the file and
says "pickled dict" but not its fields; the fields below are what that script writes, and what
the reference loader reads back: `[c.item() for c in pairs[pdx]["coverage"]]`):

    {pdx: {"coverage": [c_0, ..., c_29],          # one-element torch tensors (DataLoader-collated)
           "paths": {"S1": ["<root>/ROIs1868/119/S1/0/s1_ROIs1868_119_ImgNo_0_<date>_patch_42.tif", ...],
                     "S2": [... one path per date ...]}}}

pdx is the sample's position in the reference's file listing; we do not rely on that order and
name every entry's location by its file names instead (so a region subset of the "all" file
stays aligned, where the reference would misalign). The file is read with a restricted
unpickler (numpy arrays and scalars, and torch tensors through torch's own weights-only
loader): nothing else can be constructed, let alone run. `convert_pairs` writes the same content
as checked JSON (`read_pairs` reads both).

Region subsets as the reference: `all` (every location of the store) or one of africa,
america, asiaEast, asiaWest, europa (locations whose ROI is one of that region's dataset ROIs,
any split; layout.REGION_SPLITS). Deviations from the reference, both on purpose: a date whose
S2 image the store marks unusable (missing or unreadable) counts as coverage 1 (the reference's
blank-image mask), and a location whose selected target or input date is unusable (no valid S2)
is skipped and listed in `skipped` (the reference would feed a blank image). A date without S1
is used, its S1 zeroed and marked in the item's `s1_valid` / `target_s1_valid` (data/samples.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import pickle
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from vcloud.data.layout import REGION_SPLITS, REGIONS, RoiId, parse_name, parse_roi
from vcloud.data.samples import stack_sample
from vcloud.data.shards import as_reader
from vcloud.data.store import location_id
from vcloud.errors import BadInputError

PROTOCOL = "uncrtaints"
REGION_CHOICES: tuple[str, ...] = ("all", *REGIONS)
CLEAR_TARGET_MAX = 1e-3  # the reference's clear_tresh: a target above it is flagged, not dropped
PAIRS_FORMAT = "vcloud.uncrtaints-pairs"
PAIRS_VERSION = 1
_LOCATION_RE = re.compile(r"^(?P<rois>ROIs\d{4})_(?P<roi>\d+)_p(?P<patch>\d+)$")


@dataclass(frozen=True)
class Selection:
    """The fixed sampler's choice for one location: date indices into the series."""

    inputs: tuple[int, ...]  # time order
    target: int
    match: bool


def fixed_sampler(coverage, *, dates: int = 3, min_cov: float = 0.0, max_cov: float = 1.0) -> Selection:
    """The reference's fixed sampler on one location's coverage per date (floats, no NaN)."""
    coverage = [float(c) for c in coverage]
    target = reference_argsort(coverage)[0]  # the least cloudy date, ties as the reference's numpy
    inputs = [t for t, c in enumerate(coverage) if min_cov <= c <= max_cov][:dates]
    match = len(inputs) == dates
    if not match:
        inputs = [t for t in range(len(coverage)) if t != target][:dates]
    match = match and coverage[target] <= CLEAR_TARGET_MAX
    return Selection(inputs=tuple(inputs), target=target, match=match)


SMALL_QUICKSORT = 15  # numpy's npysort: partitions at most this long are insertion-sorted


def _less(a: float, b: float) -> bool:
    return a < b or (b != b and a == a)  # numpy's float order: NaN last


def reference_argsort(values) -> list[int]:
    """`np.argsort(values)` (kind "quicksort") as numpy <= 1.24 computes it, ties included.

    numpy's aquicksort (npysort/quicksort): median-of-3 introsort on an index array, insertion
    sort below 16 elements, heapsort past a depth of 2 * floor(log2 n). Unstable, so the order
    of equal values is this algorithm's, which the reference's target choice depends on.
    """
    v = [float(x) for x in values]
    n = len(v)
    idx = list(range(n))
    stack: list[tuple[int, int, int]] = []
    pl, pr, depth = 0, n - 1, 2 * (n.bit_length() - 1 if n else 0)
    while True:
        if depth < 0:
            _heapsort(v, idx, pl, pr)
        else:
            while pr - pl > SMALL_QUICKSORT:
                pm = pl + ((pr - pl) >> 1)
                if _less(v[idx[pm]], v[idx[pl]]):
                    idx[pm], idx[pl] = idx[pl], idx[pm]
                if _less(v[idx[pr]], v[idx[pm]]):
                    idx[pr], idx[pm] = idx[pm], idx[pr]
                if _less(v[idx[pm]], v[idx[pl]]):
                    idx[pm], idx[pl] = idx[pl], idx[pm]
                pivot = v[idx[pm]]
                pi, pj = pl, pr - 1
                idx[pm], idx[pj] = idx[pj], idx[pm]
                while True:
                    pi += 1
                    while _less(v[idx[pi]], pivot):
                        pi += 1
                    pj -= 1
                    while _less(pivot, v[idx[pj]]):
                        pj -= 1
                    if pi >= pj:
                        break
                    idx[pi], idx[pj] = idx[pj], idx[pi]
                idx[pi], idx[pr - 1] = idx[pr - 1], idx[pi]
                depth -= 1
                if pi - pl < pr - pi:  # the larger part waits on the stack
                    stack.append((pi + 1, pr, depth))
                    pr = pi - 1
                else:
                    stack.append((pl, pi - 1, depth))
                    pl = pi + 1
            for pi in range(pl + 1, pr + 1):  # insertion sort
                vi = idx[pi]
                pj = pi
                while pj > pl and _less(v[vi], v[idx[pj - 1]]):
                    idx[pj] = idx[pj - 1]
                    pj -= 1
                idx[pj] = vi
        if not stack:
            return idx
        pl, pr, depth = stack.pop()


def _heapsort(v: list[float], idx: list[int], pl: int, pr: int) -> None:
    """numpy's aheapsort on idx[pl..pr] (1-based heap over the slice)."""
    a = [0, *idx[pl : pr + 1]]
    n = len(a) - 1

    def sift(i: int, tmp: int, n: int) -> None:
        j = 2 * i
        while j <= n:
            if j < n and _less(v[a[j]], v[a[j + 1]]):
                j += 1
            if not _less(v[tmp], v[a[j]]):
                break
            a[i] = a[j]
            i, j = j, 2 * j
        a[i] = tmp

    for start in range(n >> 1, 0, -1):
        sift(start, a[start], n)
    while n > 1:
        tmp = a[n]
        a[n] = a[1]
        n -= 1
        sift(1, tmp, n)
    idx[pl : pr + 1] = a[1:]


def region_rois(region: str) -> frozenset[RoiId] | None:
    """The dataset ROIs of a region (every split); None for `all` (no filter)."""
    if region not in REGION_CHOICES:
        raise BadInputError(f"region '{region}' is not one of {', '.join(REGION_CHOICES)}")
    if region == "all":
        return None
    return frozenset(parse_roi(text) for names in REGION_SPLITS[region].values() for text in names)


def parse_location(location: str) -> tuple[RoiId, int]:
    """'ROIs1868_119_p42' -> (RoiId('ROIs1868', 119), 42)."""
    match = _LOCATION_RE.match(location)
    if not match:
        raise BadInputError(f"location id '{location}' does not parse: expected ROIsXXXX_<roi>_p<patch>")
    return RoiId(match["rois"], int(match["roi"])), int(match["patch"])


# ---------------------------------------------------------------------------------------------
# The released pairing file


@dataclass(frozen=True)
class PairEntry:
    """One location of a pairing file: its coverage per date and the dates its file names carry."""

    index: int  # pdx, the entry's key in the file
    location: str  # "ROIs1868_119_p42"
    coverage: tuple[float, ...]
    s2_dates: tuple[str, ...]  # ISO dates, one per date index
    s1_dates: tuple[str, ...] | None


def _torch_storage_from_bytes(data: bytes):
    # The reference's tensors pickle their storage as a nested torch.save; torch's weights-only
    # unpickler reads it and builds nothing but tensors and storages.
    return torch.load(io.BytesIO(data), weights_only=True)


def _safe_globals() -> dict[tuple[str, str], object]:
    reconstruct = np.array(0, dtype=object).__reduce__()[0]  # numpy's ndarray rebuild function
    scalar = np.float32(0).__reduce__()[0]  # numpy's scalar rebuild function
    allowed: dict[tuple[str, str], object] = {}
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = reconstruct
        allowed[(module, "scalar")] = scalar
    allowed[("numpy", "ndarray")] = np.ndarray
    allowed[("numpy", "dtype")] = np.dtype
    allowed[("torch._utils", "_rebuild_tensor_v2")] = torch._utils._rebuild_tensor_v2
    allowed[("torch.storage", "_load_from_bytes")] = _torch_storage_from_bytes
    allowed[("collections", "OrderedDict")] = OrderedDict  # a tensor's (empty) backward hooks
    return allowed


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file, path: Path):
        super().__init__(file)
        self.path = path
        self.allowed = _safe_globals()

    def find_class(self, module: str, name: str):
        try:
            return self.allowed[(module, name)]
        except KeyError:
            raise BadInputError(
                f"{self.path}: refuses to unpickle {module}.{name} (only dicts, lists, strings, numbers, "
                "numpy arrays and torch tensors are read from a pairing file)"
            ) from None


def _load_npy(path: Path) -> object:
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, _, dtype = np.lib.format.read_array_header_2_0(f)
            if dtype != np.dtype(object) or shape != ():
                raise BadInputError(f"{path}: holds a {dtype} array of shape {shape}, not a pickled dict")
            array = _RestrictedUnpickler(f, path).load()
    except BadInputError:
        raise
    except OSError as err:
        raise BadInputError(f"{path}: cannot read ({err.strerror or err})") from None
    except Exception as err:  # a truncated or foreign file: numpy/pickle raise many types
        raise BadInputError(f"{path}: not a readable .npy pairing file ({type(err).__name__}: {err})") from None
    return array.item() if isinstance(array, np.ndarray) and array.shape == () else array


def _number(value, where: str) -> float:
    if isinstance(value, torch.Tensor | np.ndarray | np.generic):
        size = value.numel() if isinstance(value, torch.Tensor) else np.size(value)
        if size != 1:
            raise BadInputError(f"{where}: coverage has {size} values, expected one")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadInputError(f"{where}: coverage {value!r} is not a number")
    value = float(value)
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise BadInputError(f"{where}: coverage {value} is outside 0..1")
    return value


def _dates_of(paths, kind: str, where: str, times: int) -> tuple[tuple[RoiId, int], tuple[str, ...]]:
    if not isinstance(paths, list | tuple) or len(paths) != times:
        raise BadInputError(f"{where}: paths.{kind.upper()} must list {times} files (one per coverage value)")
    places, dates = set(), []
    for t, path in enumerate(paths):
        if not isinstance(path, str):
            raise BadInputError(f"{where}: paths.{kind.upper()}[{t}] is not a string")
        try:
            name = parse_name(path.rsplit("/", 1)[-1])
        except ValueError as err:
            raise BadInputError(f"{where}: paths.{kind.upper()}[{t}] '{path}': {err}") from None
        if name.kind != kind or name.t != t:
            raise BadInputError(f"{where}: paths.{kind.upper()}[{t}] '{path}' is not the {kind} image of date {t}")
        places.add((RoiId(name.rois, name.roi), name.patch))
        dates.append(name.date.isoformat())
    if len(places) != 1:
        raise BadInputError(f"{where}: paths.{kind.upper()} name {len(places)} different locations")
    return places.pop(), tuple(dates)


def _entry(key, value, path: Path) -> PairEntry:
    where = f"{path}: entry {key!r}"
    if isinstance(key, bool) or not isinstance(key, int):
        raise BadInputError(f"{where}: keys must be sample indices (int)")
    if not isinstance(value, dict) or "coverage" not in value or "paths" not in value:
        raise BadInputError(f"{where}: expected a dict with 'coverage' and 'paths' (the 'generic' pairing format)")
    coverage = value["coverage"]
    if isinstance(coverage, np.ndarray | torch.Tensor):
        coverage = list(coverage)
    if not isinstance(coverage, list | tuple) or not coverage:
        raise BadInputError(f"{where}: coverage must be a list with one value per date")
    cover = tuple(_number(c, f"{where} date {t}") for t, c in enumerate(coverage))
    paths = value["paths"]
    if not isinstance(paths, dict) or "S2" not in paths:
        raise BadInputError(f"{where}: paths must be a dict with an 'S2' list")
    (roi, patch), s2_dates = _dates_of(paths["S2"], "s2", where, len(cover))
    s1_dates = None
    if "S1" in paths:
        place, s1_dates = _dates_of(paths["S1"], "s1", where, len(cover))
        if place != (roi, patch):
            raise BadInputError(f"{where}: S1 and S2 paths name different locations")
    return PairEntry(int(key), location_id(roi.rois, roi.roi, patch), cover, s2_dates, s1_dates)


def _read_json(path: Path) -> list[PairEntry]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise BadInputError(f"{path}: not readable JSON ({err})") from None
    if not isinstance(doc, dict) or doc.get("format") != PAIRS_FORMAT or doc.get("version") != PAIRS_VERSION:
        raise BadInputError(f"{path}: not a {PAIRS_FORMAT} version {PAIRS_VERSION} file (write one with convert_pairs)")
    entries = []
    for i, item in enumerate(doc.get("entries", [])):
        where = f"{path}: entries[{i}]"
        try:
            entry = PairEntry(
                index=int(item["index"]),
                location=str(item["location"]),
                coverage=tuple(_number(c, f"{where} date {t}") for t, c in enumerate(item["coverage"])),
                s2_dates=tuple(str(d) for d in item["s2_dates"]),
                s1_dates=None if item.get("s1_dates") is None else tuple(str(d) for d in item["s1_dates"]),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise BadInputError(f"{where}: malformed ({type(err).__name__}: {err})") from None
        parse_location(entry.location)
        if len(entry.s2_dates) != len(entry.coverage):
            raise BadInputError(f"{where}: {len(entry.s2_dates)} s2_dates for {len(entry.coverage)} coverage values")
        entries.append(entry)
    return entries


def read_pairs(path: Path) -> list[PairEntry]:
    """The entries of a released pairing file (.npy) or of its JSON conversion, checked, by index."""
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"{path}: pairing file not found")
    if path.suffix == ".json":
        entries = _read_json(path)
    else:
        pairs = _load_npy(path)
        if not isinstance(pairs, dict) or not pairs:
            raise BadInputError(f"{path}: expected a non-empty pickled dict, found {type(pairs).__name__}")
        entries = [_entry(key, value, path) for key, value in pairs.items()]
    if not entries:
        raise BadInputError(f"{path}: no entries")
    seen: dict[str, int] = {}
    for entry in entries:
        if entry.location in seen:
            raise BadInputError(f"{path}: entries {seen[entry.location]} and {entry.index} both name {entry.location}")
        seen[entry.location] = entry.index
    return sorted(entries, key=lambda e: e.index)


def convert_pairs(source: Path, out: Path) -> int:
    """A released pairing file -> checked JSON (no pickle needed to read it again); returns entries."""
    source, out = Path(source), Path(out)
    entries = read_pairs(source)
    doc = {
        "format": PAIRS_FORMAT,
        "version": PAIRS_VERSION,
        "source": source.name,
        "source_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
        "entries": [
            {
                "index": e.index,
                "location": e.location,
                "coverage": list(e.coverage),
                "s2_dates": list(e.s2_dates),
                "s1_dates": None if e.s1_dates is None else list(e.s1_dates),
            }
            for e in entries
        ],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, out)
    return len(entries)


# ---------------------------------------------------------------------------------------------
# The samples


@dataclass(frozen=True)
class Item:
    """One sample: store location index, target date, input dates (time order), reconstruction slot."""

    location: int
    target: int
    inputs: tuple[int, ...]
    slot: int  # the input nearest in time to the target (the target itself when it is an input)
    match: bool


class UncrtaintsSamples(Dataset):
    """Protocol `uncrtaints` on a prepared store: one sample per location, as the reference.

    Batch keys as evaluate.ReferenceSamples: x (T, 17, H, W), days, target_index (the slot the
    model reconstructs: the input nearest in time to the target), target_s1, target_prob,
    target (the target date's S2), wind and cloud_class (of the slot's date), location; plus
    target_in_inputs and coverage_match (the reference's flag).
    """

    def __init__(
        self,
        store: Path,
        *,
        dates: int = 3,
        region: str = "all",
        min_cov: float = 0.0,
        max_cov: float = 1.0,
        pairs: Path | None = None,
    ):
        if dates < 1:
            raise BadInputError(f"uncrtaints: dates (T) must be >= 1, got {dates}")
        if not 0.0 <= min_cov <= max_cov <= 1.0:
            raise BadInputError(f"uncrtaints: need 0 <= min_cov <= max_cov <= 1, got [{min_cov}, {max_cov}]")
        self.reader = as_reader(store)
        self.store = self.reader.path
        if getattr(self.reader, "from_plain_folder", False):
            raise BadInputError(
                f"{self.store}: your own imagery (a plain folder), not SEN12MS-CR-TS: the uncrtaints protocol is that "
                "dataset's (its sampler over the dataset's series, its regions and released pairing), so it is not run; "
                "the fixed and reference protocols score this store"
            )
        self.dates, self.region, self.min_cov, self.max_cov = dates, region, min_cov, max_cov
        self.pairs = None if pairs is None else Path(pairs)
        rois = region_rois(region)
        usable = self.reader.valid_s2  # (L, T): with S1 or without (s1_valid in the item)
        times = usable.shape[1]
        in_region = [
            i for i, name in enumerate(self.reader.locations) if rois is None or parse_location(name)[0] in rois
        ]
        if self.pairs is None:
            # the reference's coverage is the S2 image's: a missing S2 counts as fully cloudy
            cover = np.where(self.reader.valid_s2, np.nan_to_num(self.reader.cloud_cover, nan=1.0), 1.0)
            coverage = {i: cover[i].tolist() for i in in_region}
            self.pairs_unmatched = 0
        else:
            coverage = self._coverage_from_pairs(read_pairs(self.pairs), rois, times)
        self.items: list[Item] = []
        self.skipped: list[tuple[str, str]] = []  # (location id, why)
        for location in sorted(coverage):
            choice = fixed_sampler(coverage[location], dates=dates, min_cov=min_cov, max_cov=max_cov)
            name = self.reader.locations[location]
            if len(choice.inputs) < dates:
                raise BadInputError(f"{self.store}: {times} dates per location, too few for T={dates} inputs")
            bad = [t for t in (*choice.inputs, choice.target) if not usable[location, t]]
            if bad:
                self.skipped.append((name, f"date index {bad[0]} selected but unusable (image missing or bad)"))
                continue
            inputs = np.asarray(choice.inputs)
            slot = int(np.argmin(np.abs(inputs - choice.target)))
            self.items.append(Item(location, choice.target, choice.inputs, slot, choice.match))
        if not self.items:
            raise BadInputError(f"{self.store}: no uncrtaints sample in region '{region}'")

    def _coverage_from_pairs(self, entries: list[PairEntry], rois, times: int) -> dict[int, list[float]]:
        """Entries in the region whose ROI the store holds, checked against the store."""
        index = {name: i for i, name in enumerate(self.reader.locations)}
        store_rois = {parse_location(name)[0] for name in self.reader.locations}
        coverage, self.pairs_unmatched = {}, 0
        for entry in entries:
            roi, _ = parse_location(entry.location)
            if rois is not None and roi not in rois:
                continue
            if roi not in store_rois:  # a ROI the store does not hold at all: counted, not used
                self.pairs_unmatched += 1
                continue
            where = f"{self.pairs}: entry {entry.index} ({entry.location})"
            if entry.location not in index:
                raise BadInputError(f"{where}: location not in store {self.store}")
            if len(entry.coverage) != times:
                raise BadInputError(f"{where}: {len(entry.coverage)} dates, store {self.store} has {times}")
            location = index[entry.location]
            for kind, dates in (("s2", entry.s2_dates), ("s1", entry.s1_dates)):
                stored = getattr(self.reader, f"date_{kind}")[location]
                for t, day in enumerate(dates or ()):
                    if np.isnat(stored[t]):
                        continue  # the store lacks that image; the sampler skips the location if it picks it
                    have = str(np.datetime64(stored[t], "D"))
                    if have != day:
                        raise BadInputError(f"{where}: {kind} date index {t} is {day} in the file, {have} in the store")
            coverage[location] = list(entry.coverage)
        if not coverage:
            raise BadInputError(f"{self.pairs}: no entry of region '{self.region}' names a location of {self.store}")
        return coverage

    def describe(self) -> dict:
        """What the report records about this protocol's samples."""
        return {
            "protocol": PROTOCOL,
            "dates": self.dates,
            "region": self.region,
            "min_cov": self.min_cov,
            "max_cov": self.max_cov,
            "pairs": "computed" if self.pairs is None else str(self.pairs),
            "pairs_outside_store": self.pairs_unmatched,
            "samples": len(self.items),
            "target_in_inputs": sum(item.target in item.inputs for item in self.items),
            "coverage_match": sum(item.match for item in self.items),
            "skipped": [f"{name}: {why}" for name, why in self.skipped],
            # per sample, in sample order: [location id, target date index, input date indices, slot]
            "items": [[self.reader.locations[i.location], i.target, list(i.inputs), i.slot] for i in self.items],
        }

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        it = self.items[index]
        dates = list(it.inputs)
        sample = self.reader.read(it.location, [*dates, it.target])
        prob = np.nan_to_num(sample.cloud_prob, nan=1.0)
        item = stack_sample(
            sample.s2[:-1],
            sample.s1[:-1],
            prob[:-1],
            self.reader.date_s2[it.location, dates],
            it.slot,
            s1_valid=sample.valid_s1[:-1],
        )
        item["target"] = torch.from_numpy(np.ascontiguousarray(sample.s2[-1]))
        item["wind"] = torch.from_numpy(self.reader.wind[it.location, dates[it.slot]])
        item["cloud_class"] = torch.tensor(int(self.reader.cloud_class[it.location, dates[it.slot]]))
        item["location"] = torch.tensor(it.location)
        item["target_in_inputs"] = torch.tensor(it.target in it.inputs)
        item["coverage_match"] = torch.tensor(it.match)
        return item
