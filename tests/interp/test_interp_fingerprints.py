import pytest
import torch
from interp_handmade import N_VALUES, fingerprint_model, random_tokens
from transformer_lens import utilities as utils

from lenslab.interp.common import InterpError
from lenslab.interp.fingerprints import activation_fingerprints, head_fingerprint, qk_circuit, weight_fingerprints


@pytest.mark.parametrize("mode", ["weights", "activations"])
def test_hand_set_heads(mode):
    model = fingerprint_model()
    rows = weight_fingerprints(model, N_VALUES, 2) if mode == "weights" else activation_fingerprints(model, random_tokens(300), 2)
    h0, h1 = rows
    assert h0["qk_rho"] == pytest.approx(1.0)  # score == key value: perfectly monotone
    assert h0["ov_parity_rho"] == pytest.approx(1.0)  # writes +1/2 to its own parity class, -1/2 to the other
    assert h1["pos0_mass"] > 0.999  # score 40 on position 0, 0 elsewhere
    assert h0["pos0_mass"] < 0.5
    assert abs(h1["qk_rho"]) < (1e-9 if mode == "weights" else 0.15)  # position-only scores carry no value ranking


def test_negated_unembedding_flips_ov_parity():
    rows = weight_fingerprints(fingerprint_model(ov_sign=-1.0), N_VALUES, 2)
    assert rows[0]["ov_parity_rho"] == pytest.approx(-1.0)


def test_weights_pos0_mass_matches_brute_force():
    """pos0_mass from weights = exact mean over all value sequences of the readout's attention to position 0."""
    model = fingerprint_model()
    import itertools

    seqs = torch.tensor(list(itertools.product(range(N_VALUES), repeat=4)))
    tokens = torch.cat([seqs, torch.full((len(seqs), 1), N_VALUES)], 1)
    _, cache = model.run_with_cache(tokens)
    brute = cache[utils.get_act_name("pattern", 0)][:, :, -1, 0].mean(0)
    rows = weight_fingerprints(model, N_VALUES, 2)
    # weights-only vs a cached forward: float32 softmax of the same scores summed in another order, O(1) values
    assert [r["pos0_mass"] for r in rows] == pytest.approx(brute.tolist(), abs=1e-6)


def test_virtual_qk_circuit_equals_layer0_scores(trained, splits):
    """Layer 0, with LayerNorm: the factored QK circuit on LN(embeddings) reproduces hook_attn_scores."""
    tokens = splits["validation_tokens"][:16]
    _, cache = trained.run_with_cache(tokens)
    resid = cache[utils.get_act_name("resid_pre", 0)]
    x = trained.blocks[0].ln1(resid)
    x = torch.cat([x, torch.ones(*x.shape[:2], 1)], -1)
    for head in range(trained.cfg.n_heads):
        qk = qk_circuit(trained, 0, head)
        scores = torch.stack([(x[i, -1:] @ qk @ x[i].T).AB[0] for i in range(len(tokens))])
        # FactoredMatrix products (x W_Q W_K^T x^T associated differently) vs the model's einsum: float32 scores of
        # O(10-100) with reordered d_model sums; ~1e-5 observed, 1e-4 for other kernels and thread counts
        torch.testing.assert_close(scores, cache[utils.get_act_name("attn_scores", 0)][:, head, -1], atol=1e-4, rtol=1e-4)


def test_values_in_range_and_bad_head(trained, splits):
    rows = weight_fingerprints(trained, 8, 2) + activation_fingerprints(trained, splits["validation_tokens"], 2)
    assert len(rows) == 8
    for r in rows:
        assert -1 <= r["qk_rho"] <= 1 and -1 <= r["ov_parity_rho"] <= 1 and 0 <= r["pos0_mass"] <= 1
    with pytest.raises(InterpError, match=r"head=2 .*0\.\.1"):
        head_fingerprint(trained, 0, 2, 8, 2)
