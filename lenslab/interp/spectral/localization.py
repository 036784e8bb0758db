"""Where a trap lives in the input: each trap of a first-layer matrix as an image (paper 2's
"prototype-like" pixel structures).

    maps = trap_pixel_maps(model, "layers.0.W", image_shape=(28, 28))
    maps.rows        # one row per trap: eigenvalue, effective_pixels, top5_pixel_mass, and the trap's own
                     # ipr / q_loc / top5_mass / top_sv_overlap (``detect_traps``)
    maps.images      # [n_traps, 28, 28]: the share of the trap component's squared mass on each pixel
    trap_image_figure(maps)

For a matrix W of shape ``[d_in, d_out]`` (the hooked MLP's orientation, one row per pixel), a trap's
rank-1 component C = s·u vᵀ of the shuffled matrix is mapped back through the inverse permutation
(``TrapComponent.in_original``), and pixel i gets p_i = ‖C_i,:‖² / ‖C‖²_F. ``effective_pixels`` =
1 / Σ p_i² (d_in for a flat map, 1 for one pixel); ``top5_pixel_mass`` = the mass on the top 5 % of
pixels (0.05 for a flat map). The first panel of the figure is W's own row mass ‖W_i,:‖² / ‖W‖²_F,
for comparison: MNIST's border pixels are always 0, so their rows never get a gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lenslab.interp.common import Table
from lenslab.interp.spectral.adapter import extract_matrices
from lenslab.interp.spectral.errors import SpectralError
from lenslab.interp.spectral.traps import detect_traps


@dataclass
class TrapPixelMaps:
    """The pixel maps of one matrix's traps (``trap_pixel_maps``): a row of metrics per trap, the images, and W's own row mass."""

    matrix: str
    image_shape: tuple[int, int]
    rows: Table  # one per trap, strongest first
    images: np.ndarray  # [n_traps, *image_shape]
    row_mass: np.ndarray  # [*image_shape]: W's own ‖W_i,:‖² / ‖W‖²_F


def _pixel_stats(p: np.ndarray) -> dict:
    k5 = max(1, math.ceil(0.05 * p.size))
    return {
        "effective_pixels": float(1.0 / np.sum(p**2)),
        "top5_pixel_mass": float(np.sort(p)[::-1][:k5].sum()),
        "peak_pixel": int(np.argmax(p)),
    }


def trap_pixel_maps(
    source,
    matrix: str = "layers.0.W",
    image_shape: tuple[int, int] = (28, 28),
    mode: str = "robust",
    seed: int = 0,
) -> TrapPixelMaps:
    """The trap components of ``matrix`` (one shuffle, seed ``seed``) as pixel-mass images; see the module docstring.

    ``source``: anything ``extract_matrices`` reads. The matrix's first axis must hold
    ``image_shape[0] * image_shape[1]`` inputs.
    """
    found = extract_matrices(source).matrices
    if matrix not in found:
        raise SpectralError(f"matrix={matrix!r} is not in the model; it has {list(found)}")
    w = found[matrix].double()
    n_pix = int(np.prod(image_shape))
    if w.shape[0] != n_pix:
        raise SpectralError(
            f"{matrix} has {w.shape[0]} input rows, not {n_pix} = {image_shape[0]}×{image_shape[1]}; pass the first layer "
            "(layers.0.W) or an image_shape that matches"
        )
    row, comps = detect_traps(w, matrix, mode=mode, seed=seed, return_components=True)
    if row.error:
        raise SpectralError(row.error)
    rows, images = Table(), []
    for i, (comp, loc) in enumerate(zip(comps, row.traps)):
        c = comp.in_original().double()
        p = (c**2).sum(1).numpy()
        p = p / p.sum()
        images.append(p.reshape(image_shape))
        rows.append({"matrix": matrix, "trap": i, **loc, **_pixel_stats(p)})
    row_mass = (w**2).sum(1).numpy()
    row_mass = row_mass / row_mass.sum()
    arr = np.stack(images) if images else np.zeros((0, *image_shape))
    return TrapPixelMaps(matrix, tuple(image_shape), rows, arr, row_mass.reshape(image_shape))


def trap_image_figure(maps: TrapPixelMaps, max_traps: int = 8, title: str | None = None) -> go.Figure:
    """W's row mass, then up to ``max_traps`` trap pixel maps, as heatmaps in one row (image orientation)."""
    n = min(len(maps.rows), max_traps)
    titles = [f"{maps.matrix}: row mass"] + [
        f"trap {r['trap']}: λ/λ₊ {r['over_lambda_plus']:.2f}, {r['effective_pixels']:.0f} px" for r in maps.rows[:n]
    ]
    fig = make_subplots(rows=1, cols=n + 1, subplot_titles=titles, horizontal_spacing=0.02)
    for j, img in enumerate([maps.row_mass, *maps.images[:n]]):
        fig.add_trace(go.Heatmap(z=img, colorscale="Viridis", showscale=False), row=1, col=j + 1)
        fig.update_yaxes(autorange="reversed", showticklabels=False, scaleanchor=f"x{j + 1 if j else ''}", row=1, col=j + 1)
        fig.update_xaxes(showticklabels=False, row=1, col=j + 1)
    fig.update_layout(
        title=title
        or f"Correlation traps of {maps.matrix} as {maps.image_shape[0]}×{maps.image_shape[1]} images "
        f"({len(maps.rows)} trap{'s' if len(maps.rows) != 1 else ''})",
        height=300,
        width=260 * (n + 1),
    )
    return fig
