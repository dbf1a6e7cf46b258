"""Shared fixtures for the algorithms tests: a seeded generator and random padded masks (float64)."""
import pytest
import torch


def _random_mask(batch: int, length: int, gen: torch.Generator, min_len: int = 1, holes: bool = False) -> torch.Tensor:
    lengths = torch.randint(min_len, length + 1, (batch,), generator=gen)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).double()
    if holes:
        # interior zeros: tool / environment tokens inside a multi-turn response
        mask = mask * (torch.rand(batch, length, generator=gen, dtype=torch.float64) > 0.25).double()
    return mask


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


@pytest.fixture
def make_mask(gen):
    """make_mask(batch, length, min_len=1, holes=False): right-padded 0/1 float64 mask, random lengths."""
    return lambda batch, length, min_len=1, holes=False: _random_mask(batch, length, gen, min_len, holes)


@pytest.fixture
def randn(gen):
    """randn(*shape): float64 standard normal from the seeded generator."""
    return lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)
