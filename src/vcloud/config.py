"""Workflow configuration: validation against the JSON schema with errors that name the key."""

from __future__ import annotations

from pathlib import Path

import yaml

from vcloud.errors import ConfigError


def key_path(parts) -> str:
    return ".".join(str(p) for p in parts) or "<top level>"


def validate_config(config: dict, schema_path: Path, *, source: str = "config") -> None:
    """Raise ConfigError with one line naming the first offending key, or return None."""
    import jsonschema

    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: (list(e.absolute_path), e.message))
    if not errors:
        return
    err = jsonschema.exceptions.best_match(errors)
    where = list(err.absolute_path)
    if err.validator == "additionalProperties":
        known = set(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - known)
        keys = ", ".join(key_path([*where, k]) for k in extra)
        message = f"unknown key {keys} (allowed: {', '.join(sorted(known))})"
    elif err.validator == "required":
        missing = [k for k in err.validator_value if k not in err.instance]
        message = f"missing key {', '.join(key_path([*where, k]) for k in missing)}"
    else:
        message = f"key {key_path(where)}: {err.message}"
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    raise ConfigError(f"{source}: {message}{more}")

