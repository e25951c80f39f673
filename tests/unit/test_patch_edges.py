"""No patch edge is special: every stage's model maps a constant image to a constant image.

Issue #27's patch-edge error (docs/patch-edges.md): every 3x3 convolution padded with zeros, so
at the border of a patch a kernel saw a step that exists nowhere inside. The trained kernels
look up more than down (the synthetic set's shadows lie north of their clouds), so the stage-1
and stage-2 drafts erred about twice as much in the top 4 rows as inside, and the autoencoder
drew its first row and its left and right columns wrong. Replicated edges fix it.

The property tested needs no training and holds for any weights: with replicated edges a
constant input stays constant through every layer (convolutions, norms, resampling, the
change gate's reduced resolution, the temporal transformer, the wind mixer), so the outer rows
and columns of the output equal its interior. With zero padding it fails for random weights,
whichever way they look. The edge/interior errors of trained models (which need trained
checkpoints, so no unit test measures them) are in docs/patch-edges.md.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vcloud.constants import SAMPLE_CHANNELS
from vcloud.models.autoencoder import Autoencoder
from vcloud.models.blocks import ReplicateConv2d, replicate_pad
from vcloud.models.cfdt import CFDT
from vcloud.models.refiner import CONDITION_CHANNELS, Refiner
from vcloud.wind.scan_orders import compute_cache

pytestmark = pytest.mark.usefixtures("one_thread")
SIZE = 32  # four coarsest CFDT tokens per side
EDGE = 4  # the outer rows and columns the issue measures


@torch.no_grad()
def with_random_weights(model: nn.Module) -> nn.Module:
    """Every weight drawn at random (the zero-initialised output heads too, so every path
    carries signal): the property must hold whatever training makes of the kernels."""
    torch.manual_seed(0)
    for module in model.modules():
        if isinstance(module, (nn.Conv1d, nn.Conv2d)):
            nn.init.normal_(module.weight, std=0.3 / module.weight[0].numel() ** 0.5)
            if module.bias is not None:
                nn.init.normal_(module.bias, std=0.05)
    return model.eval()


def constant_image(batch: int, channels: int, *, seed: int) -> torch.Tensor:
    """(B, C, SIZE, SIZE): one random value per sample and channel, the same at every pixel."""
    values = torch.rand(batch, channels, 1, 1, generator=torch.Generator().manual_seed(seed))
    return values.expand(batch, channels, SIZE, SIZE).contiguous()


def assert_constant(name: str, out: torch.Tensor) -> None:
    """out (B, C, H, W) is the same at every pixel; the message shows which rows and columns differ."""
    h, w = out.shape[-2] // 2, out.shape[-1] // 2
    deviation = (out - out[..., h : h + 1, w : w + 1]).abs()  # (B, C, H, W) against the centre pixel
    scale = out.abs().amax().item()
    rows = [f"{v:.3g}" for v in deviation.amax(dim=(0, 1, 3)).tolist()]  # (H,) worst per row
    cols = [f"{v:.3g}" for v in deviation.amax(dim=(0, 1, 2)).tolist()]  # (W,) worst per column
    assert deviation.amax().item() <= 1e-4 * scale, (
        f"{name}: a constant image does not stay constant (largest deviation {deviation.amax().item():.3g} of "
        f"output scale {scale:.3g}); per row, first {EDGE} {rows[:EDGE]} last {EDGE} {rows[-EDGE:]}; "
        f"per column, first {EDGE} {cols[:EDGE]} last {EDGE} {cols[-EDGE:]}"
    )


def test_replicate_pad_is_f_pad_replicate_and_keeps_nothing_for_backward():
    x = torch.randn(2, 3, 5, 6, requires_grad=True)
    expected = F.pad(x, (2, 2, 1, 1), mode="replicate")  # (left, right, top, bottom)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        padded = replicate_pad(x, (1, 2))
    assert torch.equal(padded, expected)
    assert saved == [], "replicate_pad keeps a tensor for backward: a padded convolution would store it twice"
    grad = torch.randn_like(padded)
    (mine,) = torch.autograd.grad(padded, x, grad)
    (reference,) = torch.autograd.grad(expected, x, grad)
    torch.testing.assert_close(mine, reference)


def test_replicate_conv_keeps_the_conv2d_state_dict():
    """Checkpoints keep their format: the padding is arithmetic, not a parameter."""
    torch.manual_seed(0)
    plain = nn.Conv2d(4, 6, 3, stride=2, padding=1)
    replicate = ReplicateConv2d(4, 6, 3, stride=2, padding=1)
    replicate.load_state_dict(plain.state_dict())
    x = torch.randn(1, 4, 8, 8)
    assert replicate(x).shape == plain(x).shape
    torch.testing.assert_close(replicate(x)[..., 1:, 1:], plain(x)[..., 1:, 1:])  # only the top/left border differs


def test_autoencoder_keeps_a_constant_image_constant(small):
    model = with_random_weights(Autoencoder(small.stage0.model))
    with torch.no_grad():
        assert_constant("autoencoder (stage 0)", model(constant_image(2, 13, seed=1)))


@pytest.mark.parametrize("sector", [None, 3], ids=["grid-order", "wind-sector"])
def test_cfdt_keeps_a_constant_image_constant(small, sector):
    """Stage 1: every date constant (each its own values), the wind mixer in grid order or along
    a sector's scan, whose first and last tokens lie on the upwind and downwind edges."""
    model = with_random_weights(CFDT(small.stage1.model))
    grid = SIZE // model.downsample
    cache = compute_cache(grid_h=grid, grid_w=grid, sectors=8)
    model.set_wind_orders(torch.from_numpy(cache.orders), torch.from_numpy(cache.inverse))
    b, t = 2, 4
    x = constant_image(b, t * SAMPLE_CHANNELS, seed=2).view(b, t, SAMPLE_CHANNELS, SIZE, SIZE)  # (B, T, 17, H, W)
    days = torch.tensor([[-40.0, 0.0, 25.0, 60.0], [-10.0, 5.0, 30.0, 0.0]])
    target = torch.tensor([1, 3])
    sectors = None if sector is None else torch.tensor([sector, sector + 2])
    with torch.no_grad():
        assert_constant("CFDT (stage 1)", model(x, days, target, sectors))


def test_refiner_keeps_a_constant_image_constant(small):
    """Stages 2 and 3. The output is constant per sub-pixel (the head's channels become 2x2 blocks
    through the pixel shuffle), so it is compared after undoing the shuffle."""
    model = with_random_weights(Refiner(small.stage2.model))
    r_t = constant_image(2, 13, seed=3) * 2 - 1
    cond = constant_image(2, CONDITION_CHANNELS, seed=4)
    with torch.no_grad():
        out = model(r_t, torch.tensor([10, 900]), cond)  # (B, 13, H, W)
    assert_constant("refiner (stages 2-3)", F.pixel_unshuffle(out, model.patch))
