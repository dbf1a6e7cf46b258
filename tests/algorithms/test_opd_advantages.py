"""algorithms.opd_advantages: slime's on-policy distillation term, A' = A - coef * (student - teacher)."""
import pytest
import torch

from slime_like import algorithms as alg


def test_opd_subtracts_the_sampled_reverse_kl_on_valid_tokens():
    adv = torch.tensor([[1.0, 1.0, 1.0], [-0.5, -0.5, 0.0]])
    student = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.1, -9.0]])
    teacher = torch.tensor([[-2.0, -1.0, -0.5], [-1.0, -0.1, -1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    out, kl = alg.opd_advantages(adv, student, teacher, mask, coef=0.5)
    torch.testing.assert_close(kl, torch.tensor([[1.0, -1.0, 0.0], [-2.0, 0.0, 0.0]]))
    # the student over-confident vs the teacher (kl > 0): pushed down; under-confident: pushed up; pad: 0
    torch.testing.assert_close(out, torch.tensor([[0.5, 1.5, 1.0], [0.5, -0.5, 0.0]]))
    same, _ = alg.opd_advantages(adv, student, student, mask, coef=3.0)
    torch.testing.assert_close(same, adv * mask)  # a teacher equal to the student changes nothing


def test_opd_shapes_must_match():
    with pytest.raises(ValueError, match=r"opd_advantages: teacher_logp has shape \(2, 2\) but mask has \(2, 3\)"):
        alg.opd_advantages(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2, 3), 1.0)
