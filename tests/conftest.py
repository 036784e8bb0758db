"""Every annotation in ``lenslab`` is checked at test time (issue 17).

jaxtyping's import hook decorates each function and dataclass of the package, as it is imported,
with ``jaxtyped(typechecker=beartype)``: shapes in ``Float[Tensor, "batch pos d_model"]`` must
agree across a call's arguments and its return value, and plain annotations must hold. The hook
is installed here, in the root conftest, before any test module imports ``lenslab``. Beartype's
PEP 484 numeric tower is on, so an ``int`` satisfies ``float`` as the typing spec says.
"""

import jaxtyping

jaxtyping.install_import_hook("lenslab", "beartype.beartype(conf=beartype.BeartypeConf(is_pep484_tower=True))")
