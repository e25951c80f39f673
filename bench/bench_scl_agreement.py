"""How far s2cloudless's mask and the scene classification (SCL) agree on a real series.

    python bench/bench_scl_agreement.py --scl SCL.npy --prob CLP.npy

SCL.npy: (T, H, W[, 1]) Sen2Cor class codes; CLP.npy: (T, H, W[, 1]) s2cloudless probability
0..1 of the same dates and pixels. Each is turned into vcloud's mask exactly as `vcloud prepare`
turns it (data/masks.py: the default SCL table, a pixel cloud from 0.4, as stored; data/clouds.py:
s2cloudless's post-processing, averaged over 4 px, threshold 0.4, dilated by 2 px), and cover
and class as data.cloud_classes' defaults give them. Prints one JSON object: per-image pixel
agreement (mean, lowest), mean cover of each, their correlation, and images each calls clear.

A real series that carries both: eo-learn's test patch (github.com/sentinel-hub/eo-learn, MIT,
commit 0fcaca8bbd28, example_data/TestEOPatch/mask/SCL.npy and data/CLP.npy: 36 Sentinel-2 L1C
dates, 101 x 100 px at 10 m, UTM 33N; CLP is Sentinel Hub's s2cloudless probability
of the L1C bands, SCL Sen2Cor's classification of the same dates).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from vcloud.data.clouds import CloudThresholds, cloud_cover_and_class, cloud_mask
from vcloud.data.masks import SCL_CLOUD_PROB, supplied_mask
from vcloud.data.store import CLOUD_PROB_SCALE


def measure(scl: np.ndarray, prob: np.ndarray) -> dict:
    """scl (T, H, W) codes, prob (T, H, W) s2cloudless probability -> the agreement figures."""
    thresholds = CloudThresholds()
    lookup = np.zeros(256, np.float32)
    for code, value in SCL_CLOUD_PROB.items():
        lookup[code] = value
    scl_prob = np.round(lookup[scl.astype(np.uint8)] * CLOUD_PROB_SCALE) / np.float32(CLOUD_PROB_SCALE)
    ours, theirs = supplied_mask(scl_prob), cloud_mask(prob.astype(np.float32))
    agree = (ours == theirs).reshape(len(ours), -1).mean(axis=1)
    cover_scl, class_scl = cloud_cover_and_class(scl_prob, ours, thresholds)
    cover_s2c, class_s2c = cloud_cover_and_class(prob.astype(np.float32), theirs, thresholds)
    both = (ours == 1) & (theirs == 1)
    either = (ours == 1) | (theirs == 1)
    return {
        "images": len(scl),
        "pixels_per_image": int(scl[0].size),
        "pixel_agreement_mean": round(float(agree.mean()), 3),
        "pixel_agreement_lowest": round(float(agree.min()), 3),
        "cloud_iou_all_pixels": round(float(both.sum() / max(either.sum(), 1)), 3),
        "mean_cover_scl": round(float(cover_scl.mean()), 3),
        "mean_cover_s2cloudless": round(float(cover_s2c.mean()), 3),
        "cover_correlation": round(float(np.corrcoef(cover_scl, cover_s2c)[0, 1]), 3),
        "clear_images_scl": int((class_scl == 0).sum()),
        "clear_images_s2cloudless": int((class_s2c == 0).sum()),
        "same_class": int((class_scl == class_s2c).sum()),
        "scl_codes_present": sorted(int(v) for v in np.unique(scl)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scl", type=Path, required=True, help="(T, H, W[, 1]) SCL codes, .npy")
    parser.add_argument("--prob", type=Path, required=True, help="(T, H, W[, 1]) s2cloudless probability, .npy")
    args = parser.parse_args()
    scl, prob = (np.load(path, allow_pickle=False) for path in (args.scl, args.prob))
    scl, prob = (a[..., 0] if a.ndim == 4 else a for a in (scl, prob))
    assert scl.shape == prob.shape, f"SCL {scl.shape} and probability {prob.shape} differ"
    print(json.dumps({"scl": str(args.scl), "prob": str(args.prob), **measure(scl, prob)}, indent=2))


if __name__ == "__main__":
    main()
