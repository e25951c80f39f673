"""`vcloud bundle`: a trained model as one self-describing file, and reading it back.

A bundle is one uncompressed tar file (docs/predict.md, "Bundle"):

    vcloud-bundle.json   first member: format, format_version, and per member its bytes and SHA-256
    model-card.json      what the model expects and how well it did (bands and order, L1C scaling,
                         S1 handling, T, patch size, training data, evaluation figures)
    model-card.md        the same for people
    config.yaml          the resolved model config (every default filled in)
    stage<n>.pt          the best.pt of every stage the bundled predictors need (registry.predictor_needs)
    wind/scan_orders.npz the wind-scanner cache, when stage1.model.wind_scan is on

Why one tar and not a folder: one file to copy, upload and cite; it is written under a temporary
name and renamed, so it is never half there and a new one replaces an old one in one step (a
folder cannot be renamed over a folder); tar is read by the standard library and by `tar xf`.
Not compressed: weights do not compress. The members are written in a fixed order with fixed
metadata (mtime 0, uid 0): the same inputs give the same bytes.

Reading (`open_bundle`) checks the format, that every listed member is there with its size and
SHA-256 and that nothing else is, and, given a store, that the model fits it (bands, patch size,
normalisation). Each failure is one BadInputError line naming the bundle. The members are
extracted into a temporary folder that lives as long as the `with` block: the predictors read
checkpoint files (weights.load_checkpoint).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from vcloud.bands import model_bands
from vcloud.constants import S1_BANDS, S2_SCALE
from vcloud.errors import BadInputError, ConfigError
from vcloud.io import atomic_output, provenance

PRODUCTS = {
    "L1C": "Sentinel-2 Level-1C top-of-atmosphere reflectance",
    "L2A": "Sentinel-2 Level-2A bottom-of-atmosphere reflectance (BOA_ADD_OFFSET applied)",
}
CLOUD_PROBABILITY = {
    "s2cloudless": "s2cloudless on the 13 bands, computed by vcloud prepare",
    "scl": "the scene classification (SCL) through the store's class table (data.scl_cloud_prob)",
    "mask": "the mask that came with the data (MASK/)",
}
log = logging.getLogger(__name__)

FORMAT = "vcloud-bundle"
FORMAT_VERSION = 1
MANIFEST = "vcloud-bundle.json"
CARD = "model-card.json"
CARD_TEXT = "model-card.md"
CONFIG = "config.yaml"
WIND = "wind/scan_orders.npz"
# Every name a bundle may hold besides its manifest: nothing is extracted outside the folder.
_MEMBER_RE = re.compile(r"^(model-card\.json|model-card\.md|config\.yaml|stage\d+\.pt|wind/scan_orders\.npz)$")
_BLOCK = 1 << 20


def _sha256_stream(handle) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    for block in iter(lambda: handle.read(_BLOCK), b""):
        digest.update(block)
        size += len(block)
    return digest.hexdigest(), size


def _sha256(path: Path) -> tuple[str, int]:
    with open(path, "rb") as handle:
        return _sha256_stream(handle)


# ----------------------------------------------------------------------------- writing


def write_bundle(
    *,
    out: Path,
    stages: list[int],
    checkpoints: dict[int, Path],
    config_path: Path,
    train_store: Path,
    wind_cache: Path | None = None,
    eval_reports: list[Path] = (),
    command: str = "vcloud bundle",
) -> dict:
    """Pack the predictors of `stages` into the tar file `out` (atomically); returns its manifest."""
    from vcloud.config import load_model_config
    from vcloud.config.model_sets import config_to_dict
    from vcloud.data.store import check_bands
    from vcloud.registry import get_stage, require_checkpoints
    from vcloud.weights import load_checkpoint

    if not stages:
        raise ConfigError("vcloud bundle: give at least one --stage")
    label = "vcloud bundle --stage " + " --stage ".join(map(str, stages))
    packed = sorted({n for s in stages for n in get_stage(s).predictor_needs})
    needed = require_checkpoints(packed, checkpoints, command=label)
    cfg = load_model_config(config_path)
    check_bands(train_store, model_bands(cfg), model=f"the model of {config_path}")
    metas = {}
    for n, path in needed.items():
        state = load_checkpoint(path, mmap=True)  # only the meta is read
        if state.get("stage") != n:
            raise BadInputError(f"{path}: checkpoint of stage {state.get('stage')}, expected stage {n}")
        metas[n] = {
            k: state.get(k)
            for k in ("stage", "vcloud_version", "git_revision", "torch_version", "config_hash", "created_utc")
        }
    uses_wind = cfg.stage1.model.wind_scan and any(get_stage(n).reads_wind for n in packed)
    if uses_wind:
        from vcloud.wind.stage_orders import load_wind_orders

        if wind_cache is None:
            raise ConfigError(f"{label}: stage1.model.wind_scan is on; pass --wind-cache FILE")
        load_wind_orders(cfg, store=train_store, wind_cache=wind_cache, world_size=1, command=label)
    elif wind_cache is not None:
        log.info("%s: not packed (stage1.model.wind_scan is off)", wind_cache)
        wind_cache = None
    training = _training_data(Path(train_store))
    predicts = sorted(s.number for s in _stages() if set(s.predictor_needs) <= set(packed))
    evaluations = _evaluations(eval_reports, predicts)
    card = {
        "model_set": cfg.name,
        "stages": {str(n): {"predictor_needs": list(get_stage(n).predictor_needs)} for n in predicts},
        "default_stage": max(predicts),
        "inputs": {
            "s2": {
                "bands": list(model_bands(cfg)),
                "product": PRODUCTS[training["level"]],
                "dtype": "uint16",
                "scale": f"reflectance x {S2_SCALE:g}",
                "normalisation": training["normalisation"].get("s2"),
            },
            "s1": {
                "bands": list(S1_BANDS),
                "product": "Sentinel-1 GRD backscatter, dB (VV, VH)",
                "dtype": "float32",
                "normalisation": training["normalisation"].get("s1"),
                "missing": "a date without S1 is an input with its S1 zeroed and the S1-validity "
                "channel at 0: the model is told (it trained with S1 dropped at random)",
            },
            "cloud_probability": CLOUD_PROBABILITY[training["mask"]],
            "input_dates": cfg.data.input_dates,
            "patch_size": training["patch_size"],
        },
        "output": {
            "bands": list(model_bands(cfg)),
            "scale": f"uint16 reflectance x {S2_SCALE:g} ({training['level']}, as the input)",
        },
        "wind": {"scan": bool(cfg.stage1.model.wind_scan), "cache": WIND if uses_wind else None},
        "training": training["record"],
        "checkpoints": {f"stage{n}.pt": meta for n, meta in metas.items()},
        "evaluation": evaluations,
        "producer": {**provenance(), "command": command},
    }
    card_bytes = (json.dumps(card, indent=1) + "\n").encode()
    config_bytes = _yaml(config_to_dict(cfg)).encode()
    sources: dict[str, Path | bytes] = {CARD: card_bytes, CARD_TEXT: render_card(card).encode(), CONFIG: config_bytes}
    sources.update({f"stage{n}.pt": Path(path) for n, path in needed.items()})
    if uses_wind:
        sources[WIND] = Path(wind_cache)
    members = {}
    for name, source in sources.items():
        sha, size = _sha256(source) if isinstance(source, Path) else (hashlib.sha256(source).hexdigest(), len(source))
        members[name] = {"bytes": size, "sha256": sha}
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "members": members}
    with atomic_output(Path(out)) as tmp, tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
        for name, source in sources.items():
            _add(tar, name, source, size=members[name]["bytes"])
    log.info("%s: stages %s (weights of %s), %d members", out, predicts, packed, len(members) + 1)
    return manifest


def _stages():
    from vcloud.registry import STAGES

    return STAGES


def _add(tar: tarfile.TarFile, name: str, source: Path | bytes, *, size: int | None = None) -> None:
    info = tarfile.TarInfo(name)
    info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = 0o644, 0, 0, 0, "", ""
    if isinstance(source, bytes):
        info.size = len(source)
        tar.addfile(info, io.BytesIO(source))
        return
    info.size = size
    with open(source, "rb") as handle:
        tar.addfile(info, handle)


def _yaml(data: dict) -> str:
    import yaml

    return "# resolved model config of this bundle (every default filled in)\n" + yaml.safe_dump(data, sort_keys=False)


def _training_data(store: Path) -> dict:
    """What the bundle says about the data the model was trained on: the training store's."""
    from vcloud.data.layout import dataset_region, parse_roi
    from vcloud.data.store import open_store

    ds = open_store(store)
    rois = sorted({f"{a}/{int(b)}" for a, b in zip(ds["rois"].values, ds["roi"].values)})
    regions = {}
    for text in rois:
        where = dataset_region(parse_roi(text))
        regions[text] = f"{where[0]} ({where[1]} split of SEN12MS-CR-TS)" if where else "not a SEN12MS-CR-TS ROI"
    height, width = int(ds.sizes["y"]), int(ds.sizes["x"])
    if height != width:
        raise BadInputError(f"{store}: {height}x{width} pixel images; a bundle records one square patch size")
    producer = ds.attrs.get("producer", {})
    record = {
        "store": Path(store).name,
        "split": Path(store).name.removesuffix(".zarr"),
        "source": ds.attrs.get("source"),
        "store_format_version": ds.attrs.get("format_version"),
        "locations": int(ds.sizes["location"]),
        "dates_per_location": int(ds.sizes["time"]),
        "rois": regions,
        "prepare_options": producer.get("options"),
    }
    from vcloud.data.masks import store_mask_source

    return {
        "record": record,
        "patch_size": height,
        "normalisation": ds.attrs.get("normalisation", {}),
        "level": ds.attrs.get("s2_product_level", "L1C"),
        "mask": store_mask_source(ds.attrs.get("cloud_mask")),
    }


def _evaluations(reports: list[Path], predicts: list[int]) -> dict:
    """{stage: figures} from results/eval/stage<n>.json reports (vcloud evaluate)."""
    found = {}
    for path in reports:
        path = Path(path)
        try:
            report = json.loads(path.read_text())
            stage, protocols = int(report["stage"]), report["protocols"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise BadInputError(f"{path}: not a vcloud evaluate report ({type(err).__name__}: {err})") from None
        if stage not in predicts:
            raise ConfigError(f"{path}: report of stage {stage}; this bundle predicts stages {predicts}")
        figures = {}
        for name, result in protocols.items():
            entry = {"protocol": result.get("protocol"), "samples": result.get("samples")}
            if "unavailable" in result:
                entry["unavailable"] = result["unavailable"]
            entry["mean"] = {
                method: result[method]["mean"]
                for method in result
                if isinstance(result.get(method), dict) and "mean" in result[method]
            }
            figures[name] = entry
        found[str(stage)] = {
            "report": path.name,
            "store": report.get("store"),
            "report_sha256": _sha256(path)[0],
            "protocols": figures,
            # what made the figures, when the report records it; else the command that remakes them
            # from this bundle (evaluation is seeded: the same figures on the same store)
            "command": report.get("command")
            or f"vcloud evaluate --bundle <this bundle> --stage {stage} --store {report.get('store')} --out stage{stage}.json",
        }
    return found


def render_card(card: dict) -> str:
    """model-card.md: the card for people."""
    inputs, training = card["inputs"], card["training"]
    lines = [
        f"# vcloud model card: {card['model_set']}",
        "",
        f"Predicts with stages {', '.join(card['stages'])} (default: stage {card['default_stage']}). "
        "Use: `vcloud predict --bundle THIS.tar --store STORE.zarr --out DIR` (docs/predict.md).",
        "",
        "## Inputs",
        "",
        f"- S2: {inputs['s2']['product']}, {len(inputs['s2']['bands'])} bands in this order: "
        f"{', '.join(inputs['s2']['bands'])}; {inputs['s2']['dtype']} {inputs['s2']['scale']}; "
        f"normalised as {json.dumps(inputs['s2']['normalisation'])}.",
        f"- S1: {inputs['s1']['product']}; bands {', '.join(inputs['s1']['bands'])}; normalised as "
        f"{json.dumps(inputs['s1']['normalisation'])}. Missing S1: {inputs['s1']['missing']}.",
        f"- Cloud probability: {inputs['cloud_probability']}.",
        f"- T = {inputs['input_dates']} input dates per prediction (the target date among them).",
        f"- Patch size: {inputs['patch_size']} x {inputs['patch_size']} pixels (stores of another size are refused).",
        f"- Wind-ordered scan: {'on (wind cache packed)' if card['wind']['scan'] else 'off'}.",
        "",
        f"Output: {', '.join(card['output']['bands'])}, {card['output']['scale']}.",
        "",
        "## Training data",
        "",
        f"- Store `{training['store']}` (split `{training['split']}`): {training['locations']} locations x "
        f"{training['dates_per_location']} dates; source {training['source']}.",
        *[f"- {roi}: {where}" for roi, where in training["rois"].items()],
        "",
        "## Evaluation",
        "",
    ]
    if not card["evaluation"]:
        lines.append("No evaluation report was packed.")
    for stage, figures in card["evaluation"].items():
        lines += [
            f"### Stage {stage}",
            "",
            f"Report `{figures['report']}` on `{figures['store']}`; command: `{figures['command']}`",
            "",
        ]
        for name, entry in figures["protocols"].items():
            lines.append(f"- Protocol `{name}`: {json.dumps(entry['protocol'])}, {entry['samples']} samples")
            if "unavailable" in entry:
                lines.append(f"  - unavailable: {entry['unavailable']}")
            for method, mean in entry["mean"].items():
                text = ", ".join(f"{metric} {value:.4g}" for metric, value in mean.items())
                lines.append(f"  - {method}: {text}")
        lines.append("")
    lines += ["## Provenance", ""]
    lines += [f"- `{name}`: {json.dumps(meta)}" for name, meta in card["checkpoints"].items()]
    lines.append(f"- bundled by: {json.dumps(card['producer'])}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Bundle:
    """An opened, checked bundle: paths of its extracted members (valid inside `open_bundle`)."""

    path: Path
    sha256: str
    card: dict
    config: Path
    checkpoints: dict[int, Path]
    wind_cache: Path | None

    @property
    def stages(self) -> list[int]:
        return [int(n) for n in self.card["stages"]]

    def stage(self, requested: int | None) -> int:
        """The stage to run: `requested` (one the bundle predicts) or the bundle's default."""
        if requested is None:
            return int(self.card["default_stage"])
        if requested not in self.stages:
            raise BadInputError(f"{self.path}: has no stage {requested} (it predicts stages {self.stages})")
        return requested


@contextmanager
def open_bundle(path: Path, *, store: Path | None = None) -> Iterator[Bundle]:
    """Check and extract the bundle at `path` (and that it fits `store`); its members live as
    long as the block. BadInputError, one line naming the bundle, on any mismatch."""
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"{path}: bundle not found")
    folder = Path(tempfile.mkdtemp(prefix="vcloud-bundle-"))
    try:
        manifest, bundle_sha = _extract(path, folder)
        try:
            card = json.loads((folder / CARD).read_text())
        except ValueError as err:
            raise BadInputError(f"{path}: {CARD} is not JSON ({err})") from None
        bundle = Bundle(
            path=path,
            sha256=bundle_sha,
            card=card,
            config=folder / CONFIG,
            checkpoints={int(name[5:-3]): folder / name for name in manifest["members"] if name.startswith("stage")},
            wind_cache=folder / WIND if WIND in manifest["members"] else None,
        )
        if store is not None:
            check_fits(bundle, Path(store))
        yield bundle
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _extract(path: Path, folder: Path) -> tuple[dict, str]:
    """Members into `folder`, each checked against the manifest; (manifest, SHA-256 of the file)."""
    try:
        with tarfile.open(path, "r:") as tar:
            first = tar.next()
            if first is None or first.name != MANIFEST or not first.isfile():
                raise BadInputError(f"{path}: not a vcloud bundle (its first member is not {MANIFEST})")
            try:
                manifest = json.loads(tar.extractfile(first).read())
            except ValueError as err:
                raise BadInputError(f"{path}: {MANIFEST} is not JSON ({err}); the bundle is damaged") from None
            _check_manifest(path, manifest)
            members = manifest["members"]
            seen = set()
            while (info := tar.next()) is not None:  # the members after the manifest, in order
                name = info.name
                if name not in members or not info.isfile():
                    raise BadInputError(f"{path}: member {name} is not in the bundle's manifest")
                if info.size != members[name]["bytes"]:
                    raise BadInputError(
                        f"{path}: member {name} has {info.size} bytes, the manifest says "
                        f"{members[name]['bytes']}; the bundle is damaged"
                    )
                target = folder / name
                target.parent.mkdir(parents=True, exist_ok=True)
                digest = hashlib.sha256()
                with tar.extractfile(info) as source, open(target, "wb") as sink:
                    for block in iter(lambda: source.read(_BLOCK), b""):
                        digest.update(block)
                        sink.write(block)
                if digest.hexdigest() != members[name]["sha256"]:
                    raise BadInputError(
                        f"{path}: member {name} fails its SHA-256 check; the bundle is damaged or altered"
                    )
                seen.add(name)
    except (tarfile.TarError, EOFError, OSError) as err:
        raise BadInputError(f"{path}: not a readable bundle ({type(err).__name__}: {err})") from None
    missing = sorted(set(members) - seen)
    if missing:
        raise BadInputError(f"{path}: member {missing[0]} is missing; the bundle is damaged or truncated")
    return manifest, _sha256(path)[0]


def _check_manifest(path: Path, manifest) -> None:
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BadInputError(
            f"{path}: not a vcloud bundle (format {manifest.get('format')!r})"
            if isinstance(manifest, dict)
            else f"{path}: not a vcloud bundle"
        )
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise BadInputError(f"{path}: bundle format_version {version!r}, this vcloud reads {FORMAT_VERSION}")
    members = manifest.get("members")
    if not isinstance(members, dict) or not {CARD, CONFIG} <= set(members):
        raise BadInputError(f"{path}: the manifest lists no {CARD} and {CONFIG}; the bundle is damaged")
    for name, record in members.items():
        if not _MEMBER_RE.match(name) or not isinstance(record, dict) or {"bytes", "sha256"} - set(record):
            raise BadInputError(f"{path}: manifest entry {name!r} is not a bundle member; the bundle is damaged")


def check_fits(bundle: Bundle, store: Path) -> None:
    """One line naming the bundle and the store when the model does not fit the store's images."""
    from vcloud.data.store import open_store

    ds = open_store(store)
    inputs, where = bundle.card["inputs"], f"{bundle.path}: does not fit {store}"
    bands = {
        "S2": (inputs["s2"]["bands"], ds.attrs.get("s2_bands")),
        "S1": (inputs["s1"]["bands"], ds.attrs.get("s1_bands")),
    }
    for kind, (want, have) in bands.items():
        if list(want) != list(have or []):
            raise BadInputError(f"{where}: {kind} bands {','.join(have or [])}, the model takes {','.join(want)}")
    size = (int(ds.sizes["y"]), int(ds.sizes["x"]))
    patch = int(inputs["patch_size"])
    if size != (patch, patch):
        raise BadInputError(f"{where}: {size[0]}x{size[1]} pixel images, the model takes {patch}x{patch}")
    normalisation = ds.attrs.get("normalisation", {})
    for kind in ("s2", "s1"):
        if normalisation.get(kind) != inputs[kind]["normalisation"]:
            raise BadInputError(
                f"{where}: {kind.upper()} normalisation {json.dumps(normalisation.get(kind))}, "
                f"the model's {json.dumps(inputs[kind]['normalisation'])}"
            )


@dataclass(frozen=True)
class ModelInputs:
    """What a command that runs a model reads: from --bundle, or --config/--stage<n>/--wind-cache."""

    stage: int | None
    config: Path
    checkpoints: dict[int, Path]
    wind_cache: Path | None
    bundle: dict | None  # {"path", "sha256"} of the bundle used, for provenance; None without one


@contextmanager
def model_inputs(
    *,
    bundle: Path | None,
    store: Path,
    stage: int | None,
    config: Path | None,
    checkpoints: dict[int, Path],
    wind_cache: Path | None,
    command: str,
    needs_stage: bool = True,
) -> Iterator[ModelInputs]:
    """The model of `vcloud predict/evaluate/export-viewer`: a bundle checked against `store`
    (members valid inside the block), or the separate files as given."""
    if bundle is None:
        if config is None:
            raise ConfigError(f"{command}: pass --config FILE (with --stage<n> checkpoints) or --bundle FILE")
        if needs_stage and stage is None:
            raise ConfigError(f"{command}: pass --stage N (or --bundle FILE, whose default stage is used)")
        yield ModelInputs(stage, Path(config), checkpoints, wind_cache, None)
        return
    given = [flag for flag, value in (("--config", config), ("--wind-cache", wind_cache)) if value is not None]
    given += [f"--stage{n}" for n in sorted(checkpoints)]
    if given:
        raise ConfigError(f"{command}: --bundle replaces {' and '.join(given)}; give one or the other")
    with open_bundle(bundle, store=store) as opened:
        chosen = opened.stage(stage) if needs_stage else stage
        record = {"path": str(opened.path), "sha256": opened.sha256}
        yield ModelInputs(chosen, opened.config, opened.checkpoints, opened.wind_cache, record)
