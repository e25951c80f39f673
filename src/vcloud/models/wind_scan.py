"""Wind-following token mixing: reorder patch tokens upwind -> downwind, mix, put them back.

The scan orders come from the caller (vcloud.wind.scan_orders reads them from the precomputed
file on every rank); this module does no file I/O. They are non-persistent buffers: they
move with `.to(device)` but are not saved in checkpoints, because they are a function of
the grid and the sector count, which the config records.
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import nn


class SequenceMixer(nn.Module):
    """Residual mixing along the sequence: x + MLP(depthwise conv1d(LayerNorm(x))).

    The conv is centred (not causal): each token sees kernel_size // 2 neighbours upwind
    and downwind along the scan. Its ends repeat the first and last token rather than zeros,
    so the upwind and downwind edges of the patch are not special (docs/patch-edges.md).
    """

    def __init__(self, dim: int, *, kernel_size: int = 7, mlp_ratio: float = 2.0) -> None:
        super().__init__()
        assert kernel_size % 2 == 1, f"kernel_size must be odd, got {kernel_size}"
        hidden = max(1, int(dim * mlp_ratio))
        self.norm = nn.LayerNorm(dim)
        self.conv = nn.Conv1d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim, padding_mode="replicate")
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, seq: torch.Tensor) -> torch.Tensor:  # (B, N, C) -> (B, N, C)
        h = rearrange(self.norm(seq), "b n c -> b c n")
        h = rearrange(self.conv(h), "b c n -> b n c")
        return seq + self.mlp(h)


class WindScanMixing(nn.Module):
    """Mix tokens along each sample's wind-sector scan order, then return them to grid order.

    forward(tokens (B, N, C), sectors (B,), grid=(h, w)) -> (B, N, C). sectors[b] indexes the
    orders given to `set_orders` (or the constructor); -1 means no reordering (grid row-major).
    A token grid smaller than the orders' grid (a training crop) scans in the orders restricted
    to an h x w window, which is the same order for every window of that shape (the key is
    linear in position; see vcloud.wind.scan_orders), so crops need no orders of their own.
    """

    orders: torch.Tensor | None
    inverse: torch.Tensor | None

    def __init__(
        self,
        dim: int,
        *,
        kernel_size: int = 7,
        mlp_ratio: float = 2.0,
        orders: torch.Tensor | None = None,
        inverse: torch.Tensor | None = None,
        grid: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        self.mixer = SequenceMixer(dim, kernel_size=kernel_size, mlp_ratio=mlp_ratio)
        self.register_buffer("orders", None, persistent=False)  # (S, N) grid index per position
        self.register_buffer("inverse", None, persistent=False)  # (S, N) position per grid index
        self.grid: tuple[int, int] | None = None  # (H, W) of the installed orders
        self._windows: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        if orders is not None or inverse is not None:
            assert orders is not None and inverse is not None, "give both orders and inverse"
            self.set_orders(orders, inverse, grid=grid)

    @torch.no_grad()
    def set_orders(self, orders: torch.Tensor, inverse: torch.Tensor, *, grid: tuple[int, int] | None = None) -> None:
        """Install (S, N) scan orders of an (H, W) grid and their inverses (checked here, once).

        Without `grid` only token grids of exactly N tokens are accepted.
        """
        device = next(self.parameters()).device
        orders = torch.as_tensor(orders).to(device=device, dtype=torch.long)  # (S, N)
        inverse = torch.as_tensor(inverse).to(device=device, dtype=torch.long)  # (S, N)
        assert orders.ndim == 2 and orders.shape == inverse.shape, (
            f"orders and inverse must both be (S, N), got {tuple(orders.shape)} and {tuple(inverse.shape)}"
        )
        n = orders.shape[1]
        in_range = bool(((orders >= 0) & (orders < n) & (inverse >= 0) & (inverse < n)).all())
        identity = torch.arange(n, device=device).expand_as(orders)
        is_inverse = in_range and torch.equal(orders.gather(1, inverse), identity)
        assert is_inverse, "inverse is not the inverse permutation of orders"
        assert grid is None or grid[0] * grid[1] == n, f"grid {grid} does not hold {n} tokens"
        self.orders = orders
        self.inverse = inverse
        self.grid = tuple(grid) if grid is not None else None
        self._windows = {}

    def _window(self, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(S, h*w) orders and inverses of an h x w window: the full orders restricted to it."""
        full_h, full_w = self.grid
        assert h <= full_h and w <= full_w, f"token grid {h}x{w} is larger than the wind cache's grid {full_h}x{full_w}"
        key = (h, w)
        if key not in self._windows or self._windows[key][0].device != self.orders.device:
            rows, cols = self.orders // full_w, self.orders % full_w  # (S, H*W)
            inside = (rows < h) & (cols < w)  # h*w entries per sector, in scan order
            local = (rows * w + cols)[inside].view(self.orders.shape[0], h * w)  # (S, h*w)
            self._windows[key] = (local, torch.argsort(local, dim=1))
        return self._windows[key]

    def forward(
        self, tokens: torch.Tensor, sectors: torch.Tensor, *, grid: tuple[int, int] | None = None
    ) -> torch.Tensor:
        assert self.orders is not None, "call set_orders(orders, inverse) before forward"
        b, n, c = tokens.shape  # (B, N, C)
        orders, inverses = self.orders, self.inverse  # (S, N)
        if grid is not None and self.grid is not None and tuple(grid) != self.grid:
            assert grid[0] * grid[1] == n, f"{n} tokens do not fill a {grid[0]}x{grid[1]} grid"
            orders, inverses = self._window(int(grid[0]), int(grid[1]))
        s, n_orders = orders.shape  # (S, N)
        assert n == n_orders, f"{n} tokens but the scan orders cover {n_orders} patches"
        assert sectors.shape == (b,), f"sectors must be ({b},), got {tuple(sectors.shape)}"
        assert not sectors.is_floating_point(), "sectors must be integer indices"
        sectors = sectors.to(device=tokens.device, dtype=torch.long)  # (B,)
        # Checked here (one host sync) because an out-of-range index on the GPU is a
        # device-side assert without a message.
        if not bool(((sectors >= -1) & (sectors < s)).all()):
            raise ValueError(f"sector indices must lie in -1..{s - 1}, got {sectors.tolist()}")

        keep = (sectors < 0)[:, None]  # (B, 1) no reordering
        chosen = sectors.clamp(min=0)  # (B,)
        identity = torch.arange(n, device=tokens.device).expand(b, n)  # (B, N)
        order = torch.where(keep, identity, orders[chosen])  # (B, N)
        inverse = torch.where(keep, identity, inverses[chosen])  # (B, N)

        seq = tokens.gather(1, order[:, :, None].expand(b, n, c))  # (B, N, C) upwind first
        seq = self.mixer(seq)  # (B, N, C)
        return seq.gather(1, inverse[:, :, None].expand(b, n, c))  # (B, N, C) grid order
