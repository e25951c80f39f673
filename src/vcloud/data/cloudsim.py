"""Synthetic clouds put on a clear date: the ground truth stays, the input gets clouds.

Used for stage-1 training (curriculum by class) and for the fixed evaluation protocol
(seeded clouds on clear dates). Works on normalised S2 (0..1), numpy only.

- thin:   semi-transparent haze over most of the image, opacity 0.15..0.45;
- thick:  opaque cumulus blobs over 20..70 % of the image, with a darkened shadow offset;
- opaque: the whole image under cloud (opacity >= 0.9 everywhere).
"""

from __future__ import annotations

import numpy as np

from vcloud.constants import CLOUD_CLASSES, S2_BANDS

# Top-of-atmosphere reflectance of a thick cloud per band (0..1 scale, S2_BANDS order).
CLOUD_SPECTRUM = np.array([0.52, 0.50, 0.49, 0.48, 0.49, 0.50, 0.51, 0.51, 0.515, 0.26, 0.05, 0.33, 0.21], np.float32)
SHADOW_PROB = 0.5  # what a simulated shadow is marked with where the mask comes with the data (SCL's shadow)


def cloud_spectrum(bands: tuple[str, ...] = S2_BANDS) -> np.ndarray:
    """The thick cloud's reflectance in the order of `bands` (a band set of vcloud.bands).

    The same reflectances for Level-2A as for Level-1C: atmospheric correction is made for the
    ground, not for clouds, and changes a thick cloud's reflectance far less than its ground's.
    """
    return CLOUD_SPECTRUM[[S2_BANDS.index(band) for band in bands]]


def simulated_probability(opacity: np.ndarray, shadow: np.ndarray) -> np.ndarray:
    """(H, W) cloud probability 0..1 of a simulated cloud, as a mask that comes with the data marks
    it: its opacity, and at least SHADOW_PROB under its shadow. Used where no detector runs (a store
    whose mask is SCL's or the user's: s2cloudless there would mix two detectors, or cannot run)."""
    return np.maximum(opacity, np.where(shadow > 0, np.float32(SHADOW_PROB), np.float32(0.0))).clip(0.0, 1.0)


CURRICULUM = {
    "thin_only": ("thin",),
    "mixed": ("thin", "thick"),
    "all": ("thin", "thick", "opaque"),
}


def curriculum_phase(epoch: int, epochs: int, *, mixed_from: float, all_from: float) -> str:
    """thin_only, mixed or all for this epoch (boundaries are fractions of all epochs)."""
    fraction = epoch / max(epochs, 1)
    if fraction < mixed_from:
        return "thin_only"
    return "mixed" if fraction < all_from else "all"


def smooth_field(rng: np.random.Generator, size: tuple[int, int], *, scale: int) -> np.ndarray:
    """A smooth random field in 0..1: low-resolution noise, bilinearly upsampled."""
    h, w = size
    coarse = rng.random((max(2, h // scale + 2), max(2, w // scale + 2))).astype(np.float32)
    ys = np.linspace(0, coarse.shape[0] - 1.001, h, dtype=np.float32)
    xs = np.linspace(0, coarse.shape[1] - 1.001, w, dtype=np.float32)
    y0, x0 = ys.astype(int), xs.astype(int)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    top = coarse[y0][:, x0] * (1 - fx) + coarse[y0][:, x0 + 1] * fx
    bottom = coarse[y0 + 1][:, x0] * (1 - fx) + coarse[y0 + 1][:, x0 + 1] * fx
    field = top * (1 - fy) + bottom * fy
    field -= field.min()
    return field / max(float(field.max()), 1e-6)


def simulate(rng: np.random.Generator, size: tuple[int, int], kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(opacity, shadow) maps in 0..1 for one synthetic cloud of class `kind`; "clear": none (the
    target date stays as observed; nothing is drawn from `rng`)."""
    assert kind in CLOUD_CLASSES, f"kind must be clear, thin, thick or opaque, got {kind!r}"
    h, w = size
    if kind == "clear":
        return np.zeros(size, np.float32), np.zeros(size, np.float32)
    scale = max(4, min(h, w) // 4)
    field = smooth_field(rng, size, scale=scale)
    shadow = np.zeros(size, np.float32)
    if kind == "thin":
        opacity = (0.15 + 0.30 * rng.random()) * (0.6 + 0.4 * field)
    elif kind == "thick":
        cover = 0.2 + 0.5 * rng.random()
        threshold = np.quantile(field, 1.0 - cover)
        opacity = np.clip((field - threshold) / 0.05, 0.0, 1.0)
        dy, dx = (int(v) for v in rng.integers(-max(1, h // 8), max(2, h // 8), size=2))
        shadow = np.roll(opacity, (dy, dx), axis=(0, 1)) * (1.0 - opacity)
    else:
        opacity = 0.9 + 0.1 * field
    return opacity.astype(np.float32), shadow.astype(np.float32)


def apply(
    s2: np.ndarray, opacity: np.ndarray, shadow: np.ndarray, *, spectrum: np.ndarray = CLOUD_SPECTRUM
) -> np.ndarray:
    """Blend a cloud into normalised S2 (C, H, W): ground * (1 - a) * shade + cloud * a, with the
    cloud's `spectrum` (C,) in the image's bands (cloud_spectrum)."""
    shade = 1.0 - 0.5 * shadow
    cloudy = s2 * ((1.0 - opacity) * shade)[None] + spectrum[:, None, None] * opacity[None]
    return np.clip(cloudy, 0.0, 1.0).astype(np.float32)
