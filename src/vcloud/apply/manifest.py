"""`--out/manifest.json` of `vcloud predict`: provenance, the request, and per output its status,
files and their SHA-256.

A rerun takes an output as finished only when the manifest records it as done for the same
request (same stage, weights, config, store, settings: `request_id`), made from the input dates
the plan chooses now, and every one of its files is there with the recorded checksum; anything
else is made again. While a run goes on the manifest is `manifest.partial.json`, rewritten whole
(atomically) after every batch, so it never claims a file that is not complete on disk;
`manifest.json` appears only when every output and mosaic is made (the workflow's declared
output: it exists only for a complete run).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from vcloud.apply.geo import sha256_file
from vcloud.io import atomic_write_json

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
PARTIAL = "manifest.partial.json"
FORMAT = "vcloud-predictions"
FORMAT_VERSION = 1


def request_id(request: dict) -> str:
    """What makes an output's bytes: a hash of the request (paths left out: files are named by checksum)."""
    text = json.dumps(request, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_manifest(out: Path) -> dict:
    """The manifest a previous run left in `out`, or {} (none, unreadable, or not ours: all is redone)."""
    path = Path(out) / PARTIAL
    if not path.is_file():
        path = Path(out) / MANIFEST
    if not path.is_file():
        return {}
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        log.warning("%s: unreadable (%s); every output is made again", path, err)
        return {}
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        log.warning("%s: not a vcloud predict manifest; every output is made again", path)
        return {}
    return manifest


def is_finished(entry: dict | None, out: Path, rid: str, *, made_from: dict | None = None) -> bool:
    """True when `entry` is done for request `rid`, made from what `made_from` (the plan's record
    of the output: input dates, S1) says, and each of its files has its recorded checksum."""
    if not entry or entry.get("status") != "done" or entry.get("request_id") != rid:
        return False
    if made_from is not None and any(entry.get(key) != value for key, value in made_from.items()):
        return False  # an earlier plan chose other inputs (e.g. before S2-only dates were inputs)
    for record in entry.get("files", {}).values():
        path = Path(out) / record["path"]
        if not path.is_file() or sha256_file(path) != record["sha256"]:
            return False
    return True


def file_record(out: Path, path: Path) -> dict:
    return {"path": Path(path).relative_to(out).as_posix(), "sha256": sha256_file(path)}


def write_manifest(out: Path, manifest: dict, *, final: bool = False) -> None:
    """The partial manifest during a run; with `final` the complete one, the partial removed."""
    atomic_write_json(Path(out) / (MANIFEST if final else PARTIAL), manifest, indent=1, sort_keys=False)
    if final:
        (Path(out) / PARTIAL).unlink(missing_ok=True)
