"""Metrics: hand-computed values, agreement with torchmetrics where definitions match."""

from __future__ import annotations

import math

import pytest
import torch
import torchmetrics
from torchmetrics.functional.image import (
    peak_signal_noise_ratio,
    spectral_angle_mapper,
    structural_similarity_index_measure,
)

from vcloud.evaluation import metrics as m

C1, C2 = 0.01**2, 0.03**2


def _pair(*, b=3, c=4, h=24, w=28, noise=0.1, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    target = torch.rand(b, c, h, w, generator=gen, dtype=dtype) * 0.9 + 0.05
    pred = (target + noise * torch.randn(b, c, h, w, generator=gen, dtype=dtype)).clamp(0.01, 1)
    return pred, target


def test_constant_offset_gives_hand_values():
    target = torch.rand(2, 3, 16, 16, dtype=torch.float64) * 0.8
    values = m.compute_all(target + 0.1, target)
    for key, expected in {"rmse": 0.1, "mae": 0.1, "psnr": 20.0}.items():
        assert values[key].shape == (2,)
        torch.testing.assert_close(values[key], torch.full((2,), expected, dtype=torch.float64))


def test_identical_images_score_perfectly_and_psnr_is_capped():
    target = torch.rand(2, 13, 16, 16)
    values = m.compute_all(target, target.clone())
    assert torch.equal(values["sam"], torch.zeros(2))  # exactly, even in float32
    torch.testing.assert_close(values["ssim"], torch.ones(2))
    assert torch.equal(values["rmse"], torch.zeros(2)) and torch.equal(values["mae"], torch.zeros(2))
    torch.testing.assert_close(values["psnr"], torch.full((2,), m.PSNR_CAP))


def test_sam_hand_angles_in_degrees():
    east = torch.tensor([1.0, 0.0]).view(1, 2, 1, 1)
    north = torch.tensor([0.0, 2.0]).view(1, 2, 1, 1)
    diagonal = torch.tensor([3.0, 3.0]).view(1, 2, 1, 1)
    torch.testing.assert_close(m.sam(east, north), torch.tensor([90.0]))
    torch.testing.assert_close(m.sam(east, diagonal), torch.tensor([45.0]))
    # per pixel, then the mean over pixels: angles 90 and 0 -> 45
    two_pixels_pred = torch.cat([east, east], dim=3)
    two_pixels_target = torch.cat([north, east * 5], dim=3)
    torch.testing.assert_close(m.sam(two_pixels_pred, two_pixels_target), torch.tensor([45.0]))


def test_sam_is_defined_for_zero_spectra():
    zero = torch.zeros(1, 3, 2, 2)
    assert torch.equal(m.sam(zero, zero), torch.zeros(1))
    torch.testing.assert_close(m.sam(zero, torch.ones(1, 3, 2, 2)), torch.tensor([90.0]))


def test_ssim_of_constant_images_is_the_luminance_term():
    # No variance anywhere: SSIM = (2ab + C1) / (a^2 + b^2 + C1) at every inner pixel.
    a, b = 0.5, 0.3
    pred = torch.full((1, 2, 16, 16), a, dtype=torch.float64)
    target = torch.full((1, 2, 16, 16), b, dtype=torch.float64)
    expected = (2 * a * b + C1) / (a * a + b * b + C1)  # 0.88238...
    for padding in ("valid", "reflect"):
        torch.testing.assert_close(m.ssim(pred, target, padding=padding), torch.tensor([expected], dtype=torch.float64))
    assert m.ssim(pred, target, padding="zeros").item() != pytest.approx(expected)  # borders see zeros


def test_ssim_zero_padding_on_a_single_pixel_by_hand():
    # One pixel, zero padding: every window holds the pixel with the centre weight w and zeros.
    a, b = 0.6, 0.2
    g = [math.exp(-(k * k) / (2 * 1.5**2)) for k in range(-5, 6)]
    w = (g[5] / sum(g)) ** 2
    mu_a, mu_b = w * a, w * b
    var_a, var_b, cov = w * a * a - mu_a**2, w * b * b - mu_b**2, w * a * b - mu_a * mu_b
    expected = ((2 * mu_a * mu_b + C1) * (2 * cov + C2)) / ((mu_a**2 + mu_b**2 + C1) * (var_a + var_b + C2))
    pred = torch.full((1, 1, 1, 1), a, dtype=torch.float64)
    target = torch.full((1, 1, 1, 1), b, dtype=torch.float64)
    torch.testing.assert_close(m.ssim(pred, target), torch.tensor([expected], dtype=torch.float64))


def _ssim_by_loops(pred: torch.Tensor, target: torch.Tensor) -> float:
    """UnCRtainTS's definition written out pixel by pixel: zero padding, 11x11 gaussian."""
    g = torch.tensor([math.exp(-(k * k) / (2 * 1.5**2)) for k in range(-5, 6)], dtype=torch.float64)
    window = torch.outer(g, g) / g.sum() ** 2
    _, c, h, w = pred.shape
    px = torch.nn.functional.pad(pred[0], (5, 5, 5, 5))
    tx = torch.nn.functional.pad(target[0], (5, 5, 5, 5))
    total = 0.0
    for band in range(c):
        for i in range(h):
            for j in range(w):
                x, y = px[band, i : i + 11, j : j + 11], tx[band, i : i + 11, j : j + 11]
                mx, my = (window * x).sum(), (window * y).sum()
                vx, vy = (window * x * x).sum() - mx * mx, (window * y * y).sum() - my * my
                cxy = (window * x * y).sum() - mx * my
                total += float(((2 * mx * my + C1) * (2 * cxy + C2)) / ((mx * mx + my * my + C1) * (vx + vy + C2)))
    return total / (c * h * w)


def test_ssim_matches_the_reference_definition_pixel_by_pixel():
    pred, target = _pair(b=2, c=2, h=7, w=9)
    values = m.ssim(pred, target)
    for i in range(2):
        assert values[i].item() == pytest.approx(_ssim_by_loops(pred[i : i + 1], target[i : i + 1]), abs=1e-12)


def _torchmetrics_ssim_padding() -> str:
    version = tuple(int(p) for p in torchmetrics.__version__.split("+")[0].split(".")[:3])
    return "reflect" if version >= (1, 4, 2) else "valid"  # 1.4.2 stopped cropping the border


def test_ssim_matches_torchmetrics_with_its_padding():
    pred, target = _pair()
    theirs = structural_similarity_index_measure(
        pred,
        target,
        gaussian_kernel=True,
        sigma=1.5,
        kernel_size=11,
        data_range=1.0,
        k1=0.01,
        k2=0.03,
        reduction="none",
    )
    torch.testing.assert_close(m.ssim(pred, target, padding=_torchmetrics_ssim_padding()), theirs)
    assert not torch.allclose(m.ssim(pred, target), theirs)  # the default (zeros) differs at borders


def test_psnr_sam_mae_rmse_match_torchmetrics_per_sample():
    pred, target = _pair()
    ours = m.compute_all(pred, target)
    for i in range(pred.shape[0]):
        p, t = pred[i : i + 1], target[i : i + 1]
        torch.testing.assert_close(ours["psnr"][i], peak_signal_noise_ratio(p, t, data_range=1.0))
        torch.testing.assert_close(ours["sam"][i], torch.rad2deg(spectral_angle_mapper(p, t)))
        torch.testing.assert_close(ours["mae"][i], torchmetrics.functional.mean_absolute_error(p, t))
        torch.testing.assert_close(ours["rmse"][i], torchmetrics.functional.mean_squared_error(p, t, squared=False))
    # torchmetrics' PSNR over a batch pools the squared error first: not the per-sample mean
    pooled = peak_signal_noise_ratio(pred, target, data_range=1.0)
    assert pooled.item() != pytest.approx(ours["psnr"].mean().item(), abs=1e-6)


def test_half_precision_inputs_are_computed_in_float32():
    pred, target = _pair(dtype=torch.float32)
    pred16, target16 = pred.bfloat16(), target.bfloat16()
    ours = m.compute_all(pred16, target16)
    reference = m.compute_all(pred16.float(), target16.float())
    assert set(ours) == set(m.METRICS)
    for key in m.METRICS:
        assert ours[key].dtype == torch.float32 and ours[key].shape == (pred.shape[0],)
        torch.testing.assert_close(ours[key], reference[key], rtol=0, atol=0)
    assert m.compute_all(*_pair())["ssim"].dtype == torch.float64


def test_shape_mismatch_and_wrong_rank_are_refused():
    with pytest.raises(AssertionError, match="differ"):
        m.rmse(torch.zeros(1, 2, 4, 4), torch.zeros(1, 3, 4, 4))
    with pytest.raises(AssertionError, match=r"\(B, C, H, W\)"):
        m.mae(torch.zeros(2, 4, 4), torch.zeros(2, 4, 4))
    with pytest.raises(ValueError, match="valid"):
        m.ssim(torch.zeros(1, 1, 8, 8), torch.zeros(1, 1, 8, 8), padding="valid")


def test_accumulator_averages_samples_not_batches():
    acc = m.MetricAccumulator()
    first, second = _pair(b=2, seed=1), _pair(b=3, seed=2)
    acc.update(m.compute_all(*first))
    acc.update(m.compute_all(*second))
    everything = m.compute_all(torch.cat([first[0], second[0]]), torch.cat([first[1], second[1]]))
    means = acc.compute()
    assert acc.count == 5
    for key in m.METRICS:
        assert means[key] == pytest.approx(everything[key].mean().item(), rel=1e-12)


def test_accumulator_all_reduce_gives_the_global_mean():
    rank0, rank1 = m.MetricAccumulator(), m.MetricAccumulator()
    rank0.update({k: torch.tensor([1.0]) for k in m.METRICS})
    rank1.update({k: torch.tensor([2.0, 3.0, 4.0]) for k in m.METRICS})

    def other_rank_totals(acc):
        return torch.cat([torch.tensor([float(acc.count)], dtype=torch.float64), acc.sums])

    means = rank0.compute(reduce_fn=lambda totals: totals + other_rank_totals(rank1))
    assert means == {k: 2.5 for k in m.METRICS}  # (1 + 2 + 3 + 4) / 4, not (1 + 3) / 2
    with pytest.raises(ValueError, match="no samples"):
        m.MetricAccumulator().compute()
