"""The CFDT's token grid: where its temporal transformer and wind scan run (no torch here).

The date encoder halves the resolution at each pyramid level after the first, so with
`len(widths)` levels one token of the coarsest level covers 2 ** (len(widths) - 1) pixels per
side: 8 for the 4 levels of the CFDT. Images must be multiples of it; the wind-scan orders are
computed for the grid it gives. The workflow, training and the memory estimator ask here
instead of repeating the formula.
"""

from __future__ import annotations

from collections.abc import Sequence


def token_stride(widths: Sequence[int]) -> int:
    """Pixels per side of one coarsest-level token of a CFDT with these level widths."""
    if len(widths) < 1:
        raise ValueError("widths: a CFDT has at least one level")
    return 2 ** (len(widths) - 1)


def token_grid(widths: Sequence[int], height: int, width: int) -> tuple[int, int]:
    """(rows, cols) of the coarsest-level token grid of a height x width image.

    ValueError (one line) when height or width is not a multiple of `token_stride(widths)`.
    """
    stride = token_stride(widths)
    if height % stride or width % stride or height < 1 or width < 1:
        raise ValueError(
            f"image {height}x{width} px: sides must be positive multiples of {stride} (the CFDT's coarsest level)"
        )
    return height // stride, width // stride
