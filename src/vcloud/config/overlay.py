"""One override mechanism: a mapping changed key by key by another (site facts by a run's
cluster section, a model config by a derived config's changes).

Mappings merge recursively; any other value, lists included, replaces the base's. With
`strict`, a key the base does not have is refused in one line naming its path: an override
can change what exists, never invent a key that nothing reads.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

from vcloud.errors import ConfigError


def overlay(base: Mapping, changes: Mapping, *, where: str = "", strict: bool = False) -> dict:
    """A new mapping: `base` with `changes` applied (neither is modified)."""
    out = copy.deepcopy(dict(base))
    for key, value in changes.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in out:
            if strict:
                known = ", ".join(sorted(map(str, out))) or "none"
                raise ConfigError(f"{path}: no such key to override (known here: {known})")
            out[key] = copy.deepcopy(value)
        elif isinstance(out[key], Mapping) and isinstance(value, Mapping):
            out[key] = overlay(out[key], value, where=path, strict=strict)
        else:
            out[key] = copy.deepcopy(value)
    return out
