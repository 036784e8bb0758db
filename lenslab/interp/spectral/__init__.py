"""Correlation traps (Prakash & Martin): outliers of the ESD of entry-shuffled weight matrices;
and HTSR α, the power-law exponent of each matrix's own ESD (``htsr``, as WeightWatcher reports it).

    from lenslab.interp.spectral import detect_traps, extract_matrices, scan_path
    rows = [detect_traps(w, name) for name, w in extract_matrices(model).matrices.items()]
    scan = scan_path("runs/demo")   # typed results per checkpoint; traps_command(...) is its JSON for the CLI
"""

from lenslab.interp.spectral.adapter import MatrixRef, MatrixSet, Skipped, extract_matrices, from_2d, plan_matrices, to_2d
from lenslab.interp.spectral.command import format_traps_table, traps_command
from lenslab.interp.spectral.controls import norm_matched_gaussian, norm_trap_correlation, rescale_control
from lenslab.interp.spectral.errors import SpectralError
from lenslab.interp.spectral.figures import esd_figure, trap_count_figure
from lenslab.interp.spectral.htsr import AlphaFit, alpha_table, esd, fit_power_law, htsr_alpha
from lenslab.interp.spectral.jsd import (
    JSDRow,
    default_probes,
    gaussian_probes,
    js_divergence,
    null_component,
    random_probes,
    replacement,
    trap_jsd,
)
from lenslab.interp.spectral.localization import TrapPixelMaps, trap_image_figure, trap_pixel_maps
from lenslab.interp.spectral.mp import mp_density, mp_edges, tw_center_scale
from lenslab.interp.spectral.paths import CheckpointScan, TrapScan, scan_path
from lenslab.interp.spectral.run import trap_counts_over_run
from lenslab.interp.spectral.scan import ScanJob, ScanOptions, scan_files, shard_files
from lenslab.interp.spectral.shuffle import make_generator, random_permutation, shuffle, unshuffle
from lenslab.interp.spectral.traps import TrapComponent, TrapRow, detect_traps, robust_fit, to_records
from lenslab.interp.spectral.ww import ww_fit

__all__ = [
    "AlphaFit",
    "CheckpointScan",
    "JSDRow",
    "MatrixRef",
    "MatrixSet",
    "ScanJob",
    "ScanOptions",
    "Skipped",
    "SpectralError",
    "TrapComponent",
    "TrapPixelMaps",
    "TrapRow",
    "TrapScan",
    "alpha_table",
    "default_probes",
    "detect_traps",
    "esd",
    "esd_figure",
    "extract_matrices",
    "fit_power_law",
    "format_traps_table",
    "from_2d",
    "gaussian_probes",
    "htsr_alpha",
    "js_divergence",
    "make_generator",
    "mp_density",
    "mp_edges",
    "norm_matched_gaussian",
    "norm_trap_correlation",
    "null_component",
    "plan_matrices",
    "random_permutation",
    "random_probes",
    "replacement",
    "rescale_control",
    "robust_fit",
    "scan_files",
    "scan_path",
    "shard_files",
    "shuffle",
    "to_2d",
    "to_records",
    "trap_count_figure",
    "trap_counts_over_run",
    "trap_image_figure",
    "trap_jsd",
    "trap_pixel_maps",
    "traps_command",
    "tw_center_scale",
    "unshuffle",
    "ww_fit",
]
