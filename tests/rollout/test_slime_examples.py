"""slime's own examples, their files unchanged (a checkout of THUDM/slime at SLIME_SRC; skipped without one: slime's
code is not part of this repository). Each example whose Python imports slime.* passes the preflight (its functions
import through slime_like's names and accept the arguments they will be called with), except where a third-party
package it needs is not installed here, which the preflight names; search-r1 (against a local stub of its retrieval
server) and retool (its own local Python sandbox) run a rollout against the CPU engine."""
import asyncio
import json
import os
import sys

import pytest
from aiohttp import web

from slime_like.args import parse_run
from slime_like.config.errors import ConfigError
from slime_like.rollout.controller import RolloutController
from slime_like.sample import Status

SLIME = os.environ.get("SLIME_SRC", "")
EX = os.path.join(SLIME, "examples")
pytestmark = pytest.mark.skipif(not os.path.isdir(os.path.join(EX, "retool")),
                                reason="set SLIME_SRC to a checkout of THUDM/slime (its examples are read unchanged)")

# example -> (directory its run script puts on PYTHONPATH, the flags of its run script that name its Python)
EXAMPLES = {
    "coding_agent_rl": ("", ["--custom-generate-function-path", "examples.coding_agent_rl.generate.generate"]),
    "geo3k_vlm_multi_turn": ("", ["--custom-generate-function-path", "examples.geo3k_vlm_multi_turn.rollout.generate",
                                  "--custom-config-path",
                                  "examples/geo3k_vlm_multi_turn/geo3k_vlm_multi_turn_config.yaml"]),
    "multi_agent": ("", ["--custom-generate-function-path",
                         "examples.multi_agent.rollout_with_multi_agents.generate_with_multi_agents"]),
    "strands_sglang": ("", ["--custom-generate-function-path", "examples.strands_sglang.generate_with_strands.generate",
                            "--custom-rm-path", "examples.strands_sglang.generate_with_strands.reward_func"]),
    "retool": ("examples/retool", ["--custom-generate-function-path", "generate_with_retool.generate",
                                   "--custom-rm-path", "generate_with_retool.reward_func"]),
    "search-r1": ("examples/search-r1", ["--custom-generate-function-path", "generate_with_search.generate",
                                         "--custom-rm-path", "generate_with_search.reward_func"]),
    "tau-bench": ("examples/tau-bench", ["--custom-generate-function-path", "generate_with_tau.generate"]),
    "train_infer_mismatch_helper": ("", ["--use-tis", "--custom-config-path",
                                         "examples/train_infer_mismatch_helper/mis.yaml", "--custom-tis-function-path",
                                         "examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp"]),
}
# stopped by the preflight, naming why: a third-party package not installed here (named, not faked), or a slime
# name slime_like refuses (docs/guide.md "Bringing slime code")
STOPPED = {"strands_sglang": "No module named 'strands'", "tau-bench": "No module named 'tau_bench'",
           "geo3k_vlm_multi_turn": r"slime.utils.processing_utils.build_processor_kwargs is not provided",
           "coding_agent_rl": r"slime.agent \(Claude Code / Codex harnesses in E2B sandboxes\) is not provided"}


@pytest.fixture
def in_slime(monkeypatch, tmp_path):
    """As slime's run scripts (`examples.X` importable, the checkout the working directory), but with only its
    examples/ reachable: the checkout's own `slime` package must not be importable, so `slime.*` are slime_like's
    names (a real slime is never shadowed, so with it on the path the examples would run slime's code)."""
    (tmp_path / "examples").symlink_to(EX)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "slime" or m.startswith("slime.")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    from slime_like.utils.slime_names import provided

    assert provided(), "slime.* resolved to another package"


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_each_example_passes_the_preflight(name, in_slime, monkeypatch, tiny_ckpt, prompt_file):
    where, flags = EXAMPLES[name]
    if where:
        monkeypatch.syspath_prepend(os.path.join(SLIME, where))
    argv = ["--hf-checkpoint", tiny_ckpt, "--prompt-data", prompt_file([{"prompt": "1+1=", "label": "2"}]),
            "--input-key", "prompt", "--label-key", "label", "--rollout-batch-size", "1", "--num-rollout", "1",
            "--colocate", "--actor-num-gpus-per-node", "1", "--num-gpus-per-node", "1",
            "--rollout-max-response-len", "8", *flags]
    if name in STOPPED:
        with pytest.raises(ConfigError, match=STOPPED[name]):
            parse_run(argv, exit_on_error=False, preflight=True)
    else:
        parse_run(argv, exit_on_error=False, preflight=True)


async def _retrieval_stub(hits: list):
    """A local stand-in of search-r1's retrieval server (POST /retrieve {queries, topk} -> passages)."""
    async def retrieve(request):
        body = await request.json()
        hits.append(body)
        # items as search-r1's local_search reads them: {"contents": '"title"\\ntext'}
        return web.json_response({"result": [[{"contents": f'"T{i}"\\nabout {q}'} for i in range(body["topk"])]
                                             for q in body["queries"]]})
    app = web.Application()
    app.router.add_post("/retrieve", retrieve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]


def test_search_r1_runs_a_rollout_against_a_stub_retriever(in_slime, monkeypatch, engine_url, make_args, prompt_file):
    monkeypatch.syspath_prepend(os.path.join(SLIME, "examples", "search-r1"))
    import generate_with_search as ex

    hits = []
    loop = asyncio.new_event_loop()
    runner, port = loop.run_until_complete(_retrieval_stub(hits))
    monkeypatch.setitem(ex.SEARCH_R1_CONFIGS["local"], "search_url", f"http://127.0.0.1:{port}/retrieve")
    try:
        # the example's own search tool against the stub (the tiny model rarely writes a <search> tag itself)
        text = loop.run_until_complete(ex.search("who wrote it"))
        assert "about who wrote it" in text and "No snippet" not in text and hits[0]["queries"] == ["who wrote it"]
        rows = [{"prompt": f"Question {i}: who?", "reward_model": {"ground_truth": {"target": ["x"]}}}
                for i in range(2)]
        args = make_args(prompt_file(rows), "--input-key", "prompt", "--label-key", "reward_model",
                         "--rollout-batch-size", 2, "--n-samples-per-prompt", 2, "--rollout-max-response-len", 16,
                         "--custom-generate-function-path", "generate_with_search.generate",
                         "--custom-rm-path", "generate_with_search.reward_func")
        samples, _ = RolloutController(args, [engine_url]).generate(0)
    finally:
        loop.run_until_complete(runner.cleanup())
        loop.close()
    assert len(samples) == 4
    for s in samples:
        assert s.status in (Status.COMPLETED, Status.TRUNCATED) and isinstance(s.reward, (int, float))
        assert s.response_length == len(s.loss_mask) == len(s.rollout_log_probs) > 0


@pytest.fixture(scope="module")
def long_context_engine(tmp_path_factory):
    """retool's system prompt with its tool spec is ~820 characters: a tiny model with a 2048-token context."""
    from rollout.conftest import start_cpu_engine
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("long_ctx")
    ckpt = build_tiny_checkpoint(str(root / "ckpt"), max_position_embeddings=2048)
    proc, url = start_cpu_engine(ckpt, str(root / "engine.log"))
    yield ckpt, url
    proc.terminate()
    proc.wait(timeout=30)


def test_retool_runs_a_rollout_with_its_own_sandbox(in_slime, monkeypatch, long_context_engine, make_args,
                                                     prompt_file):
    ckpt, engine_url = long_context_engine
    monkeypatch.syspath_prepend(os.path.join(SLIME, "examples", "retool"))
    import generate_with_retool as ex

    # the example's own sandbox runs a tool call locally (a subprocess with its own limits)
    out = asyncio.run(ex.tool_registry.execute_tool("code_interpreter", {"code": "print(6 * 7)"}))
    assert "42" in out
    rows = [{"prompt": f"What is {i} + {i}?", "label": str(2 * i)} for i in range(2)]
    args = make_args(prompt_file(rows), "--hf-checkpoint", ckpt, "--input-key", "prompt", "--label-key", "label",
                     "--reward-key", "score",
                     "--rollout-batch-size", 2, "--n-samples-per-prompt", 2, "--rollout-max-response-len", 16,
                     "--custom-generate-function-path", "generate_with_retool.generate",
                     "--custom-rm-path", "generate_with_retool.reward_func",
                     "--use-dynamic-batch-size", "--max-tokens-per-gpu", 2048)     # as its run script's PERF_ARGS
    samples, _ = RolloutController(args, [engine_url]).generate(0)
    assert len(samples) == 4
    for s in samples:
        assert s.status in (Status.COMPLETED, Status.TRUNCATED) and isinstance(s.reward, dict)
        assert s.response_length == len(s.loss_mask) == len(s.rollout_log_probs) > 0


def test_multi_agent_runs_a_rollout(in_slime, long_context_engine, make_args, prompt_file):
    """multi_agent: solver / rewriter / selector agents through post(), graded by batched_async_rm (--rm-type
    deepscaler, as its run script), several trainable samples per prompt (a list returned)."""
    ckpt, engine_url = long_context_engine
    rows = [{"prompt": f"What is {i} + {i}?", "label": str(2 * i)} for i in range(2)]
    args = make_args(prompt_file(rows), "--hf-checkpoint", ckpt, "--input-key", "prompt", "--label-key", "label",
                     "--rm-type", "deepscaler", "--rollout-batch-size", 1, "--n-samples-per-prompt", 1,
                     "--rollout-max-context-len", 2000, "--rollout-max-response-len", 8,
                     "--custom-generate-function-path",
                     "examples.multi_agent.rollout_with_multi_agents.generate_with_multi_agents")
    samples, _ = RolloutController(args, [engine_url]).generate(0)
    assert len(samples) > 1                                       # the agents' samples of one prompt
    for s in samples:
        assert s.response_length == len(s.loss_mask) == len(s.rollout_log_probs) > 0 and s.reward is not None
