"""Reading checkpoints and a finished stage's weights: what training, evaluation, `vcloud
predict` and the viewer all need, without importing training (train/checkpoint.py writes them).

A checkpoint is one dict saved with torch.save, read back with torch.load(weights_only=True):
nothing in it needs pickle to load (layout: train/checkpoint.py).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from vcloud.errors import BadInputError

FORMAT_VERSION = 1


def load_checkpoint(path: Path, *, mmap: bool = False) -> dict:
    """Read a checkpoint onto the CPU without pickle; BadInputError (one line) if unusable.

    `mmap=True` maps tensors lazily instead of reading them (cheap when only the meta is needed).
    """
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"{path}: checkpoint not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as err:  # truncated zip, foreign pickle, I/O error: all mean "unusable"
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise BadInputError(f"{path}: not a readable checkpoint ({type(err).__name__}: {first})") from None
    if not isinstance(state, dict) or "format_version" not in state:
        raise BadInputError(f"{path}: not a vcloud checkpoint (no format_version)")
    version = state["format_version"]
    if version != FORMAT_VERSION:
        raise BadInputError(
            f"{path}: checkpoint format_version {version!r}, this vcloud reads {FORMAT_VERSION}; "
            "delete the file to start this stage fresh"
        )
    return state


def load_stage_weights(path: Path, *, stage: int) -> dict:
    """The weights of stage `stage`'s checkpoint at `path`; another stage's file is refused in one line."""
    state = load_checkpoint(path)
    if state.get("stage") != stage:
        raise BadInputError(f"{path}: checkpoint of stage {state.get('stage')}, expected stage {stage}")
    return state["model"]


def load_frozen(model: nn.Module, path: Path, *, stage: int) -> nn.Module:
    """Weights from a finished stage's best.pt, frozen and in eval mode."""
    model.load_state_dict(load_stage_weights(path, stage=stage))
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model
