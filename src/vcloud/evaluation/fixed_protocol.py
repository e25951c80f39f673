"""`vcloud fixed-protocol`: the fixed protocol's cloud detection, done once per run.

A fixed-protocol sample (`fixed_samples` below, re-exported by evaluation/protocols.py) puts a
seeded synthetic cloud on a clear target date; the cloud probability the model sees there is
what s2cloudless (LightGBM) finds on the clouded image (data/samples.py, CloudySamples). Detecting is the largest cost of evaluating
on a CPU (~25 us per touched pixel and core) and it is the same for every stage's evaluation
and the viewer: same store, seed and settings. This command detects once, for every sample
index, over the touched pixels of many samples per LightGBM call on all the threads given;
`vcloud evaluate` / `vcloud export-viewer --fixed-protocol FILE` read the file instead of
detecting, and give the same numbers and images as without it.

File (npz, no pickle):
- `levels` (M,) uint8: the detected probability of every touched pixel (the synthetic cloud or
  its shadow is non-zero there), as the store holds probabilities, sample after sample, in
  row-major order within a sample. Untouched pixels keep the stored probability: not in the file.
- `offsets` (N+1,) int64: sample i's levels are levels[offsets[i]:offsets[i+1]].
- `meta`: a JSON string with the format and version, what the samples depend on (a fingerprint
  of the store's location ids, dates, usable dates and cloud cover; the seed, input dates,
  cloud kinds, clear-target threshold, sample count, sample shape; the s2cloudless settings,
  version and probability scale), a sha256 checksum over the arrays, and provenance.

Loading checks all of it against the store and model config of the evaluation; any difference,
a damaged or truncated file, or a sample whose cloud touches another number of pixels than the
file holds stops with one line naming the file and what differs.

A store whose mask came with the data (SCL/, MASK/: data/masks.py) has nothing to detect: its
clouded targets get the simulated cloud's probability, as its own mask would mark them
(data/samples.py). Its file holds no levels (`target_probability` "simulated" in the meta, every
offset 0) and still pins the samples (store fingerprint, seed, dates, kinds, ...), so the
workflow's rules read one file whatever the mask; loading it sets no detection.
"""

from __future__ import annotations

import hashlib
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
from tqdm import tqdm

from vcloud.config import ModelSetConfig
from vcloud.constants import S2CLOUDLESS_KWARGS
from vcloud.data.samples import CloudySamples, detected_probability
from vcloud.data.store import CLOUD_PROB_SCALE
from vcloud.errors import BadInputError, VcloudError
from vcloud.io import atomic_open, provenance, read_npz_with_meta
from vcloud.pipeline import EVAL_KINDS

log = logging.getLogger(__name__)

EVAL_SEED = 2024  # the seed of every evaluation draw: the fixed samples' clouds, the models' sampling
FORMAT_NAME = "vcloud-fixed-protocol"
FORMAT_VERSION = 1
ARRAY_KEYS = ("levels", "offsets")
BATCH_PIXELS = 1 << 20  # pixels of the samples read per LightGBM call (~50 MB of float32 bands)
# What the samples depend on, as the file's meta names it -> how a difference is reported.
CHECKED = {
    "locations": "number of locations",
    "store_fingerprint": "store (location ids, dates, usable dates, cloud cover)",
    "seed": "seed",
    "dates": "input dates",
    "kinds": "cloud kinds",
    "clear_max_cover": "clear-target threshold (data.clear_target_max_cover)",
    "samples": "sample count",
    "shape": "sample shape",
    "s2cloudless": "s2cloudless settings",
    "target_probability": "target probability (s2cloudless detected, or simulated where the mask came with the data)",
}


def store_fingerprint(dataset: CloudySamples) -> str:
    """sha256 of the store tables the fixed samples are drawn from."""
    reader = dataset.reader
    digest = hashlib.sha256()
    digest.update(json.dumps(reader.locations).encode())
    for table in (reader.date_s2.astype("datetime64[s]"), dataset.usable, reader.cloud_cover):
        table = np.ascontiguousarray(table)
        digest.update(f"{table.dtype.str}|{table.shape}|".encode())
        digest.update(table.tobytes())
    return digest.hexdigest()


def _s2cloudless() -> dict:
    try:
        package = version("s2cloudless")
    except PackageNotFoundError:
        package = "unknown"
    return {"version": package, "settings": dict(S2CLOUDLESS_KWARGS), "prob_scale": CLOUD_PROB_SCALE}


def protocol_meta(dataset: CloudySamples, *, clear_max_cover: float) -> dict:
    """The CHECKED entries for the fixed samples `dataset` (every index of the protocol)."""
    height, width = dataset.reader.shape[2:]
    crop = dataset.crop
    shape = [height, width] if crop is None or crop >= min(height, width) else [crop, crop]
    return {
        "store_fingerprint": store_fingerprint(dataset),
        "locations": len(dataset.reader),
        "seed": int(dataset.seed),
        "dates": int(dataset.dates),
        "kinds": list(dataset.kinds),
        "clear_max_cover": float(clear_max_cover),
        "samples": len(dataset.pair_order),  # one per (clear target, kind)
        "shape": shape,
        "s2cloudless": _s2cloudless(),
        "target_probability": target_probability(dataset),
    }


def target_probability(dataset: CloudySamples) -> str:
    """Where a clouded target's probability comes from: s2cloudless detected on it, or the simulated
    cloud itself on a store whose mask came with the data."""
    return "simulated" if dataset.supplied_mask else "s2cloudless"


def _checksum(arrays: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for name in ARRAY_KEYS:
        array = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


# --- the samples ----------------------------------------------------------------------


def fixed_samples(
    store: Path, cfg: ModelSetConfig, *, samples: int | None = None, detected: Path | None = None
) -> CloudySamples:
    """The fixed protocol's samples: seeded thin/thick/opaque clouds on the clear dates.

    Sample i is the same whatever `samples` is (draws depend on the seed and i only), so the
    viewer's sample i is the evaluation's sample i. `detected`: the file of `vcloud
    fixed-protocol` for this store and config (`write_fixed_protocol`), read instead of
    running s2cloudless on every clouded target; checked first, a mismatch raises one line.
    """
    dataset = CloudySamples(
        store,
        dates=cfg.data.input_dates,
        length=samples,
        seed=EVAL_SEED,
        clear_max_cover=cfg.data.clear_target_max_cover,
        kinds=EVAL_KINDS,
        **cfg.data.context.sampler_kwargs(),
    )
    if detected is not None:
        detections = load_fixed_protocol(detected, dataset, clear_max_cover=cfg.data.clear_target_max_cover)
        if not dataset.supplied_mask:  # a supplied mask's targets: the simulated cloud, nothing detected
            dataset.detected = detections
    return dataset


# --- compute and write -----------------------------------------------------------------


def detect_all(dataset: CloudySamples, *, threads: int = 1) -> dict[str, np.ndarray]:
    """levels and offsets (module docstring) of every index of `dataset`'s protocol.

    Samples are read and clouded `threads` at a time; their touched pixels go to LightGBM
    together, about BATCH_PIXELS per call, with `threads` threads.
    """
    total = len(dataset.pair_order)
    height, width = dataset.reader.shape[2:]
    per_batch = max(1, BATCH_PIXELS // (height * width))
    levels, counts = [], []
    with ThreadPoolExecutor(max(1, threads)) as pool, tqdm(total=total, unit="sample", disable=None) as bar:
        for start in range(0, total, per_batch):
            targets = list(pool.map(dataset.clouded_target, range(start, min(start + per_batch, total))))
            pixels = np.concatenate([clouded[:, touched] for clouded, touched in targets], axis=1)  # (13, M)
            counts += [int(touched.sum()) for _, touched in targets]
            if pixels.shape[1]:
                levels.append(detected_probability(pixels[:, None], num_threads=threads)[0])  # (M,)
            bar.update(len(targets))
    offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
    return {"levels": np.concatenate(levels) if levels else np.zeros(0, np.uint8), "offsets": offsets}


def write_fixed_protocol(store: Path, cfg: ModelSetConfig, out: Path, *, threads: int = 1) -> dict:
    """Detect every fixed-protocol sample of `store` and write `out` atomically; returns the meta."""
    if threads < 1:
        raise VcloudError(f"--threads: {threads}; expected at least 1")
    dataset = fixed_samples(store, cfg)
    if dataset.supplied_mask:
        log.info(
            "%s: its cloud mask came with the data: the clouded targets take the simulated clouds, nothing to detect",
            store,
        )
        arrays = {"levels": np.zeros(0, np.uint8), "offsets": np.zeros(len(dataset.pair_order) + 1, np.int64)}
    else:
        arrays = detect_all(dataset, threads=threads)
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        **protocol_meta(dataset, clear_max_cover=cfg.data.clear_target_max_cover),
        "store": str(store),
        "model_set": cfg.name,
        "pixels": int(arrays["levels"].size),
        "checksum_sha256": _checksum(arrays),
        **provenance(),
    }
    try:
        with atomic_open(Path(out), "wb") as handle:
            np.savez_compressed(handle, **arrays, meta=np.array(json.dumps(meta, sort_keys=True)))
    except OSError as err:
        raise VcloudError(f"{out}: cannot write the fixed-protocol detection ({err.strerror or err})") from err
    log.info("%s: %d samples, %d touched pixels detected, of %s", out, meta["samples"], meta["pixels"], store)
    return meta


# --- read and check --------------------------------------------------------------------


class FixedDetections:
    """The file's levels for CloudySamples(detected=...), checked against the samples' clouds."""

    def __init__(self, path: Path, levels: np.ndarray, offsets: np.ndarray):
        self.path, self._levels, self._offsets = path, levels, offsets

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def levels(self, index: int, count: int) -> np.ndarray:
        """(count,) uint8 levels of sample `index`'s touched pixels, in row-major order."""
        if not 0 <= index < len(self):
            raise BadInputError(f"{self.path}: has samples 0..{len(self) - 1}, sample {index} asked for")
        start, stop = int(self._offsets[index]), int(self._offsets[index + 1])
        if stop - start != count:
            raise BadInputError(
                f"{self.path}: sample {index} has {stop - start} detected pixels, its cloud here touches {count} "
                "(made by another cloud simulation?); rerun `vcloud fixed-protocol`"
            )
        return self._levels[start:stop]


def _read(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    if not path.is_file():
        raise BadInputError(f"{path}: fixed-protocol detection not found; run `vcloud fixed-protocol --out {path}`")

    def check(meta: dict) -> None:
        if meta.get("format") != FORMAT_NAME:
            raise BadInputError(f"{path}: not a fixed-protocol detection (format {meta.get('format')!r})")
        if meta.get("format_version") != FORMAT_VERSION:
            raise BadInputError(
                f"{path}: format version {meta.get('format_version')!r}, this vcloud reads {FORMAT_VERSION}; "
                "rerun `vcloud fixed-protocol`"
            )

    return read_npz_with_meta(path, what="fixed-protocol detection", array_keys=ARRAY_KEYS, check_meta=check)


def _shown(value) -> str:
    return f"{value[:12]}..." if isinstance(value, str) and len(value) == 64 else json.dumps(value)


def load_fixed_protocol(path: Path, dataset: CloudySamples, *, clear_max_cover: float) -> FixedDetections:
    """Read `path` and check it against the fixed samples `dataset`; one line on any difference."""
    path = Path(path)
    arrays, meta = _read(path)
    expected = protocol_meta(dataset, clear_max_cover=clear_max_cover)
    meta.setdefault("target_probability", "s2cloudless")  # files made before supplied masks were taken
    for key, label in CHECKED.items():
        if meta.get(key) != expected[key]:
            raise BadInputError(
                f"{path}: made for another {label}: {_shown(meta.get(key))} in the file (made from "
                f"{meta.get('store')}), {_shown(expected[key])} for {dataset.reader.path}; rerun `vcloud fixed-protocol`"
            )
    if meta.get("checksum_sha256") != _checksum(arrays):
        raise BadInputError(f"{path}: checksum mismatch, the file is damaged; rerun `vcloud fixed-protocol`")
    levels, offsets = arrays["levels"], arrays["offsets"]
    if levels.dtype != np.uint8 or levels.ndim != 1 or offsets.shape != (expected["samples"] + 1,):
        raise BadInputError(
            f"{path}: levels {levels.dtype} {levels.shape} / offsets {offsets.shape} do not fit "
            f"{expected['samples']} samples"
        )
    if offsets[0] != 0 or offsets[-1] != levels.size or np.any(np.diff(offsets) < 0):
        raise BadInputError(f"{path}: offsets do not partition the {levels.size} levels")
    if len(dataset) > expected["samples"]:
        raise BadInputError(
            f"{path}: holds the protocol's {expected['samples']} samples, {len(dataset)} asked for (--samples)"
        )
    return FixedDetections(path, levels, offsets)
