"""logprobs_from_logits / entropy_from_logits: plain loops, torch references, gradients, chunking, stability."""
import math

import pytest
import torch
from torch.testing import assert_close

from slime_like.algorithms import entropy_from_logits, logprobs_from_logits

F64 = torch.float64


def loop_logprob(row, label, temperature):
    xs = [x / temperature for x in row]
    m = max(xs)
    return xs[label] - (m + math.log(sum(math.exp(x - m) for x in xs)))


def loop_entropy(row):
    m = max(row)
    z = sum(math.exp(x - m) for x in row)
    ps = [math.exp(x - m) / z for x in row]
    return -sum(p * math.log(p) for p in ps if p > 0)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
@pytest.mark.parametrize("chunk_rows", [1, 4, 1024])
def test_logprobs_match_loop(randn, gen, temperature, chunk_rows):
    logits = randn(3, 5, 13) * 4
    labels = torch.randint(0, 13, (3, 5), generator=gen)
    got = logprobs_from_logits(logits, labels, temperature, chunk_rows=chunk_rows)
    want = [[loop_logprob(logits[b, t].tolist(), int(labels[b, t]), temperature) for t in range(5)] for b in range(3)]
    assert got.shape == labels.shape
    assert_close(got, torch.tensor(want, dtype=F64))


def test_logprobs_gradient_matches_log_softmax_autograd(randn, gen):
    logits = randn(4, 6, 17).requires_grad_(True)
    labels = torch.randint(0, 17, (4, 6), generator=gen)
    weights = randn(4, 6)
    (g_ours,) = torch.autograd.grad((logprobs_from_logits(logits, labels, 0.8, chunk_rows=5) * weights).sum(), logits)
    ref = torch.log_softmax(logits / 0.8, -1).gather(-1, labels[..., None]).squeeze(-1)
    (g_ref,) = torch.autograd.grad((ref * weights).sum(), logits)
    assert_close(g_ours, g_ref)


def test_logprobs_and_entropy_gradcheck(randn, gen):
    logits = randn(2, 3, 7).requires_grad_(True)
    labels = torch.randint(0, 7, (2, 3), generator=gen)
    assert torch.autograd.gradcheck(lambda x: logprobs_from_logits(x, labels, 0.9, chunk_rows=2), (logits,))
    assert torch.autograd.gradcheck(lambda x: entropy_from_logits(x, chunk_rows=4), (logits,))


def test_logprobs_stable_for_extreme_logits_and_low_precision(gen):
    logits = torch.tensor([[1e4, 0.0, -1e4], [-1e30, 0.0, 0.0]])
    lp = logprobs_from_logits(logits, torch.tensor([0, 1]))
    assert torch.isfinite(lp).all()
    assert_close(lp, torch.tensor([0.0, math.log(0.5)]))
    bf16 = torch.randn(6, 50, generator=gen).to(torch.bfloat16)
    labels = torch.randint(0, 50, (6,), generator=gen)
    out = logprobs_from_logits(bf16, labels)
    assert out.dtype == torch.float32  # computed in fp32, not bf16
    assert_close(out, torch.log_softmax(bf16.float(), -1).gather(-1, labels[:, None]).squeeze(-1))


def test_logprobs_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="leading dims"):
        logprobs_from_logits(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="label ids"):
        logprobs_from_logits(torch.zeros(2, 5), torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="temperature"):
        logprobs_from_logits(torch.zeros(2, 5), torch.tensor([0, 1]), temperature=0.0)


def test_logprobs_large_vocab_chunked_equals_unchunked(gen):
    """A 150k vocabulary in 8-row chunks: same values as one chunk and as torch's log_softmax."""
    logits = torch.randn(24, 151_936, generator=gen)
    labels = torch.randint(0, 151_936, (24,), generator=gen)
    chunked = logprobs_from_logits(logits, labels, chunk_rows=8)
    assert_close(chunked, logprobs_from_logits(logits, labels, chunk_rows=1024))
    assert_close(chunked, torch.log_softmax(logits, -1).gather(-1, labels[:, None]).squeeze(-1))


def test_entropy_matches_loop_and_torch(randn):
    logits = randn(3, 4, 11) * 3
    got = entropy_from_logits(logits, chunk_rows=5)
    want = [[loop_entropy(logits[b, t].tolist()) for t in range(4)] for b in range(3)]
    assert_close(got, torch.tensor(want, dtype=F64))
    assert_close(got, torch.distributions.Categorical(logits=logits).entropy())


def test_entropy_hand_values_and_masked_vocab():
    uniform = torch.zeros(1, 8)
    assert_close(entropy_from_logits(uniform), torch.tensor([math.log(8)]))
    # -inf logits (a masked-out vocabulary slot) have p = 0 and contribute nothing, not NaN
    x = torch.tensor([[0.0, 0.0, float("-inf")]], requires_grad=True)
    h = entropy_from_logits(x)
    assert_close(h, torch.tensor([math.log(2)]))
    h.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert_close(x.grad, torch.zeros(1, 3))  # uniform over the two live slots is a maximum: zero gradient


def _saved_bytes(fn, logits):
    """Bytes autograd keeps for backward, counting each storage once and ignoring the logits' own storage."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(logits)
    storages.pop(logits.untyped_storage().data_ptr(), None)
    return out, sum(storages.values())


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_logprobs_keep_no_full_vocab_copy_for_backward(gen, temperature):
    """The reference log_softmax(x / T).gather keeps >= one [N, V] copy alive until backward; ours keeps O(N)."""
    n, v = 64, 4096
    logits = torch.randn(n, v, generator=gen).requires_grad_(True)
    labels = torch.randint(0, v, (n,), generator=gen)
    ours, ours_bytes = _saved_bytes(lambda x: logprobs_from_logits(x, labels, temperature, chunk_rows=16), logits)
    ref, ref_bytes = _saved_bytes(
        lambda x: torch.log_softmax(x / temperature, -1).gather(-1, labels[:, None]).squeeze(-1), logits)
    full = n * v * logits.element_size()
    assert ref_bytes >= full          # the naive path really holds a full copy
    assert ours_bytes <= 64 * n       # labels + one logsumexp per row, nothing of size V
    assert_close(ours, ref)
    ent, ent_bytes = _saved_bytes(lambda x: entropy_from_logits(x, chunk_rows=16), logits)
    assert ent_bytes <= 64 * n
    assert_close(ent, torch.distributions.Categorical(logits=logits.detach()).entropy())
