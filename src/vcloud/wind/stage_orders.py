"""The scan orders a wind-scanning CFDT runs with, for training, evaluation and the viewer."""

from __future__ import annotations

from pathlib import Path

from vcloud.errors import ConfigError


def load_wind_orders(cfg, *, store, wind_cache: Path | None, world_size: int, command: str):
    """The wind cache for a wind-scanning CFDT (None when stage1.model.wind_scan is off), checked
    against the store's whole-patch token grid (training crops scan in the orders restricted to
    their window: models/wind_scan.py). `store`: its path, or the command's open reader.
    `command` names the caller in the error message."""
    model = cfg.stage1.model
    if not model.wind_scan:
        return None
    from vcloud.data.shards import as_reader
    from vcloud.wind.scan_orders import get_scan_orders

    if wind_cache is None and not (model.wind_allow_recompute and world_size == 1):
        raise ConfigError(f"{command}: stage1.model.wind_scan is on; pass --wind-cache FILE")
    _, _, height, width = as_reader(store).shape
    scale = 2 ** (len(model.widths) - 1)  # the CFDT's coarsest level
    return get_scan_orders(
        wind_cache or Path("<no --wind-cache>"),
        grid_h=height // scale,
        grid_w=width // scale,
        sectors=model.wind_sectors,
        world_size=world_size,
        allow_recompute=model.wind_allow_recompute,
    )
