"""Workflow configuration (config/config.yaml, config/lumi.yaml): validation against the JSON
schema with errors that name the key, schema defaults, and the embedded defaults of a module."""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path

import yaml

from vcloud.errors import ConfigError

# libyaml's parser where PyYAML has it (its wheels do): the same safe constructor, about 10x
# faster than the pure-Python one. The schema is 0.2 s of pure-Python parsing, and snakemake
# reads it at every start, in every SLURM job.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_yaml(text: str):
    """yaml.safe_load, with libyaml where available."""
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader


def load_schema(path: Path) -> dict:
    """The JSON schema in `path`, parsed once per process (and file version): read it, never
    change it."""
    path = Path(path).resolve()
    return _schema(str(path), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _schema(path: str, mtime_ns: int) -> dict:
    return parse_yaml(Path(path).read_text())


# Keys that were renamed: the error says what replaced them.
RENAMED_KEYS = {"resources.evaluate": "resources.evaluate_stage0..3, one entry per rule"}


def key_path(parts) -> str:
    return ".".join(str(p) for p in parts) or "<top level>"


def validate_config(config: dict, schema_path: Path, *, source: str = "config") -> None:
    """Raise ConfigError with one line naming the first offending key, or return None."""
    schema = load_schema(schema_path)
    if message := schema_errors(config, schema):
        raise ConfigError(f"{source}: {message}")


def schema_errors(instance, schema: dict) -> str | None:
    """One line naming the first key of `instance` that `schema` refuses, or None."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(instance), key=lambda e: (list(e.absolute_path), e.message))
    if not errors:
        return None
    err = jsonschema.exceptions.best_match(errors)
    for candidate in errors:  # a renamed key explains the "missing" new one: name it first
        if candidate.validator == "additionalProperties" and any(
            key_path([*candidate.absolute_path, k]) in RENAMED_KEYS for k in candidate.instance
        ):
            err = candidate
    where = list(err.absolute_path)
    if err.validator == "additionalProperties":
        known = set(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - known)
        keys = ", ".join(key_path([*where, k]) for k in extra)
        renamed = [f"{k} is now {RENAMED_KEYS[k]}" for k in keys.split(", ") if k in RENAMED_KEYS]
        message = (
            f"unknown key {keys} ({'; '.join(renamed)})"
            if renamed
            else (f"unknown key {keys} (allowed: {', '.join(sorted(known))})")
        )
    elif err.validator == "required":
        missing = [k for k in err.validator_value if k not in err.instance]
        message = f"missing key {', '.join(key_path([*where, k]) for k in missing)}"
    else:
        message = f"key {key_path(where)}: {err.message}"
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return message + more


def fill_missing(config: dict, defaults_path: Path) -> dict:
    """Add every key of the YAML file `defaults_path` that `config` lacks, recursively, in place.

    Snakemake ignores a module's own `configfile:`, so a workflow that uses vcloud as a module
    passes only the keys it changes; the rest come from config/config.yaml as in a plain run.
    """

    def merge(target: dict, defaults: dict) -> None:
        for key, value in defaults.items():
            if key not in target:
                target[key] = value
            elif isinstance(target[key], dict) and isinstance(value, dict):
                merge(target[key], value)

    merge(config, read_yaml(defaults_path) or {})
    return config


STAGE_RULE = re.compile(r"(train|evaluate)_stage(\d+)")


def fill_stage_resources(config: dict) -> dict:
    """Give every stage's rules (registry: train_stage<n>, evaluate_stage<n>) their resources
    entry, in place: the registry's default for this kind of run (cluster or local), updated key
    by key by the config's own entry. Before validate_config: an entry may then name only what
    it changes. ConfigError for an entry of a stage the registry does not know."""
    from vcloud.registry import STAGE_NUMBERS, stage_resources

    given = config.get("resources")
    if not isinstance(given, dict):
        return config  # validate_config names it
    for key in given:
        match = STAGE_RULE.fullmatch(str(key))
        if match and int(match.group(2)) not in STAGE_NUMBERS:
            known = ", ".join(map(str, STAGE_NUMBERS))
            raise ConfigError(f"resources.{key}: no stage {match.group(2)} in the registry (stages: {known})")
    if all(isinstance(entry, dict) for entry in given.values()):
        given.update(stage_resources(config))
        for rule, entry in rehearsal_resources(config).items():
            given[rule] = {**entry, **(given.get(rule) or {})}
    return config


def rehearsal_resources(config: dict) -> dict[str, dict]:
    """The rehearsal's own rules on a cluster (rehearsal.enabled): the transport step on every
    GPU of one node of the site's rehearsal partition (within its QOS), the summary a local rule."""
    from vcloud.registry import DEFAULT_RESOURCES, site_gpu_defaults

    section = config.get("cluster") or {}
    rehearsal = config.get("rehearsal") or {}
    if not section or not rehearsal.get("enabled"):
        return {}
    placement = section.get("placement") or {}
    partition = placement.get("rehearsal") or placement.get("gpu") or "dev-g"
    part = (section.get("partitions") or {}).get(partition) or {}
    gpus = part.get("gpus_per_node") or 1
    qos = (section.get("qos") or {}).get(placement.get("rehearsal_qos") or "") or {}
    if qos.get("max_gpus"):
        gpus = min(gpus, qos["max_gpus"])
    # A stage rule's per-GPU memory and cores on this site (the registry's defaults, the site's
    # gpu_rules over them), on every GPU of one rehearsal node.
    base = {key: DEFAULT_RESOURCES["train"]["cluster"][key] for key in ("mem_mb_per_gpu", "threads")}
    transport = {**base, "cpus_per_gpu": base["threads"], **site_gpu_defaults(section)}
    transport.update(runtime=rehearsal.get("transport_minutes", 4), partition=partition, gpus=gpus)
    if placement.get("rehearsal_qos"):
        transport["qos"] = placement["rehearsal_qos"]
    summary = {"runtime": 15, "mem_mb": 2000, "threads": 1}  # a local rule: where snakemake runs
    return {"rehearse_transport": transport, "rehearsal_summary": summary}


def fill_defaults(config: dict, schema_path: Path) -> dict:
    """Set every schema `default` missing from config, in place (after validate_config)."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    check_properties = base.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:  # a copy: the schema is shared
                    instance[name] = copy.deepcopy(sub["default"])
        yield from check_properties(validator, properties, instance, schema)

    filler = jsonschema.validators.extend(base, {"properties": set_defaults})
    schema = load_schema(schema_path)
    for _ in filler(schema).iter_errors(config):
        pass
    return config


def read_yaml(path: Path, *, missing: str = "no such file"):
    """The YAML document in path; ConfigError naming the file when absent or unparsable."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: {missing}")
    try:
        return parse_yaml(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
