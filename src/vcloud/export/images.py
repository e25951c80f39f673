"""Quicklooks as 8-bit images with fixed, documented stretches, written as deterministic PNG.

Every stretch is a constant: the same array always gives the same bytes, and images of
different samples and stages can be compared by eye.

- true colour: B4, B3, B2 reflectance (S2 0..1 scale) mapped linearly from 0..TRUE_COLOUR_MAX
  to 0..255, clipped (bright clouds saturate to white);
- cloud probability: 0..1 as black..white;
- S1 VV: the normalised backscatter (0..1 = -25..0 dB) as black..white;
- error: mean absolute error over the 13 bands, 0..ERROR_MAX through a dark-to-yellow ramp.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vcloud.bands import rgb_indices
from vcloud.constants import S2_BANDS

TRUE_COLOUR_MAX = 0.3  # reflectance shown as full white
ERROR_MAX = 0.1  # mean |error| shown as the ramp's top colour
STRETCH_NOTE = (
    f"true colour = B4, B3, B2 reflectance 0..{TRUE_COLOUR_MAX} stretched linearly to 0..255 (clipped); "
    "cloud probability 0..1 and S1 VV -25..0 dB as black..white; "
    f"error = mean |output - truth| over the 13 bands, 0..{ERROR_MAX} dark to yellow"
)
# Anchors of the error ramp (value 0..1 -> RGB), close to matplotlib's "inferno".
_RAMP = np.array([[0, 0, 4], [87, 16, 110], [188, 55, 84], [249, 142, 9], [252, 255, 164]], dtype=np.float64)


def to_uint8(values: np.ndarray) -> np.ndarray:
    """0..1 floats -> 0..255 bytes, rounded half to even (numpy's rule, same on every machine)."""
    return np.round(np.clip(np.nan_to_num(values, nan=0.0), 0.0, 1.0) * 255.0).astype(np.uint8)


def true_colour(s2: np.ndarray, bands: tuple[str, ...] = S2_BANDS) -> np.ndarray:
    """(C, H, W) S2 of `bands` on the 0..1 scale -> (H, W, 3) uint8 (B4, B3, B2)."""
    assert s2.ndim == 3 and s2.shape[0] == len(bands), f"expected ({len(bands)}, H, W), got {s2.shape}"
    rgb = s2[list(rgb_indices(bands))].astype(np.float64) / TRUE_COLOUR_MAX
    return to_uint8(rgb).transpose(1, 2, 0)


def grey(values: np.ndarray) -> np.ndarray:
    """(H, W) 0..1 -> (H, W, 3) uint8."""
    return np.repeat(to_uint8(values.astype(np.float64))[..., None], 3, axis=-1)


def error_map(pred: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """(13, H, W) prediction and truth -> (H, W, 3) uint8 of the band-mean |error|."""
    error = np.abs(pred.astype(np.float64) - truth.astype(np.float64)).mean(axis=0)
    position = np.clip(error / ERROR_MAX, 0.0, 1.0) * (len(_RAMP) - 1)
    low = np.minimum(position.astype(np.int64), len(_RAMP) - 2)
    frac = (position - low)[..., None]
    rgb = _RAMP[low] * (1.0 - frac) + _RAMP[low + 1] * frac
    return np.round(rgb).astype(np.uint8)


def strip(tiles: list[np.ndarray], *, gap: int = 2) -> np.ndarray:
    """(H, W, 3) tiles side by side with a white gap between them."""
    assert tiles, "a strip needs at least one tile"
    height = tiles[0].shape[0]
    parts = []
    for i, tile in enumerate(tiles):
        if i:
            parts.append(np.full((height, gap, 3), 255, np.uint8))
        parts.append(tile)
    return np.concatenate(parts, axis=1)


def upscale(image: np.ndarray, factor: int) -> np.ndarray:
    """Nearest-neighbour enlargement (pixels stay pixels)."""
    return image.repeat(factor, axis=0).repeat(factor, axis=1) if factor > 1 else image


def write_png(path: Path, image: np.ndarray) -> None:
    """(H, W, 3) uint8 -> PNG without timestamps or text chunks: same pixels, same bytes."""
    from PIL import Image

    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3, image.shape
    Image.fromarray(np.ascontiguousarray(image), mode="RGB").save(path, format="PNG", compress_level=9)
