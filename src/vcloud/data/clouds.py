"""Cloud probability with s2cloudless (as the reference loader), cloud cover and cloud class.

The probability is computed once per image; the mask is derived from it with the reference
loader's post-processing (average over a disk of 4 px, threshold 0.4, dilation of 2 px).
s2cloudless needs the 13 Level-1C top-of-atmosphere bands, B10 among them: prepare refuses an
image with a band that is 0 at every pixel (`zero_bands`) rather than compute a mask from it.
A mask that comes with the data (SCL/ or MASK/ of a plain folder) is data/masks.py's.

Cloud class of one image, from its probability map (thresholds in config, data.cloud_classes):
- clear:  cloud cover < clear_max_cover
- opaque: cloud cover >= opaque_min_cover and mean probability over cloudy pixels >= thick_min_prob
- thick:  mean probability over cloudy pixels >= thick_min_prob
- thin:   any other cloudy image (semi-transparent haze and cirrus score lower probabilities)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from vcloud.constants import CLEAR_MAX_COVER, CLOUD_CLASSES, S2_BANDS, S2_SCALE, S2CLOUDLESS_KWARGS


@dataclass(frozen=True)
class CloudThresholds:
    clear_max_cover: float = CLEAR_MAX_COVER
    thick_min_prob: float = 0.7
    opaque_min_cover: float = 0.95

    def __post_init__(self) -> None:
        for name in ("clear_max_cover", "thick_min_prob", "opaque_min_cover"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"data.cloud_classes.{name}: {value} is outside 0..1")


def zero_bands(image: np.ndarray, bands: tuple[str, ...] = S2_BANDS) -> list[str]:
    """Names of the bands of one (C, H, W) S2 image of `bands` that are 0 at every pixel.

    A band of zeros is not a measurement: it is how a Level-2A file (no B10) or a 10-band export
    is padded to 13 bands, and s2cloudless, fed it, calls cloudy dates clear.
    """
    flat = image.reshape(len(image), -1)
    return [bands[i] for i in np.flatnonzero(~flat.any(axis=1))]


@lru_cache(maxsize=1)
def _detector():
    from s2cloudless import S2PixelCloudDetector  # slow import (lightgbm, sentinelhub)

    return S2PixelCloudDetector(**S2CLOUDLESS_KWARGS)


def cloud_probability(s2: np.ndarray, *, num_threads: int = 0) -> np.ndarray:
    """(N, 13, H, W) uint16 reflectance x10000 -> (N, H, W) float32 cloud probability 0..1.

    num_threads: LightGBM's threads (0: its default, every core). Callers that run several
    images in parallel pass 1, so that N workers use N cores, not N x cores.
    """
    assert s2.ndim == 4 and s2.shape[1] == 13, f"expected (N, 13, H, W), got {s2.shape}"
    bands_last = np.clip(np.moveaxis(s2, 1, -1).astype(np.float32) / S2_SCALE, 0.0, 1.0)
    kwargs = {"num_threads": num_threads} if num_threads else {}
    return _detector().get_cloud_probability_maps(bands_last, **kwargs)


def cloud_mask(prob: np.ndarray) -> np.ndarray:
    """(N, H, W) probability -> (N, H, W) uint8 mask with the reference post-processing."""
    return _detector().get_mask_from_prob(prob)


def cloud_cover_and_class(
    prob: np.ndarray, mask: np.ndarray, thresholds: CloudThresholds
) -> tuple[np.ndarray, np.ndarray]:
    """Per image: cloud cover (fraction of masked pixels) and class index into CLOUD_CLASSES."""
    cover = mask.reshape(len(mask), -1).mean(axis=1).astype(np.float32)
    cloudy = mask.astype(bool)
    prob_sum = np.where(cloudy, prob, 0.0).reshape(len(prob), -1).sum(axis=1)
    count = cloudy.reshape(len(mask), -1).sum(axis=1)
    mean_prob = np.divide(prob_sum, count, out=np.zeros_like(prob_sum), where=count > 0)
    classes = np.full(len(prob), CLOUD_CLASSES.index("thin"), dtype=np.int8)
    thick = mean_prob >= thresholds.thick_min_prob
    classes[thick] = CLOUD_CLASSES.index("thick")
    classes[thick & (cover >= thresholds.opaque_min_cover)] = CLOUD_CLASSES.index("opaque")
    classes[cover < thresholds.clear_max_cover] = CLOUD_CLASSES.index("clear")
    return cover, classes
