"""WindScanMixing: gather into the sector's order, mix along it, scatter back to the grid."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vcloud.models.wind_scan import WindScanMixing
from vcloud.wind.scan_orders import compute_cache

B, C = 3, 8


class AddPosition(nn.Module):
    """Stand-in mixer: adds each token's position along the scanned sequence."""

    def forward(self, seq: torch.Tensor) -> torch.Tensor:  # (B, N, C)
        position = torch.arange(seq.shape[1], dtype=seq.dtype, device=seq.device)
        return seq + position[None, :, None]


class Identity(nn.Module):
    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        return seq


@pytest.fixture(scope="module")
def cache():
    return compute_cache(grid_h=4, grid_w=8, sectors=8)


def make(cache, **kwargs) -> WindScanMixing:
    torch.manual_seed(0)
    return WindScanMixing(
        C,
        orders=torch.from_numpy(cache.orders),
        inverse=torch.from_numpy(cache.inverse),
        **kwargs,
    )


def test_each_sample_is_mixed_in_its_own_sectors_order(cache):
    """out[b] = mixer(tokens[b] in orders[sector_b]) put back at the grid positions, with the
    real mixer, per sample of a batch of different sectors (-1: row-major, no reordering)."""
    module = make(cache, kernel_size=3, mlp_ratio=1.5)
    tokens = torch.randn(B, 32, C)
    sectors = torch.tensor([0, 3, -1])
    out = module(tokens, sectors)
    assert out.shape == (B, 32, C)
    for b, sector in enumerate(sectors.tolist()):
        order = torch.from_numpy(cache.orders[sector]) if sector >= 0 else torch.arange(32)
        mixed = module.mixer(tokens[b : b + 1, order])[0]  # (N, C) in scan order
        expected = torch.empty_like(mixed)
        expected[order] = mixed  # scan position i holds grid patch order[i]
        torch.testing.assert_close(out[b], expected, rtol=1e-5, atol=1e-6)
    # The mixer sees the sequence: a different sector gives a different result.
    assert not torch.allclose(out[0], module(tokens[:1], torch.tensor([3]))[0], atol=1e-4)


def test_no_reorder_equals_identity_order():
    n = 6
    identity = torch.arange(n).expand(2, n)  # sector 0 is the row-major order
    shuffled = torch.tensor([3, 1, 5, 0, 2, 4])
    orders = torch.stack([identity[0], shuffled])
    inverse = torch.argsort(orders, dim=1)
    torch.manual_seed(0)
    module = WindScanMixing(C, orders=orders, inverse=inverse)
    tokens = torch.randn(2, n, C)
    torch.testing.assert_close(module(tokens, torch.tensor([-1, -1])), module(tokens, torch.tensor([0, 0])))
    assert not torch.allclose(module(tokens, torch.tensor([-1, -1])), module(tokens, torch.tensor([1, 1])))


def test_tokens_return_to_their_grid_positions(cache):
    module = make(cache)
    module.mixer = Identity()
    tokens = torch.randn(B, 32, C)
    for sector in range(-1, 8):
        out = module(tokens, torch.full((B,), sector))
        assert torch.equal(out, tokens), sector


def test_mixing_happens_along_the_scan_order(cache):
    # With a mixer that adds the scan position, grid patch g gains its position in the
    # order, i.e. inverse[s, g]; -1 keeps row-major positions.
    module = make(cache)
    module.mixer = AddPosition()
    tokens = torch.zeros(B, 32, C)
    sectors = torch.tensor([2, -1, 5])
    out = module(tokens, sectors)  # (B, N, C)
    inverse = torch.from_numpy(cache.inverse).float()
    torch.testing.assert_close(out[0, :, 0], inverse[2])
    torch.testing.assert_close(out[1, :, 0], torch.arange(32.0))
    torch.testing.assert_close(out[2, :, 0], inverse[5])
    # North (sector 2 of 8): the bottom-left patch (row 3, col 0 = index 24) is scanned first.
    assert out[0, 24, 0] == 0


def test_batch_of_mixed_sectors_equals_samples_one_by_one(cache):
    module = make(cache)
    tokens = torch.randn(B, 32, C)
    sectors = torch.tensor([1, -1, 6])
    batched = module(tokens, sectors)
    for b in range(B):
        torch.testing.assert_close(batched[b : b + 1], module(tokens[b : b + 1], sectors[b : b + 1]))


def test_gradients_flow(cache):
    module = make(cache)
    tokens = torch.randn(B, 32, C, requires_grad=True)
    module(tokens, torch.tensor([0, 4, -1])).square().sum().backward()
    assert tokens.grad is not None and tokens.grad.abs().sum() > 0
    for name, param in module.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_orders_are_buffers_not_checkpoint_state(cache):
    module = make(cache)
    assert {"orders", "inverse"} <= {name for name, _ in module.named_buffers()}
    assert not any(key.endswith(("orders", "inverse")) for key in module.state_dict())
    assert module.orders.dtype == torch.long


def test_bad_orders_and_sectors_are_refused(cache):
    with pytest.raises(AssertionError, match="inverse"):
        WindScanMixing(C, orders=torch.tensor([[0, 1, 2]]), inverse=torch.tensor([[1, 0, 2]]))
    with pytest.raises(AssertionError, match="set_orders"):
        WindScanMixing(C)(torch.randn(1, 3, C), torch.tensor([0]))
    module = make(cache)
    with pytest.raises(ValueError, match="-1..7"):
        module(torch.randn(1, 32, C), torch.tensor([8]))
    with pytest.raises(AssertionError, match="32 patches"):
        module(torch.randn(1, 16, C), torch.tensor([0]))


def test_crop_scans_in_the_window_of_the_whole_grid_orders(cache):
    # A 2x4 token crop of the 4x8 grid: each sample is scanned in the cache's orders
    # restricted to the window (vcloud.wind.scan_orders.window_orders), never in row-major order.
    from vcloud.wind.scan_orders import window_orders

    module = WindScanMixing(
        C, orders=torch.from_numpy(cache.orders), inverse=torch.from_numpy(cache.inverse), grid=(4, 8)
    )
    module.mixer = AddPosition()
    tokens = torch.zeros(B, 8, C)
    out = module(tokens, torch.tensor([1, -1, 4]), grid=(2, 4))  # (B, 8, C)
    window = torch.from_numpy(window_orders(cache.orders, (4, 8), (2, 4)))  # (S, 8)
    position = torch.argsort(window, dim=1).float()  # scan position of each window patch
    torch.testing.assert_close(out[0, :, 0], position[1])
    torch.testing.assert_close(out[1, :, 0], torch.arange(8.0))
    torch.testing.assert_close(out[2, :, 0], position[4])
    # West (sector 4 of 8): the window's east column (local 3 and 7) is scanned first.
    assert sorted(out[2, [3, 7], 0].tolist()) == [0.0, 1.0]
    module.mixer = Identity()
    shuffled = torch.randn(B, 8, C)
    assert torch.equal(module(shuffled, torch.tensor([0, 3, 6]), grid=(2, 4)), shuffled)


def test_crop_larger_than_the_cache_grid_is_refused(cache):
    module = WindScanMixing(
        C, orders=torch.from_numpy(cache.orders), inverse=torch.from_numpy(cache.inverse), grid=(4, 8)
    )
    with pytest.raises(AssertionError, match="larger than the wind cache's grid 4x8"):
        module(torch.randn(1, 10, C), torch.tensor([0]), grid=(5, 2))
