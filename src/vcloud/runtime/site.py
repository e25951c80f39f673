"""Sites: every fact of one cluster in one file, config/sites/<site>.yaml.

A workflow config names its site in `cluster.site`; the site file's facts (partitions and
their GPUs, how GPUs are asked for, QOS, billing, storage, binds, container libraries, the
collective-communication environment, images per CPU architecture) are the base of the
config's `cluster` section, and its `env` the base of `runtime_env`. What the config's own
section says (the user's account and budget, or a changed fact) lies over them, through the
one override mechanism (vcloud.config.overlay). The user's account never lives in a site file.

Host-side only: no torch, no numpy (snakemake reads it while parsing the Snakefile).
"""

from __future__ import annotations

from pathlib import Path

from vcloud.config.overlay import overlay
from vcloud.config.workflow import load_schema, read_yaml, schema_errors
from vcloud.errors import ConfigError

SITES = Path("config") / "sites"
# The user's, not the site's: a site file naming one of these is refused.
USER_KEYS = ("site", "account", "gpu_hour_budget")


def site_dir(root: Path) -> Path:
    return Path(root) / SITES


def site_names(root: Path) -> list[str]:
    """The shipped sites of the repository at `root`."""
    return sorted(path.stem for path in site_dir(root).glob("*.yaml"))


def site_file(name: str, root: Path) -> Path:
    path = site_dir(root) / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(site_names(root)) or "none"
        raise ConfigError(f"cluster.site: {name!r}: no {SITES / (name + '.yaml')} (sites: {known})")
    return path


def load_site(name: str, root: Path) -> dict:
    """The facts of site `name`, checked against the schema's `cluster` section (key named)."""
    path = site_file(name, root)
    facts = read_yaml(path)
    if not isinstance(facts, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    for key in USER_KEYS:
        if key in facts:
            raise ConfigError(f"{path}: {key} is the user's, not the site's; set cluster.{key} in the run's config")
    if facts.get("name") != name:
        raise ConfigError(f"{path}: name: {facts.get('name')!r}, expected {name!r} (the file's name)")
    schema = _site_schema(root)
    if message := schema_errors(facts, schema):
        raise ConfigError(f"{path}: {message}")
    return facts


def _site_schema(root: Path) -> dict:
    """The workflow schema's `cluster` section without the user's required keys."""
    full = load_schema(Path(root) / "workflow" / "schemas" / "config.schema.yaml")
    cluster = dict(full["properties"]["cluster"])
    cluster["required"] = [key for key in cluster.get("required", []) if key not in USER_KEYS]
    return {**cluster, "$defs": full.get("$defs", {})}


def apply_site(config: dict, root: Path) -> dict:
    """In place: a config whose cluster section names a site gets the site's facts beneath its
    own (cluster section and runtime_env). A config without `cluster.site` is left as it is."""
    section = config.get("cluster")
    if not isinstance(section, dict) or "site" not in section:
        return config
    facts = load_site(str(section["site"]), root)
    env = facts.pop("env", {}) or {}
    config["cluster"] = overlay(facts, section)
    config["runtime_env"] = overlay(env, config.get("runtime_env") or {})
    return config
