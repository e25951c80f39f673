"""Facts about SEN12MS-CR-TS and the prepared store, and the memory margin every GPU check
keeps, defined once for the whole package."""

from __future__ import annotations

# Sentinel-2 L1C bands in file order (13); s2cloudless expects exactly this order.
S2_BANDS: tuple[str, ...] = ("B1", "B2", "B3", "B4", "B5", "B6", "B7", "B8", "B8A", "B9", "B10", "B11", "B12")
# Sentinel-1 GRD backscatter in dB.
S1_BANDS: tuple[str, ...] = ("VV", "VH")
# The sample tensor x (B, T, C, H, W) holds per date the S2 bands, then the S1 bands, then whether
# the date has S1, then the cloud probability: C = 13 + 2 + 1 + 1 with the 13 L1C bands, and
# len(bands) + 4 with another band set (vcloud.bands). Models predict the S2 bands, (B, 13, H, W).
# A date without S1 has zeros in S1_CHANNELS and 0 in S1_VALID_CHANNEL: the model is told, rather
# than shown a fill value that looks like backscatter (-25 dB, open water). The channels are
# counted from the end, so that the same indices hold for every band set.
EXTRA_CHANNELS = len(S1_BANDS) + 2  # per date after the S2 bands: S1, S1 validity, cloud probability
S2_CHANNELS = slice(0, -EXTRA_CHANNELS)  # x[:, :, S2_CHANNELS]: reflectances 0..1
S1_CHANNELS = slice(-EXTRA_CHANNELS, -2)  # backscatter 0..1
S1_VALID_CHANNEL = -2  # x[:, :, S1_VALID_CHANNEL]: 1 where the date has S1, else 0
CLOUD_CHANNEL = -1  # x[:, :, CLOUD_CHANNEL]: cloud probability 0..1 (an index, drops C)
SAMPLE_CHANNELS = len(S2_BANDS) + EXTRA_CHANNELS  # C of x with the 13 L1C bands
OUTPUT_CHANNELS = len(S2_BANDS)  # C of a prediction and of the target with the 13 L1C bands
# Index of the true-colour bands inside S2_BANDS.
RGB_INDICES: tuple[int, int, int] = (3, 2, 1)  # B4, B3, B2

N_TIMES = 30  # dates per location in the dataset
PATCH_SIZE = 256  # pixels per side of a raw patch

# Normalisation of the reference loader (UnCRtainTS): S2 clipped to 0..10000 then /10000;
# S1 clipped to -25..0 dB then rescaled to 0..1; NaN -> 0 after scaling.
S2_SCALE = 10000.0
S2_CLIP = (0.0, 10000.0)
S1_CLIP_DB = (-25.0, 0.0)

# Cloud detection as in the reference loader.
S2CLOUDLESS_KWARGS = {"threshold": 0.4, "all_bands": True, "average_over": 4, "dilation_size": 2}

CLOUD_CLASSES: tuple[str, ...] = ("clear", "thin", "thick", "opaque")
# An image is clear below this cloud cover (masked fraction). The default of two thresholds
# that may be set apart: data.cloud_classes.clear_max_cover of the workflow config (the class
# written to the store) and data.clear_target_max_cover of a model config (which dates may
# serve as ground truth).
CLEAR_MAX_COVER = 0.05
CLOUD_CLASS_MISSING = -1  # cloud_class value of an image that is missing or bad

STORE_FORMAT_VERSION = 2  # 2: zarr v3 shards (one file per location and image variable), crc32c per chunk
SPLITS: tuple[str, ...] = ("train", "val", "test")

# What the training memory estimate (models/memory.py, runtime/stage_memory.py) leaves out:
# allocator reserve and fragmentation, cuDNN/MIOpen workspaces, the GPU context. On an H100 the
# memory torch reserved was up to 1.17x the estimate (stage 2, full config, docs/performance.md),
# the allocated peak within -8..+4 % of it. A stage fits a GPU when its estimate x this does: the
# doctor refuses the others, `vcloud memory` says which fit and sizes its largest batch by it.
# Here, not beside the estimator, since the doctor runs where torch is not installed.
MEMORY_MARGIN = 1.2
