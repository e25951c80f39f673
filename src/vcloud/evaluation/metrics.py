"""Image metrics as UnCRtainTS defines them, on the S2 0..1 scale, one value per sample.

Inputs are (B, C, H, W) predictions and targets (C = spectral bands). Every function
returns a (B,) tensor: the metric of each sample over all its bands and pixels. A data set's
score is the mean of the per-sample values (MetricAccumulator), as UnCRtainTS averages its
per-image metrics. Half-precision inputs (bf16, fp16) are computed in float32; float64 stays
float64.

    rmse  sqrt(mean((pred - target)^2))
    mae   mean(|pred - target|)
    psnr  20 * log10(1 / rmse)  (data range 1); rmse is floored at 1e-5, so identical
          images score PSNR_CAP = 100 dB instead of infinity
    sam   spectral angle in degrees between the C-band spectra of each pixel, then the mean
          over pixels; the angle between p and t as acos(<p, t> / (|p| |t|)), computed in the
          rounding-stable form 2 * atan2(|u - v|, |u + v|) with u = p / |p|, v = t / |t|, so
          identical spectra give exactly 0 (acos of a rounded 1 - 1e-7 gives ~0.03 degrees in
          float32). Norms are floored at 1e-8: two all-zero spectra give 0, one all-zero
          spectrum against a non-zero one gives 90 (UnCRtainTS: NaN, the sample skipped).
    ssim  gaussian window 11, sigma 1.5, data range 1, K1 0.01, K2 0.03, per band, mean over
          bands and pixels. The border is where definitions differ (`padding`):
          "zeros" (default): UnCRtainTS's pytorch_ssim. The window is centred on every pixel
              and the image zero-padded, so border pixels count and their window statistics
              include zeros that both images share. We report this one to stay comparable
              with published UnCRtainTS numbers.
          "reflect": same output size, reflected border; torchmetrics >= 1.4.2
              (structural_similarity_index_measure with gaussian_kernel, sigma 1.5).
          "valid": only pixels whose window lies inside the image (skimage, torchmetrics
              < 1.4.2); needs H, W >= 11.
          torchmetrics also clamps negative variances (rounding) to 0; we do not, as UnCRtainTS.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

import torch
import torch.nn.functional as F

METRICS = ("psnr", "ssim", "sam", "mae", "rmse")
PSNR_CAP = 100.0  # dB, reached when rmse <= 1e-5
_RMSE_FLOOR = 10 ** (-PSNR_CAP / 20)
_NORM_FLOOR = 1e-8

SSIM_WINDOW = 11
SSIM_SIGMA = 1.5
SSIM_K1 = 0.01
SSIM_K2 = 0.03


def _prepare(pred: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    assert pred.shape == target.shape, f"pred {tuple(pred.shape)} and target {tuple(target.shape)} differ"
    assert pred.ndim == 4, f"expected (B, C, H, W), got {tuple(pred.shape)}"
    dtype = torch.promote_types(torch.promote_types(pred.dtype, target.dtype), torch.float32)
    return pred.detach().to(dtype), target.detach().to(dtype)


def rmse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    pred, target = _prepare(pred, target)
    return (pred - target).square().mean(dim=(1, 2, 3)).sqrt()  # (B,)


def mae(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    pred, target = _prepare(pred, target)
    return (pred - target).abs().mean(dim=(1, 2, 3))  # (B,)


def psnr(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return 20 * torch.log10(1 / rmse(pred, target).clamp_min(_RMSE_FLOOR))  # (B,)


def _norm(x: torch.Tensor, *, keepdim: bool = False) -> torch.Tensor:
    """Euclidean norm over the band axis (dim 1). A plain sum of squares: 40x faster on the CPU
    than torch.linalg.vector_norm's strided reduction over dim 1, and safe for 0..1 data."""
    return x.square().sum(dim=1, keepdim=keepdim).sqrt()


def sam(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    pred, target = _prepare(pred, target)
    u = pred / _norm(pred, keepdim=True).clamp_min(_NORM_FLOOR)  # (B, C, H, W)
    v = target / _norm(target, keepdim=True).clamp_min(_NORM_FLOOR)
    angle = 2 * torch.atan2(_norm(u - v), _norm(u + v))  # (B, H, W)
    return torch.rad2deg(angle).mean(dim=(1, 2))  # (B,)


def _gaussian_window(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    coords = torch.arange(SSIM_WINDOW, dtype=torch.float64) - SSIM_WINDOW // 2
    window = torch.exp(-coords.square() / (2 * SSIM_SIGMA**2))
    return (window / window.sum()).to(dtype=dtype, device=device)  # (K,)


def _band(size: int, g: torch.Tensor, pad: int) -> torch.Tensor:
    """(size, size + 2 pad - K + 1) matrix of the 1-D convolution with `g` (K taps) of a length
    `size` signal zero-padded by `pad` on each side: out[j] = sum_i in[i] M[i, j]."""
    i = torch.arange(size, device=g.device)[:, None]
    k = i - torch.arange(size + 2 * pad - len(g) + 1, device=g.device)[None, :] + pad  # tap index
    inside = (k >= 0) & (k < len(g))
    return torch.where(inside, g[k.clamp(0, len(g) - 1)], torch.zeros((), dtype=g.dtype, device=g.device))


def _blur(stack: torch.Tensor, g: torch.Tensor, *, dim: int, pad: int) -> torch.Tensor:
    """1-D convolution with the window `g` along `dim` (-1 or -2) of (N, H, W), zero padding `pad`.

    One matrix product with the banded convolution matrix (`_band`): about 3x faster on the CPU
    than a sum of K shifted views, itself 3x faster than F.conv2d with a one-channel 1-D kernel
    (which im2col's a huge batch); the same sums up to float rounding.
    """
    band = _band(stack.shape[dim], g, pad)
    return stack @ band if dim == -1 else torch.matmul(band.T, stack)


def ssim(
    pred: torch.Tensor, target: torch.Tensor, *, padding: Literal["zeros", "reflect", "valid"] = "zeros"
) -> torch.Tensor:
    pred, target = _prepare(pred, target)
    b, c, h, w = pred.shape
    half = SSIM_WINDOW // 2
    if padding not in ("zeros", "reflect", "valid"):
        raise ValueError(f"ssim padding {padding!r} is not 'zeros', 'reflect' or 'valid'")
    if padding == "valid" and min(h, w) < SSIM_WINDOW:
        raise ValueError(f"ssim padding='valid' needs H, W >= {SSIM_WINDOW}, got {h}x{w}")
    if padding == "reflect" and min(h, w) <= half:
        raise ValueError(f"ssim padding='reflect' needs H, W > {half}, got {h}x{w}")
    g = _gaussian_window(pred.dtype, pred.device)
    # The 2-D gaussian is the outer product of g with itself: two 1-D passes, zero padding
    # in each, give the same result as UnCRtainTS's single 11x11 convolution.
    x = pred.reshape(b * c, h, w)
    y = target.reshape(b * c, h, w)
    stack = torch.cat([x, y, x * x, y * y, x * y])  # (5*B*C, H, W)
    if padding == "reflect":
        stack = F.pad(stack[:, None], (half, half, half, half), mode="reflect")[:, 0]
    pad = half if padding == "zeros" else 0
    blurred = _blur(_blur(stack, g, dim=-1, pad=pad), g, dim=-2, pad=pad)
    mu_x, mu_y, xx, yy, xy = blurred.chunk(5)
    var_x = xx - mu_x.square()
    var_y = yy - mu_y.square()
    cov = xy - mu_x * mu_y
    c1, c2 = SSIM_K1**2, SSIM_K2**2  # data range 1
    ssim_map = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x.square() + mu_y.square() + c1) * (var_x + var_y + c2))
    return ssim_map.reshape(b, -1).mean(dim=1)  # (B,)


def compute_all(pred: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every metric per sample: {"psnr", "ssim", "sam", "mae", "rmse"} -> (B,) tensors."""
    pred, target = _prepare(pred, target)
    error = rmse(pred, target)
    return {
        "psnr": 20 * torch.log10(1 / error.clamp_min(_RMSE_FLOOR)),
        "ssim": ssim(pred, target),
        "sam": sam(pred, target),
        "mae": mae(pred, target),
        "rmse": error,
    }


class MetricAccumulator:
    """Sums per-sample metrics over batches (and ranks); `compute()` gives the data set means.

    Sums are float64. Under DDP pass `reduce_fn` (distributed.all_reduce_sum_fn(device)): one
    collective sums a (1 + len(names),) tensor of [count, sums...] over ranks, so ranks that
    saw different numbers of samples still give the exact global mean. NaN values are not
    skipped: a NaN metric means something is broken and should show.
    """

    def __init__(self, names: tuple[str, ...] = METRICS) -> None:
        self.names = tuple(names)
        self.reset()

    def reset(self) -> None:
        self.count = 0
        self.sums = torch.zeros(len(self.names), dtype=torch.float64)

    def update(self, per_sample: Mapping[str, torch.Tensor]) -> None:
        """Add one batch of per-sample values, e.g. compute_all(pred, target)."""
        values = [per_sample[name].detach().reshape(-1).to("cpu", torch.float64) for name in self.names]
        sizes = {v.numel() for v in values}
        assert len(sizes) == 1, f"metrics have different sample counts: {dict(zip(self.names, map(len, values)))}"
        self.count += sizes.pop()
        self.sums += torch.stack([v.sum() for v in values])

    def compute(self, reduce_fn: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[str, float]:
        """Mean of every metric over all samples added (on all ranks when reduce_fn sums them)."""
        totals = torch.cat([torch.tensor([float(self.count)], dtype=torch.float64), self.sums])
        if reduce_fn is not None:
            totals = reduce_fn(totals).to("cpu", torch.float64)
        count = totals[0].item()
        if count == 0:
            raise ValueError("MetricAccumulator.compute: no samples were added")
        return {name: total / count for name, total in zip(self.names, totals[1:].tolist())}
