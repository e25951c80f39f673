"""Stage models: shapes, parameter counts, gradients, bf16, the optimisations, DDIM sampling."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from vcloud.config import Optimisations, load_model_config
from vcloud.constants import CLOUD_CHANNEL, SAMPLE_CHANNELS
from vcloud.models.autoencoder import Autoencoder
from vcloud.models.cfdt import CFDT
from vcloud.models.refiner import (
    CONDITION_CHANNELS,
    OPACITY_CHANNEL,
    DiffusionSchedule,
    Refiner,
    ddim_sample,
    refiner_condition,
    unmix_cloud,
)
from vcloud.wind.scan_orders import compute_cache

ROOT = Path(__file__).parents[2]
B, T, SIZE = 2, 4, 32


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def full():
    return load_model_config(ROOT / "config/models/full.yaml")


def cfdt_batch(*, b: int = B, t: int = T, size: int = SIZE, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(b, t, SAMPLE_CHANNELS, size, size, generator=g)  # (B, T, 17, H, W) on the 0..1 scale
    days = torch.linspace(-120.0, 90.0, t).expand(b, t).contiguous()  # (B, T)
    target_index = torch.tensor([1, t - 1, 0, 2][:b])  # (B,) a different target per sample
    return x, days, target_index


def make_cfdt(cfg, **changes) -> CFDT:
    torch.manual_seed(0)
    return CFDT(dataclasses.replace(cfg.stage1.model, **changes))


def make_refiner(small) -> Refiner:
    torch.manual_seed(0)
    return Refiner(small.stage2.model)


# --- shapes -----------------------------------------------------------------------------------


def test_autoencoder_shapes(small):
    torch.manual_seed(0)
    model = Autoencoder(small.stage0.model)
    f = 2 ** (len(small.stage0.model.widths) - 1)
    assert model.downsample == f
    x = torch.rand(B, 13, SIZE, SIZE)
    z = model.encode(x)
    assert z.shape == (B, small.stage0.model.latent_channels, SIZE // f, SIZE // f)
    assert model.decode(z).shape == x.shape
    assert model(x).shape == x.shape
    with pytest.raises(AssertionError, match="multiples"):
        model.encode(torch.rand(1, 13, SIZE + 1, SIZE + 1))


def test_cfdt_shapes(small):
    model = make_cfdt(small)
    x, days, target_index = cfdt_batch()
    draft = model(x, days, target_index)
    assert draft.shape == (B, 13, SIZE, SIZE)
    assert torch.isfinite(draft).all()
    gate = model.gate(x, target_index)
    assert gate.shape == (B, T, 1, SIZE, SIZE) and bool(((gate > 0) & (gate < 1)).all())
    one = model(x[:, :1], days[:, :1], torch.zeros(B, dtype=torch.long))  # a single date
    assert one.shape == (B, 13, SIZE, SIZE)


def test_cfdt_uses_each_samples_own_target_date(small):
    model = make_cfdt(small).eval()
    x, days, target_index = cfdt_batch()
    with torch.no_grad():
        batched = model(x, days, target_index)
        for b in range(B):
            alone = model(x[b : b + 1], days[b : b + 1], target_index[b : b + 1])
            torch.testing.assert_close(batched[b : b + 1], alone, atol=1e-5, rtol=1e-4)
        assert not torch.allclose(batched, model(x, days, target_index.flip(0)), atol=1e-3)


def test_refiner_shapes_and_condition(small):
    model = make_refiner(small)
    draft, observed = torch.rand(B, 13, SIZE, SIZE), torch.rand(B, 13, SIZE, SIZE)
    s1 = torch.full((B, 2, SIZE, SIZE), 0.25)
    cloud = torch.rand(B, SIZE, SIZE)
    spectrum, scale = torch.full((13,), 0.5), torch.full((13,), 0.02)
    s1_valid = torch.tensor([True, False])  # the second target date has no S1: zeros, flagged 0
    cond = refiner_condition(draft, observed, s1, cloud, s1_valid=s1_valid, spectrum=spectrum, scale=scale)
    assert cond.shape == (B, CONDITION_CHANNELS, SIZE, SIZE) == (B, 44, SIZE, SIZE)
    torch.testing.assert_close(cond[:, :13], draft)
    torch.testing.assert_close(cond[:, 13:26], observed)
    torch.testing.assert_close(cond[0, 26:28], s1[0])
    assert not cond[1, 26:28].any()
    assert cond[0, 28].eq(1).all() and cond[1, 28].eq(0).all()
    torch.testing.assert_close(cond[:, 29], cloud)
    estimate, opacity = unmix_cloud(observed, draft, spectrum)
    torch.testing.assert_close(cond[:, 30:43], (estimate - draft) / 0.02)  # in residual units
    torch.testing.assert_close(cond[:, OPACITY_CHANNEL:], opacity)
    r0 = model(torch.randn(B, 13, SIZE, SIZE), torch.tensor([0, 999]), cond)
    assert r0.shape == (B, 13, SIZE, SIZE)
    with pytest.raises(AssertionError, match="multiple of 4"):  # patch 2 x one downsampling
        model(torch.randn(B, 13, 30, 30), torch.tensor([0, 1]), cond[..., :30, :30])


# --- parameter counts of the full configuration (meta device: nothing allocated) ---------------


def test_full_parameter_counts_on_meta_device(full):
    with torch.device("meta"):
        autoencoder = Autoencoder(full.stage0.model)
        cfdt = CFDT(full.stage1.model)
    for model in (autoencoder, cfdt):
        assert all(p.is_meta for p in model.parameters())
    n_autoencoder = sum(p.numel() for p in autoencoder.parameters())
    n_cfdt = sum(p.numel() for p in cfdt.parameters())
    assert abs(n_autoencoder / 29.8e6 - 1) <= 0.05, n_autoencoder  # LUMI field report: 29.8M
    assert abs(n_cfdt / 154e6 - 1) <= 0.05, n_cfdt  # and 154M


# --- gradients and bf16 -----------------------------------------------------------------------


def wind_cfdt(small) -> CFDT:
    model = make_cfdt(small, wind_scan=True)
    grid = SIZE // model.downsample
    cache = compute_cache(grid_h=grid, grid_w=grid, sectors=8)
    model.set_wind_orders(torch.from_numpy(cache.orders), torch.from_numpy(cache.inverse))
    return model


def outputs_of_every_model(small, *, autocast: bool = False):
    """(name, model, output) for the three models on small inputs."""
    x, days, target_index = cfdt_batch()
    autoencoder = Autoencoder(small.stage0.model)
    cfdt = wind_cfdt(small)
    refiner = make_refiner(small)
    torch.nn.init.normal_(refiner.head[-1].weight, std=0.05)  # past the zero start: gradients everywhere
    z = torch.randn(B, 13, 16, 16)
    cond = refiner_condition(
        torch.rand(B, 13, 16, 16),
        torch.rand(B, 13, 16, 16),
        torch.rand(B, 2, 16, 16),
        torch.rand(B, 1, 16, 16),
        s1_valid=torch.ones(B, dtype=torch.bool),
        spectrum=torch.full((13,), 0.5),
        scale=torch.full((13,), 0.02),
    )
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        yield "autoencoder", autoencoder, autoencoder(x[:, 0, :13])
        yield "cfdt", cfdt, cfdt(x, days, target_index, torch.tensor([3, -1]))
        yield "refiner", refiner, refiner(z, torch.tensor([5, 700]), cond)


def test_gradients_reach_every_parameter(small):
    for name, model, out in outputs_of_every_model(small):
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        (out * weights).sum().backward()
        missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
        assert not missing, f"{name}: no gradient for {missing}"


def test_models_run_under_bf16_autocast(small):
    for name, model, out in outputs_of_every_model(small, autocast=True):
        # the CFDT adds its bf16 correction to an fp32 clear-sky composite: fp32 out
        assert out.dtype == (torch.float32 if name == "cfdt" else torch.bfloat16), name
        assert torch.isfinite(out.float()).all(), name
        out.float().square().mean().backward()
        grads = [p.grad for p in model.parameters()]
        assert all(g is not None and g.dtype == torch.float32 for g in grads), name


def test_wind_scan_without_sectors_is_no_reordering(small):
    model = wind_cfdt(small).eval()
    x, days, target_index = cfdt_batch()
    with torch.no_grad():
        none = model(x, days, target_index)
        torch.testing.assert_close(none, model(x, days, target_index, torch.tensor([-1, -1])))
        assert not torch.allclose(none, model(x, days, target_index, torch.tensor([2, 5])), atol=1e-4)


# --- the memory optimisations leave the output alone ------------------------------------------


def draft_and_grads(model: CFDT, optimisations: Optimisations, batch) -> tuple[torch.Tensor, list]:
    model.optimisations = optimisations
    model.zero_grad(set_to_none=True)
    draft = model(*batch)
    draft.square().mean().backward()
    return draft.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize(
    "before, after",
    [
        (Optimisations(), Optimisations(grad_checkpoint=True)),
        # target_only only changes what the per-date (checkpointed) path keeps
        (
            Optimisations(grad_checkpoint=True),
            Optimisations(grad_checkpoint=True, target_only_pyramid=True),
        ),
        (Optimisations(), Optimisations(gate_chunk=5)),  # 24 pairs in chunks of 5
        (
            Optimisations(),
            Optimisations(grad_checkpoint=True, target_only_pyramid=True, gate_chunk=7),
        ),
    ],
    ids=["grad_checkpoint", "target_only_pyramid", "gate_chunk", "all_three"],
)
def test_exact_optimisations_keep_outputs_and_gradients(small, before, after):
    model = make_cfdt(small)
    batch = cfdt_batch()
    draft0, grads0 = draft_and_grads(model, before, batch)
    draft1, grads1 = draft_and_grads(model, after, batch)
    torch.testing.assert_close(draft1, draft0, atol=1e-5, rtol=1e-4)
    for g0, g1 in zip(grads0, grads1):
        torch.testing.assert_close(g1, g0, atol=1e-5, rtol=1e-4)


def smooth_batch(size: int):
    """Per-date constants plus one gentle wave across the image: a smooth gate input."""
    g = torch.Generator().manual_seed(3)
    yy, xx = torch.meshgrid(torch.linspace(0, 1, size), torch.linspace(0, 1, size), indexing="ij")
    base = torch.rand(B, T, SAMPLE_CHANNELS, 1, 1, generator=g)
    phase = 2 * math.pi * torch.rand(B, T, SAMPLE_CHANNELS, 1, 1, generator=g)
    x = (base + 0.3 * torch.sin(2 * math.pi * xx + phase) * torch.cos(math.pi * yy)).clamp(0, 1)
    return x, base.expand(B, T, SAMPLE_CHANNELS, size, size)


def test_reduced_resolution_gate_is_close_for_a_smooth_gate(small):
    """Why these tolerances. At resolution r < size every 3x3 conv of the gate sees a
    neighbourhood size/r times wider, which adds a term proportional to the input's
    gradient, and the gate is resampled bilinearly; both vanish for a constant input.
    Zero padding changes a band of (layers + 2) gate pixels at the image edge, which we
    leave out. The final conv is scaled up so that the gate really varies (interior range
    >= 0.05); at half resolution we then ask for a mean difference within 10% and a
    maximum within 30% of that range, and for drafts within 5% of their spread."""
    size, resolution = 64, 32
    model = make_cfdt(small).eval()
    with torch.no_grad():
        model.gate.pair_cnn[-1].weight.mul_(30.0)
    smooth, constant = smooth_batch(size)
    target_index = torch.tensor([0, 2])
    band = (small.stage1.model.gate_layers + 2) * size // resolution
    interior = (..., slice(band, -band), slice(band, -band))
    with torch.no_grad():
        # constant inputs: the same gate at any resolution (away from the edge band)
        full = model.gate(constant, target_index)
        low = model.gate(constant, target_index, resolution=resolution)
        torch.testing.assert_close(low[interior], full[interior], atol=1e-5, rtol=0)

        full = model.gate(smooth, target_index)
        low = model.gate(smooth, target_index, resolution=resolution)
        inner = full[interior]
        spread = (inner.amax(dim=(-1, -2)) - inner.amin(dim=(-1, -2))).mean()
        assert spread >= 0.05, f"the test gate hardly varies ({spread:.3f}); nothing is tested"
        difference = (low - full)[interior].abs()
        assert difference.mean() <= 0.1 * spread, (difference.mean(), spread)
        assert difference.max() <= 0.3 * spread, (difference.max(), spread)

        days = torch.linspace(-120.0, 90.0, T).expand(B, T)
        model.optimisations = Optimisations()
        draft = model(smooth, days, target_index)
        model.optimisations = Optimisations(gate_resolution=resolution)
        draft_low = model(smooth, days, target_index)
        assert (draft_low - draft).abs().mean() <= 0.05 * draft.std()


# --- diffusion ---------------------------------------------------------------------------------


def test_q_sample_and_schedules():
    for kind in ("cosine", "linear"):
        schedule = DiffusionSchedule(1000, kind=kind)
        abar = schedule.alphas_cumprod
        assert abar.shape == (1000,) and bool((abar[1:] < abar[:-1]).all()) and abar[0] > 0.999
        z0, noise = torch.randn(3, 4, 8, 8), torch.randn(3, 4, 8, 8)
        zt = schedule.q_sample(z0, torch.tensor([0, 500, 999]), noise)
        torch.testing.assert_close(zt[0], z0[0], atol=0.05, rtol=0)  # abar_0 > 0.9999
        expected = abar[500].sqrt() * z0[1] + (1 - abar[500]).sqrt() * noise[1]
        torch.testing.assert_close(zt[1], expected.float())
    assert DiffusionSchedule(1000).sampling_timesteps(4) == [999, 666, 333, 0]
    with pytest.raises(ValueError, match="schedule"):
        DiffusionSchedule(10, kind="quadratic")


def test_untrained_refiner_predicts_no_correction(small):
    model = make_refiner(small).eval()
    cond = torch.rand(B, CONDITION_CHANNELS, 16, 16)
    out = ddim_sample(model, cond, steps=4, generator=torch.Generator().manual_seed(0), shape=(B, 13, 16, 16))
    assert torch.equal(out, torch.zeros_like(out))  # the stage-1 draft passes through unchanged


def test_ddim_sampling_is_deterministic_per_seed(small):
    model = make_refiner(small).eval()
    torch.nn.init.normal_(model.head[-1].weight, std=0.05)  # as after some training
    cond = torch.rand(B, CONDITION_CHANNELS, 16, 16, generator=torch.Generator().manual_seed(0))
    cond[:, OPACITY_CHANNEL] = 0.0  # the date fully seen: the correction is not gated
    shape = (B, 13, 16, 16)

    def sample(seed: int, temperature: float | None = None) -> torch.Tensor:
        return ddim_sample(
            model,
            cond,
            steps=4,
            generator=torch.Generator().manual_seed(seed),
            shape=shape,
            clip=5.0,
            temperature=temperature,
        )

    first, again, other = sample(0), sample(0), sample(1)
    assert first.shape == shape and torch.isfinite(first).all()
    assert torch.equal(first, again)
    assert (first - other).abs().mean() > 1e-3
    # a lower temperature draws nearer the mode: the seeds still differ, by less
    assert model.temperature == small.stage2.model.temperature < 1
    assert torch.equal(first, sample(0, model.temperature))
    hot, hot_other = sample(0, 1.0), sample(1, 1.0)
    assert 1e-4 < (first - other).abs().mean() < (hot - hot_other).abs().mean()


def test_unmixing_inverts_the_cloud_blend():
    """observed = ground * (1 - a) + spectrum * a: with the ground as the draft, unmixing gives a
    and the ground back; past MAX_OPACITY it stops (the ground is not recovered, not blown up)."""
    g = torch.Generator().manual_seed(3)
    ground = 0.05 + 0.3 * torch.rand(2, 13, 8, 8, generator=g)
    spectrum = 0.2 + 0.4 * torch.rand(13, generator=g)
    a = torch.tensor([0.0, 0.3, 0.6, 0.9]).repeat_interleave(2).view(1, 1, 1, 8).expand(2, 1, 8, 8)
    observed = ground * (1 - a) + spectrum.view(1, -1, 1, 1) * a
    estimate, opacity = unmix_cloud(observed, ground, spectrum)
    torch.testing.assert_close(opacity, a, atol=1e-5, rtol=0)
    torch.testing.assert_close(estimate, ground, atol=1e-4, rtol=0)
    # a draft that is off: the observed date still pulls the estimate to the truth under haze
    off = (ground + 0.05).clamp(0, 1)
    estimate, _ = unmix_cloud(observed, off, spectrum)
    thin = a[:, :, :, :4].expand(2, 13, 8, 4) < 0.5
    assert (estimate[..., :4] - ground[..., :4]).abs()[thin].mean() < (off - ground)[..., :4].abs()[thin].mean() / 2
    opaque = ground * 0.02 + spectrum.view(1, -1, 1, 1) * 0.98
    assert unmix_cloud(opaque, ground, spectrum)[1].max() == pytest.approx(0.95)


def test_the_correction_is_gated_by_visibility(small):
    model = make_refiner(small).eval()
    torch.nn.init.normal_(model.head[-1].weight, std=0.05)
    torch.nn.init.normal_(model.head[-1].bias, std=0.05)
    cond = torch.rand(B, CONDITION_CHANNELS, 16, 16, generator=torch.Generator().manual_seed(0))
    cond[:, OPACITY_CHANNEL] = 0.0
    cond[:, OPACITY_CHANNEL, :8] = 1.0  # top half not seen at all
    out = model(torch.randn(B, 13, 16, 16), torch.tensor([999, 333]), cond)
    assert torch.equal(out[:, :, :8], torch.zeros_like(out[:, :, :8]))
    assert out[:, :, 8:].abs().min() > 0


def test_wind_cfdt_on_a_crop_mixes_along_the_window_orders(small):
    # Training crops are smaller than the whole-patch grid the cache was made for: the crop
    # runs, and its sectors change the output (it scans by wind, not row-major).
    model = make_cfdt(small, wind_scan=True).eval()
    grid = 2 * SIZE // model.downsample  # the cache of a patch twice the crop's size
    cache = compute_cache(grid_h=grid, grid_w=grid, sectors=8)
    model.set_wind_orders(torch.from_numpy(cache.orders), torch.from_numpy(cache.inverse), grid=cache.grid)
    x, days, target_index = cfdt_batch()
    with torch.no_grad():
        calm = model(x, days, target_index, torch.tensor([-1, -1]))
        windy = model(x, days, target_index, torch.tensor([2, 5]))
    assert calm.shape == windy.shape == (B, 13, SIZE, SIZE)
    assert not torch.allclose(calm, windy, atol=1e-4)


def _dates(values, probs, size=8):
    """x (1, T, 17, size, size): date t's S2 bands all `values[t]`, its cloud probability `probs[t]`."""
    x = torch.zeros(1, len(values), SAMPLE_CHANNELS, size, size)
    for t, (value, prob) in enumerate(zip(values, probs)):
        x[0, t, :13] = value
        x[0, t, CLOUD_CHANNEL] = prob
    return x


def test_clear_sky_prior_prefers_a_clear_date_far_away_to_a_cloudy_date_nearby():
    from vcloud.models.cfdt import clear_composite

    # target (cloudy, 0.8), a date 5 days away half covered (0.5), a clear date 300 days away
    x = _dates([0.9, 0.6, 0.2], [0.8, 0.5, 0.0])
    composite = clear_composite(x)  # no days: nothing decays with time
    assert torch.allclose(composite, torch.full_like(composite, 0.2), atol=0.01), composite.mean()


def test_clear_sky_prior_distrusts_the_shadow_of_a_cloudy_date():
    from vcloud.models.cfdt import clear_composite

    # Date 0: a cloud over the left half (p = 1) and its shadow over the right half, which the
    # detector misses (p = 0): dark ground there. Date 1: clear everywhere.
    x = _dates([0.05, 0.3], [0.0, 0.0])
    x[0, 0, -1, :, :4] = 1.0
    x[0, 0, :13, :, :4] = 0.5
    composite = clear_composite(x)
    shadowed = composite[..., 4:]
    assert torch.allclose(shadowed, torch.full_like(shadowed, 0.3), atol=0.01), shadowed.mean()


def test_learned_date_logits_move_the_prior():
    from vcloud.models.cfdt import clear_composite

    x = _dates([0.2, 0.6], [0.1, 0.1])  # equally cloudy: an even mix
    assert torch.allclose(clear_composite(x), torch.full((1, 13, 8, 8), 0.4), atol=1e-5)
    logits = torch.zeros(1, 2, 8, 8)
    logits[:, 1, :, 4:] = 10.0  # the gate trusts date 1 on the right half
    mixed = clear_composite(x, date_logits=logits)
    assert torch.allclose(mixed[..., :4], torch.full_like(mixed[..., :4], 0.4), atol=1e-5)
    assert torch.allclose(mixed[..., 4:], torch.full_like(mixed[..., 4:], 0.6), atol=1e-3)


def test_cfdt_draft_starts_from_the_prior_with_the_gate_logits(small):
    from vcloud.models.cfdt import clear_composite

    model = make_cfdt(small).eval()
    x, days, target_index = cfdt_batch()
    with torch.no_grad():
        model.decoder.head[-1].weight.zero_()  # no learned correction: the draft is the prior
        logits = model.gate(x, target_index, logits=True)
        draft = model(x, days, target_index)
        torch.testing.assert_close(draft, clear_composite(x, date_logits=logits[:, :, 0]))
        torch.testing.assert_close(torch.sigmoid(logits), model.gate(x, target_index))
        assert not torch.allclose(draft, clear_composite(x), atol=1e-4)  # the logits count


def test_token_grid_is_the_cfdt_coarsest_level():
    from vcloud.models.grid import token_grid, token_stride

    assert token_stride((8, 16, 32, 64)) == 8
    assert token_stride((8,)) == 1
    assert token_grid((8, 16, 32), 256, 64) == (64, 16)
    with pytest.raises(ValueError, match="multiples of 8"):
        token_grid((8, 16, 32, 64), 256, 100)
    cfg = load_model_config(ROOT / "config/models/small.yaml")
    model = CFDT(cfg.stage1.model)
    assert model.downsample == token_stride(cfg.stage1.model.widths)


def test_gate_pair_scores_equal_the_cnn_on_concatenated_pairs(small):
    """The gate's first pair convolution is computed per date (split weights), not per pair: the
    scores equal the pair CNN run on [f_i, f_j] stacked on channels, values and gradients."""
    torch.manual_seed(0)
    gate = CFDT(small.stage1.model).gate.double()
    features = torch.randn(6, gate.embed[0].out_channels, 12, 10, dtype=torch.float64, requires_grad=True)
    first, second = torch.tensor([0, 0, 1, 2, 5, 3]), torch.tensor([1, 2, 0, 0, 4, 5])
    scores = gate.pair_scores(gate.pair_halves(features), first, second)
    pairs = torch.cat([features.index_select(0, first), features.index_select(0, second)], dim=1)
    reference = gate.pair_cnn(pairs)
    torch.testing.assert_close(scores, reference)
    weights = torch.randn_like(reference)
    grads = torch.autograd.grad((scores * weights).sum(), [features, gate.pair_cnn[0].weight, gate.pair_cnn[0].bias])
    expected = torch.autograd.grad(
        (reference * weights).sum(), [features, gate.pair_cnn[0].weight, gate.pair_cnn[0].bias]
    )
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want)
