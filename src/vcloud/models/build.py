"""The networks of a model set, built for its band set (vcloud.bands.model_bands).

With the 13 L1C bands they are exactly the constructors' defaults; with n bands the autoencoder
and the refiner take n channels, the CFDT n + 4 (S1, S1 validity, cloud probability) in and n out.
"""

from __future__ import annotations

from vcloud.bands import model_bands
from vcloud.constants import EXTRA_CHANNELS
from vcloud.models.autoencoder import Autoencoder
from vcloud.models.cfdt import CFDT
from vcloud.models.refiner import Refiner, condition_channels


def build_autoencoder(cfg, model=None) -> Autoencoder:
    """Stage 0's network; `model`: another section's model config of the same kind."""
    return Autoencoder(model or cfg.stage0.model, in_channels=len(model_bands(cfg)))


def build_cfdt(cfg, model=None) -> CFDT:
    bands = len(model_bands(cfg))
    return CFDT(model or cfg.stage1.model, in_channels=bands + EXTRA_CHANNELS, out_channels=bands)


def build_refiner(cfg, model=None) -> Refiner:
    bands = len(model_bands(cfg))
    return Refiner(model or cfg.stage2.model, channels=bands, cond_channels=condition_channels(bands))
