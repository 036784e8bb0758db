"""Helpers shared by the spectral tests (importable by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

P = 13  # modular-addition modulus of the tiny run fixture


def planted(n: int, m: int, spikes: list[float], seed: int = 0) -> torch.Tensor:
    """N(0, 1) entries with ``len(spikes)`` entries set to the given huge values at random positions."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, m, generator=g, dtype=torch.float64)
    idx = torch.randperm(n * m, generator=g)[: len(spikes)]
    w.view(-1)[idx] = torch.tensor(spikes, dtype=torch.float64)
    return w


# planted spikes per matrix of the synthetic shard folder (an empty list: a pure Gaussian matrix)
SPIKES = {"layers.0.mlp.up.weight": [40.0, 30.0], "layers.1.attn.q.weight": [30.0], "lm_head.weight": []}


def write_shard_folder(folder: Path) -> dict[str, torch.Tensor]:
    """Two HF-style shards plus an index in ``folder``: planted traps in two matrices, a pure
    Gaussian matrix, a bias, a 1×M and a NaN matrix. Returns the tensors written."""
    nan = planted(64, 32, [float("nan")], seed=4).float()
    a = {
        "layers.0.mlp.up.weight": planted(256, 64, SPIKES["layers.0.mlp.up.weight"], seed=1).float(),
        "layers.0.mlp.up.bias": torch.zeros(256),
        "tiny.weight": planted(1, 64, [], seed=5).float(),
    }
    b = {
        "layers.1.attn.q.weight": planted(160, 160, SPIKES["layers.1.attn.q.weight"], seed=2).float(),
        "lm_head.weight": planted(200, 40, [], seed=3).float(),
        "broken.weight": nan,
    }
    save_file(a, str(folder / "model-00001-of-00002.safetensors"))
    save_file(b, str(folder / "model-00002-of-00002.safetensors"))
    weight_map = {k: "model-00001-of-00002.safetensors" for k in a} | {k: "model-00002-of-00002.safetensors" for k in b}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return {**a, **b}


def same_result(a: dict, b: dict) -> bool:
    """Same matrices, counts and errors; floats equal to 1e-9 (thread counts change the last bits)."""
    ra, rb = a["checkpoints"][0]["matrices"], b["checkpoints"][0]["matrices"]
    return [(r["name"], r["n_traps"], r["error"]) for r in ra] == [(r["name"], r["n_traps"], r["error"]) for r in rb] and all(
        x["error"] or x["lambda_plus"] == pytest.approx(y["lambda_plus"], rel=1e-9) for x, y in zip(ra, rb)
    )
