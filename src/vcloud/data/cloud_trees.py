"""s2cloudless on any torch device: its LightGBM trees as flat tensors and a batched traversal.

Training puts a synthetic cloud on the target date and needs the probability s2cloudless finds
on the clouded image (data/samples.py). LightGBM runs on the CPU only, ~19 us per pixel on one
thread: a 256x256 target costs a DataLoader worker about a second. Here the same booster
(`clouds._detector().classifier.classifier`, 170 trees of up to 770 leaves) is converted once
per process and device into flat node tables, and all (pixel, tree) pairs walk down together,
so the GPU computes the probability where the batch already is.

Exactness, as LightGBM predicts (objective "binary sigmoid:1", every split "<=", no missing
values): LightGBM compares the float32 feature, as a double, with a double threshold; the
threshold is stored here as the largest float32 <= it, which makes the float32 comparison take
the same branch for every float32 input. Leaf values are summed in float64 over the trees and
put through the same sigmoid, so the probabilities agree to ~1e-15 (not bit for bit: the sum's
order and exp() differ).

Not hummingbird-ml (the maintained LightGBM -> torch compiler): it pins onnx<=1.16.1 and pulls
onnx, onnxconverter-common and scikit-learn into the LUMI image, for a traversal of ~50 lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import torch

from vcloud.constants import S2_SCALE
from vcloud.data.store import CLOUD_PROB_SCALE


@dataclass(frozen=True)
class Forest:
    """A LightGBM binary classifier as flat node tables over all trees (one device).

    A leaf points at itself through both children with an infinite threshold, so walking on
    from a leaf stays there.
    """

    feature: torch.Tensor  # (nodes,) int64 split feature (0 at leaves)
    threshold: torch.Tensor  # (nodes,) float32 largest float32 <= LightGBM's double threshold
    children: torch.Tensor  # (2 * nodes,) int64 [2i] left (x <= threshold), [2i + 1] right
    value: torch.Tensor  # (nodes,) float64 leaf output (0 at splits)
    is_leaf: torch.Tensor  # (nodes,) bool
    roots: torch.Tensor  # (trees,) int64
    features: int  # input columns
    sigmoid: float  # probability = 1 / (1 + exp(-sigmoid * sum of leaf values))

    def to(self, device: torch.device | str) -> Forest:
        moved = {
            k: getattr(self, k).to(device) for k in ("feature", "threshold", "children", "value", "is_leaf", "roots")
        }
        return Forest(**moved, features=self.features, sigmoid=self.sigmoid)


def float32_at_or_below(threshold: float) -> np.float32:
    """The largest float32 <= threshold: for float32 x, x <= it exactly when x <= threshold."""
    largest = float(np.finfo(np.float32).max)  # a double: numpy 2 would compare in float32
    if threshold > largest or threshold < -largest:
        return np.float32(largest if threshold > 0 else -np.inf)
    down = np.float32(threshold)
    if float(down) > threshold:
        down = np.nextafter(down, np.float32(-np.inf))
    return down


def forest_from_booster(booster) -> Forest:
    """A lightgbm.Booster (binary, numerical "<=" splits, no missing-value handling) -> Forest."""
    model = booster.dump_model()
    objective = model["objective"].split()
    assert objective[0] == "binary" and objective[1].startswith("sigmoid:"), f"not a binary model: {objective}"
    assert model["num_tree_per_iteration"] == 1 and not model["average_output"], "expected one boosted tree per step"
    trees = model["tree_info"]
    if booster.best_iteration > 0:  # what booster.predict uses by default
        trees = trees[: booster.best_iteration]
    feature, threshold, left, right, value, roots = [], [], [], [], [], []
    for tree in trees:
        assert tree["num_cat"] == 0, f"tree {tree['tree_index']}: categorical splits are not supported"
        roots.append(len(feature))
        stack = [(tree["tree_structure"], None, 0)]  # (node, parent index, side)
        while stack:
            node, parent, side = stack.pop()
            index = len(feature)
            if parent is not None:
                (left if side == 0 else right)[parent] = index
            if "split_index" in node:
                assert node["decision_type"] == "<=", f"tree {tree['tree_index']}: split {node['decision_type']}"
                # With missing_type None LightGBM reads NaN as 0; our inputs have none (checked).
                assert node["missing_type"] == "None", f"tree {tree['tree_index']}: missing {node['missing_type']}"
                feature.append(node["split_feature"])
                threshold.append(float32_at_or_below(node["threshold"]))
                left.append(-1)
                right.append(-1)
                value.append(0.0)
                stack += [(node["right_child"], index, 1), (node["left_child"], index, 0)]
            else:
                feature.append(0)
                threshold.append(np.float32(np.inf))
                left.append(index)
                right.append(index)
                value.append(node["leaf_value"])
    children = np.stack([left, right], axis=1).reshape(-1)
    assert (children >= 0).all(), "a split without both children"
    return Forest(
        feature=torch.tensor(feature, dtype=torch.int64),
        threshold=torch.from_numpy(np.array(threshold, dtype=np.float32)),
        children=torch.from_numpy(children.astype(np.int64)),
        value=torch.tensor(value, dtype=torch.float64),
        is_leaf=torch.from_numpy(children[0::2] == np.arange(len(feature))),
        roots=torch.tensor(roots, dtype=torch.int64),
        features=model["max_feature_idx"] + 1,
        sigmoid=float(objective[1].split(":")[1]),
    )


@cache
def _s2cloudless_on(device: str) -> Forest:
    """The installed s2cloudless model (the one prepare used), converted once per process and device."""
    from vcloud.data.clouds import _detector

    if device == "cpu":
        return forest_from_booster(_detector().classifier.classifier)
    return _s2cloudless_on("cpu").to(device)


def s2cloudless_forest(device: torch.device | str) -> Forest:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _s2cloudless_on(str(device))


def raw_score(forest: Forest, x: torch.Tensor, *, chunk: int | None = None, step: int = 4) -> torch.Tensor:
    """(N, features) float32 -> (N,) float64 sum of leaf values (LightGBM's raw score).

    chunk: pixels walked at once, memory ~100 bytes per pixel and tree (default 2^15 on the CPU,
    2^16 elsewhere: ~1 GB, fewer kernel launches); step: levels walked between drops of the
    (pixel, tree) pairs that reached their leaf (trees are 17 levels deep at the median, 74 at most).
    """
    chunk = chunk or (1 << 15 if x.device.type == "cpu" else 1 << 16)
    assert x.ndim == 2 and x.shape[1] == forest.features, f"expected (N, {forest.features}), got {tuple(x.shape)}"
    assert x.dtype == torch.float32, f"expected float32 features, got {x.dtype}"
    assert not torch.isnan(x).any(), "NaN features: LightGBM would read them as 0"
    out = torch.empty(len(x), dtype=torch.float64, device=x.device)
    for start in range(0, len(x), chunk):
        out[start : start + chunk] = _walk(forest, x[start : start + chunk].contiguous(), step)
    return out


def _walk(forest: Forest, x: torch.Tensor, step: int) -> torch.Tensor:
    pixels, trees = len(x), len(forest.roots)
    flat = x.reshape(-1)
    item = torch.arange(pixels * trees, device=x.device)  # pixel * trees + tree
    row = (item // trees) * forest.features  # where the item's pixel starts in `flat`
    node = forest.roots.repeat(pixels)
    leaf_value = torch.empty(pixels * trees, dtype=torch.float64, device=x.device)
    while len(node):
        for _ in range(step):
            right = flat[row + forest.feature[node]] > forest.threshold[node]
            node = forest.children[2 * node + right]
        done = forest.is_leaf[node]
        leaf_value[item[done]] = forest.value[node[done]]
        walking = ~done
        node, item, row = node[walking], item[walking], row[walking]
    return leaf_value.view(pixels, trees).sum(dim=1)  # in tree order per pixel, deterministic


def predict(forest: Forest, x: torch.Tensor, **kwargs) -> torch.Tensor:
    """(N, features) float32 -> (N,) float64 probability, as booster.predict(x)."""
    return torch.sigmoid(forest.sigmoid * raw_score(forest, x, **kwargs))


def detected_levels(s2: torch.Tensor) -> torch.Tensor:
    """Normalised S2 pixels (N, 13) -> their s2cloudless probability as a store holds it, (N,) uint8.

    The torch twin of samples.detected_probability: the image rounded to the stored reflectance
    (uint16 x10000, then /10000 in float32 as clouds.cloud_probability reads it), the model's
    10 bands, the probability as float32 (as s2cloudless returns it) rounded to 1/250 levels.
    """
    from s2cloudless.utils import MODEL_BAND_IDS

    assert s2.ndim == 2 and s2.shape[1] == 13, f"expected (N, 13) S2 pixels, got {tuple(s2.shape)}"
    reflectance = torch.round(s2.float().clamp(0.0, 1.0) * S2_SCALE).div_(S2_SCALE)  # values of uint16 / 10000
    bands = reflectance[:, list(MODEL_BAND_IDS)].contiguous()
    prob = predict(s2cloudless_forest(s2.device), bands).to(torch.float32)
    return torch.round(prob.clamp_(0.0, 1.0) * CLOUD_PROB_SCALE).to(torch.uint8)
