"""Stage 0: convolutional autoencoder on the 13 S2 bands; its latent space hosts stage 2."""

from __future__ import annotations

import torch
from torch import nn

from vcloud.config import AutoencoderConfig
from vcloud.constants import OUTPUT_CHANNELS
from vcloud.models.blocks import Downsample, ReplicateConv2d, ResBlock, Upsample, norm, output_head


class Autoencoder(nn.Module):
    """encode (B, C, H, W) -> (B, latent, H/f, W/f); decode back; f = 2 ** (len(widths) - 1).

    Encoder: stem conv, `blocks_per_level` residual blocks per level with a strided conv
    between levels, `mid_blocks` at the bottom, then norm -> SiLU -> conv to the latent.
    The decoder mirrors it with nearest-neighbour upsampling.
    """

    def __init__(self, cfg: AutoencoderConfig, *, in_channels: int = OUTPUT_CHANNELS) -> None:
        super().__init__()
        widths = tuple(cfg.widths)
        assert len(widths) >= 1, "autoencoder needs at least one width"
        self.in_channels = in_channels
        self.latent_channels = cfg.latent_channels
        self.downsample = 2 ** (len(widths) - 1)
        blocks, mid = cfg.blocks_per_level, cfg.mid_blocks

        enc: list[nn.Module] = [ReplicateConv2d(in_channels, widths[0], 3, padding=1)]
        for level, width in enumerate(widths):
            enc += [ResBlock(width) for _ in range(blocks)]
            if level + 1 < len(widths):
                enc.append(Downsample(width, widths[level + 1]))
        enc += [ResBlock(widths[-1]) for _ in range(mid)]
        enc += [
            norm(widths[-1]),
            nn.SiLU(),
            ReplicateConv2d(widths[-1], cfg.latent_channels, 3, padding=1),
        ]
        self.encoder = nn.Sequential(*enc)

        dec: list[nn.Module] = [ReplicateConv2d(cfg.latent_channels, widths[-1], 3, padding=1)]
        dec += [ResBlock(widths[-1]) for _ in range(mid)]
        for level in reversed(range(len(widths))):
            dec += [ResBlock(widths[level]) for _ in range(blocks)]
            if level > 0:
                dec.append(Upsample(widths[level], widths[level - 1]))
        dec.append(output_head(widths[0], in_channels))
        self.decoder = nn.Sequential(*dec)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        # (B, C, H, W) -> (B, latent, H/f, W/f)
        assert x.ndim == 4 and x.shape[1] == self.in_channels, (
            f"expected (B, {self.in_channels}, H, W), got {tuple(x.shape)}"
        )
        assert x.shape[-2] % self.downsample == 0 and x.shape[-1] % self.downsample == 0, (
            f"H and W must be multiples of {self.downsample}, got {tuple(x.shape[-2:])}"
        )
        return self.encoder(x)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        # (B, latent, h, w) -> (B, C, h*f, w*f)
        assert z.ndim == 4 and z.shape[1] == self.latent_channels, (
            f"expected (B, {self.latent_channels}, h, w), got {tuple(z.shape)}"
        )
        return self.decoder(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(x))  # (B, C, H, W)
