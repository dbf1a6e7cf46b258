"""The CPU engine's repetition_penalty against transformers' own RepetitionPenaltyLogitsProcessor (a real peer)."""
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from slime_like.backends.cpu_engine.sampling import BadRequest, SamplingParams, apply_repetition_penalty


def test_matches_transformers():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 50, generator=g) * 3
    seen = [3, 7, 7, 12, 49, 0]
    for penalty in (1.3, 0.7):
        ours = logits[0].clone()
        apply_repetition_penalty(ours, seen, penalty)
        theirs = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([seen]), logits.clone())[0]
        assert torch.allclose(ours, theirs)
        assert not torch.equal(ours, logits[0])


def test_request_values_are_checked():
    assert SamplingParams.from_dict({"repetition_penalty": 1.2}).repetition_penalty == 1.2
    try:
        SamplingParams.from_dict({"repetition_penalty": 0})
    except BadRequest as e:
        assert "repetition_penalty" in str(e) and "0.0" in str(e)
    else:
        raise AssertionError("repetition_penalty 0 accepted")
