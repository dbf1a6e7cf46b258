"""The sampler and sampling-parameter validation on their own (no model, no server)."""
import pytest
import torch

from slime_like.backends.cpu_engine.sampling import BadRequest, SamplingParams, sample_next


def _sample(logits, t, p=1.0, k=-1, mp=0.0, seed=0):
    B = logits.shape[0]
    g = torch.Generator().manual_seed(seed)
    return sample_next(logits, torch.full((B,), t), torch.full((B,), p), torch.full((B,), k, dtype=torch.long),
                       torch.full((B,), mp), g)


def test_greedy_top_k_and_top_p_restrict_the_support():
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    best = logits.argmax(-1)
    assert torch.equal(_sample(logits, 0.0)[0], best)
    assert torch.equal(_sample(logits, 1.0, k=1)[0], best)
    assert torch.equal(_sample(logits, 1.0, p=1e-6)[0], best)
    top3 = logits.topk(3, dim=-1).indices
    for seed in range(20):
        tok = _sample(logits, 2.0, k=3, seed=seed)[0]
        assert all(int(t) in top3[i].tolist() for i, t in enumerate(tok))


def test_logprob_is_of_the_temperature_scaled_distribution_before_truncation():
    torch.manual_seed(1)
    logits = torch.randn(3, 30)
    tok, lp = _sample(logits, 0.5, k=5)
    ref = torch.log_softmax(logits / 0.5, -1).gather(-1, tok[:, None]).squeeze(-1)
    assert torch.allclose(lp, ref)
    tok, lp = _sample(logits, 0.0)
    assert torch.allclose(lp, torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1))


def test_per_row_parameters():
    logits = torch.zeros(2, 10)
    logits[:, 3] = 5.0
    t = torch.tensor([0.0, 100.0])  # row 0 greedy, row 1 near-uniform
    toks = [sample_next(logits, t, torch.ones(2), torch.full((2,), -1), torch.zeros(2),
                        torch.Generator().manual_seed(s))[0].tolist() for s in range(30)]
    assert all(r[0] == 3 for r in toks)
    assert len({r[1] for r in toks}) > 3


def test_sampling_params_validation():
    p = SamplingParams.from_dict({"max_new_tokens": 5, "stop": "x", "stop_token_ids": [3], "top_k": -1})
    assert p.stop == ["x"] and p.stop_token_ids == [3] and p.max_new_tokens == 5
    assert SamplingParams.from_dict(None).max_new_tokens == 128  # SGLang's default
    with pytest.raises(BadRequest, match="did you mean 'max_new_tokens'"):
        SamplingParams.from_dict({"max_new_token": 3})
    with pytest.raises(BadRequest, match="top_k"):
        SamplingParams.from_dict({"top_k": 0})
    with pytest.raises(BadRequest, match="top_p"):
        SamplingParams.from_dict({"top_p": 0.0})
    with pytest.raises(BadRequest, match="n must be 1"):
        SamplingParams.from_dict({"n": 4})
    assert SamplingParams.from_dict({"frequency_penalty": 0.0, "regex": None}).temperature == 1.0
