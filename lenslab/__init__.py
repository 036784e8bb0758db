"""lenslab: train small HookedTransformers (and paper 2's MNIST MLP) on synthetic tasks, and take them apart.

The calls a researcher starts with::

    from lenslab.training.config import mpsp_run_config, modadd_run_config, mnist_run_config
    from lenslab.training.trainer import train              # train(config, "runs/r09") -> summary
    from lenslab.training.run import Run                    # run = Run.open("runs/r09"); run.model(); run.split("validation")
    from lenslab.interp.ablation import Ablation, HeadTarget, evaluate_ablations   # evaluate_ablations(model, abls, run)
    from lenslab.interp.patching import cross_split_patching                       # validation vs counterfactual grids
    from lenslab.interp.fingerprints import weight_fingerprints                    # QK/OV per head, weights only
    from lenslab.interp.visual import accuracy_figure, attention_view, token_strings
    from lenslab.interp.spectral import trap_counts_over_run, alpha_table, detect_traps  # correlation traps, HTSR alpha
    from lenslab.interp.spectral import rescale_control, trap_pixel_maps               # paper 2's controls
    from lenslab.interp.norm_response import norm_response                          # the |x|^2 test on the MLP

The command line is ``lenslab`` (``lenslab --help``); the tutorials are in ``tutorials/``.
"""
