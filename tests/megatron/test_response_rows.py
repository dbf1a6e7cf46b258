"""The Megatron trainer projects only the response-scoring positions through the output layer (issue 26, memory;
backends/megatron/response_rows.py): log-probs, reference log-probs, the step's metrics and the weights after an SGD
step (so the gradients) equal the whole-output path, padded and packed, TP=2 (vocabulary-parallel output layer),
PP=2 (the head on the last stage only) and CP=2 (each rank's chunks); the sequence-parallel gather of the hook
keeps the output layer's outputs and gradients (megatron-core's ColumnParallelLinear, TP=2 over gloo)."""
import pytest
import torch
from _dist import run_ranks
from test_trainer_common import flat, make_args, make_batch

pytestmark = pytest.mark.slow
# SGD without momentum: the update is lr x gradient, so equal weights after a step mean equal gradients
FLAGS = ("--lr", "1e-2", "--optimizer", "sgd", "--sgd-momentum", "0", "--global-batch-size", "8",
         "--micro-batch-size", "2", "--use-kl-loss", "--kl-loss-coef", "0.1", "--entropy-coef", "0.01",
         "--normalize-advantages")
PACKED = ("--use-dynamic-batch-size", "--max-tokens-per-gpu", "30")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("rows_tiny")
    # a reference other than the actor, so the KL term and its gradient are not zero
    return (build_tiny_checkpoint(str(root / "actor"), init_std=0.1),
            build_tiny_checkpoint(str(root / "ref"), seed=1, init_std=0.1))


def step_rank(rank, world_size, port, ckpts, responses_only, parallel):
    from slime_like.args import role_args
    from slime_like.backends.megatron.trainer import MegatronTrainer

    MegatronTrainer.project_responses_only = responses_only
    actor, ref = ckpts
    args = make_args(actor, "--actor-num-gpus-per-node", world_size, "--load", actor, "--ref-load", ref, *FLAGS,
                     *parallel)
    t = MegatronTrainer(role_args(args, "actor"), role="actor", rank=rank, world_size=world_size, master_port=port)
    assert t.ps.get_data_parallel_world_size() == 1  # every rank sees the whole batch
    rows = []  # positions the actor's output layer projected, per call (the last stage's ranks)
    head = getattr(t.chunks[-1], "output_layer", None)
    if t.chunks[-1].post_process:
        head.register_forward_hook(lambda module, args, output: rows.append(output[0].shape[0]))
    batch = make_batch(8, seed=5, with_holes=True)
    batch.update(t.compute_log_probs(batch))
    batch.update(t.compute_advantages(batch))
    out = {"log_probs": batch["log_probs"], "ref_log_probs": batch["ref_log_probs"], "metrics": t.train_step(0, batch)}
    out["weights"] = {n: w.clone() for n, w in t.iter_hf_weights()}
    out["rows"] = t.comm.from_last_stage(sum(rows))
    return out


CASES = {"padded": (1, ()), "packed": (1, PACKED),
         "tp2": (2, ("--tensor-model-parallel-size", "2")),
         "pp2-packed": (2, ("--pipeline-model-parallel-size", "2", *PACKED)),
         "cp2-packed": (2, ("--context-parallel-size", "2", *PACKED))}


@pytest.mark.parametrize("case", list(CASES))
def test_response_rows_equal_the_whole_output(ckpts, case):
    world, parallel = CASES[case]
    only = run_ranks(step_rank, world, ckpts, True, parallel, timeout=480.0)[0]
    whole = run_ranks(step_rank, world, ckpts, False, parallel, timeout=480.0)[0]
    for key in ("log_probs", "ref_log_probs"):
        assert (flat(only[key]) - flat(whole[key])).abs().max().item() < 1e-5, key
    for key in ("loss", "pg_loss", "entropy", "kl_loss", "grad_norm"):
        assert only["metrics"][key] == pytest.approx(whole["metrics"][key], rel=1e-5, abs=1e-6), key
    assert abs(only["metrics"]["kl_loss"]) > 1e-4 and only["metrics"]["entropy"] > 0.1
    worst = max((only["weights"][n] - whole["weights"][n]).abs().max().item() for n in whole["weights"])
    assert worst < 1e-7, worst  # SGD lr 1e-2: gradients equal to 1e-5
    assert only["rows"] < whole["rows"] * 0.8, (only["rows"], whole["rows"])  # the prompts were not projected


def sequence_parallel_rank(rank, world_size, port):
    """TP=2 with sequence parallelism: the output layer over [S/tp, b, H] halves; whole output then the positions,
    vs the hook's gather + positions. Returns the worst differences of the output, the input's gradient and the
    weight's gradient, and whether the layer's flag came back."""
    from megatron.core import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear

    from slime_like.backends.megatron import parallel
    from slime_like.backends.megatron.response_rows import ResponseRows, projecting

    parallel.init_distributed(rank, world_size, master_port=port, tp=world_size)
    config = ModelParallelConfig(tensor_model_parallel_size=world_size, sequence_parallel=True,
                                 use_cpu_initialization=True, params_dtype=torch.float32)
    layer = ColumnParallelLinear(8, 12, config=config, init_method=torch.nn.init.normal_, bias=False,
                                 gather_output=False)

    class Head(torch.nn.Module):  # what the hook looks for: a module holding `response_rows`
        def __init__(self):
            super().__init__()
            self.output_layer = layer
            self.response_rows = ResponseRows(layer)

        def forward(self, hidden):
            return self.output_layer(hidden)[0]

    head = Head()
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(6, 2, 8, generator=g)  # [S, b, H], the same on both ranks; each holds 3 positions
    upstream = torch.randn(2, 3, 12, generator=g)[..., rank * 6:(rank + 1) * 6]  # d loss / d logits, its slice
    positions = torch.tensor([[1, 4, 5], [0, 2, 3]])  # [b, P]
    results = []
    for only in (False, True):
        local = hidden[rank * 3:(rank + 1) * 3].clone().requires_grad_()
        layer.weight.grad = None
        with projecting(head, positions if only else None):
            out = head(local)  # [S or P, b, V/tp]
        if not only:
            out = out[positions.t(), torch.arange(2)[None, :]]
        (out * upstream.transpose(0, 1)).sum().backward()
        results.append((out.detach(), local.grad, layer.weight.grad.clone()))
    (o1, h1, w1), (o2, h2, w2) = results
    return ((o1 - o2).abs().max().item(), (h1 - h2).abs().max().item(), (w1 - w2).abs().max().item(),
            h2.abs().max().item(), layer.sequence_parallel)


def test_sequence_parallel_gather_keeps_outputs_and_gradients():
    for out, grad_in, grad_w, size, flag in run_ranks(sequence_parallel_rank, 2):
        assert out < 1e-6 and grad_in < 1e-6 and grad_w < 1e-6, (out, grad_in, grad_w)
        assert size > 1e-3 and flag is True
