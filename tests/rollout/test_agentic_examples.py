"""slime's agentic examples as their published interface (agentic_examples_for_tests.py; no slime checkout needed):
retool, search-r1 and tau-bench run rollouts against the CPU engine through --custom-generate-function-path /
--custom-rm-path, with their external services stood in for by one local server on 127.0.0.1: a Python sandbox
(retool's tool_sandbox runs code in a subprocess), a retrieval server (search-r1's /retrieve) and a tau-bench
environment (its tools and its LLM-simulated user, scripted); multi_agent's graders are a remote reward model on the
same server (--rm-type remote_rm), so the rewards its agents set during generation are told apart from a re-score. Each checks that the trained tokens are the model's
and the service's output is in the sequence, untrained, and that the samples make a training batch."""
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from slime_like.rollout.batch import to_train_batch
from slime_like.rollout.controller import RolloutController
from slime_like.sample import Status
from slime_like.utils.slime_names import install

install()   # the stand-ins import slime.* as the examples do (what loading them by --custom-*-path does)
from rollout import agentic_examples_for_tests as ex  # noqa: E402

MOD = "rollout.agentic_examples_for_tests"
CALLS = []


class _Services(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        CALLS.append((self.path, body))
        if self.path == "/run":        # retool's sandbox: the code in a fresh, isolated interpreter
            done = subprocess.run([sys.executable, "-I", "-c", body["code"]], capture_output=True, text=True,
                                  timeout=20)
            out = {"output": (done.stdout + done.stderr).strip()}
        elif self.path == "/retrieve":
            out = {"result": [[{"document": {"contents": f'"T{i}"\nabout {q}'}, "score": 1.0 / (i + 1)}
                               for i in range(body["topk"])] for q in body["queries"]]}
        elif self.path == "/reward":   # a remote reward model: every answer scores 1
            out = 1.0
        elif self.path == "/reset":
            out = {"wiki": "You are a store agent.", "observation": f"Where is order A{body['task_index']}?"}
        else:                          # /step: the tool's answer, then the simulated user ends the episode
            tool = body["action"]["name"] != "respond"
            out = {"observation": "shipped" if tool else "thanks, bye", "reward": 0.0 if tool else 1.0,
                   "done": not tool, "info": {"task": body["task_index"]}}
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module", autouse=True)
def services():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Services)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ex.TOOL_URL["url"] = f"http://127.0.0.1:{server.server_address[1]}"
    yield
    server.shutdown()


def _rollout(engine_url, make_args, prompt_file, rows, *flags):
    args = make_args(prompt_file(rows), "--rollout-batch-size", 2, "--n-samples-per-prompt", 2,
                     "--rollout-max-response-len", 8, *flags)
    samples, _ = RolloutController(args, [engine_url]).generate(0)
    batch = to_train_batch(args, samples)            # what the trainer is given
    assert len(batch["tokens"]) == len(samples) == 4
    return args, samples


def _flat(text: str) -> str:
    # the tiny char tokenizer encodes no newline and its decode drops spaces: compare text without whitespace
    return text.replace("\n", "").replace(" ", "")


def _segments(tokenizer, s):
    """The response's runs of equal loss mask, decoded: [(mask, text), ...]."""
    resp, out = s.tokens[len(s.tokens) - s.response_length:], []
    for tok, m in zip(resp, s.loss_mask):
        if out and out[-1][0] == m:
            out[-1][1].append(tok)
        else:
            out.append((m, [tok]))
    return [(m, tokenizer.decode(ids)) for m, ids in out]


def test_retool_shape(engine_url, make_args, prompt_file):
    CALLS.clear()
    rows = [{"q": f"What is {i} + {i}?", "a": str(2 * i)} for i in range(2)]
    args, samples = _rollout(engine_url, make_args, prompt_file, rows, "--reward-key", "score",
                             "--custom-generate-function-path", f"{MOD}.retool_generate",
                             "--custom-rm-path", f"{MOD}.retool_reward")
    assert [p for p, _ in CALLS].count("/run") >= 4
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.hf_checkpoint)
    for s in samples:
        assert s.status in (Status.COMPLETED, Status.TRUNCATED) and s.tool_call_count >= 1
        assert set(s.reward) >= {"score", "acc", "pred"} and s.reward["score"] <= 0   # a wrong answer, and the bonus
        assert s.response_length == len(s.loss_mask) == len(s.rollout_log_probs) > 0
        segs = _segments(tok, s)
        assert (0, _flat("\n<interpreter>\n42\n</interpreter>\n")) in segs           # the sandbox's output, untrained
        trained = [i for i, m in enumerate(s.loss_mask) if m]
        assert trained and all(s.rollout_log_probs[i] < 0 for i in trained)  # the engine's log-probs
        assert all(s.rollout_log_probs[i] == 0 for i, m in enumerate(s.loss_mask) if not m)


def test_search_r1_shape(engine_url, make_args, prompt_file):
    CALLS.clear()
    rows = [{"q": f"Question {i}: who?", "a": {"ground_truth": {"target": ["x"]}}} for i in range(2)]
    args, samples = _rollout(engine_url, make_args, prompt_file, rows,
                             "--custom-generate-function-path", f"{MOD}.search_r1_generate",
                             "--custom-rm-path", f"{MOD}.search_r1_reward")
    queries = [b["queries"] for p, b in CALLS if p == "/retrieve"]
    assert len(queries) >= 4 and all(b["topk"] == 2 for p, b in CALLS if p == "/retrieve")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.hf_checkpoint)
    for s in samples:
        assert s.status in (Status.COMPLETED, Status.TRUNCATED) and s.reward in (0.0, 1.0)
        assert s.response_length == len(s.loss_mask) == len(s.rollout_log_probs) > 0
        prompt_ids = tok(s.prompt, add_special_tokens=False)["input_ids"]
        assert s.tokens[:len(prompt_ids)] == prompt_ids and len(s.tokens) == len(prompt_ids) + s.response_length
        info = [text for m, text in _segments(tok, s) if m == 0]
        assert any(_flat("<information>Doc 1: \"T0\"\nabout ") in t for t in info)


def test_tau_bench_shape(engine_url, make_args, prompt_file):
    """tau-bench returns a NEW Sample (index = its task, status the plain string "completed", no log-probs): the
    rollout files it in its prompt's group and the trainer batch takes it."""
    CALLS.clear()
    rows = [{"q": str(i), "a": None} for i in range(2)]
    args, samples = _rollout(engine_url, make_args, prompt_file, rows,
                             "--custom-generate-function-path", f"{MOD}.tau_generate")
    assert sorted(b["task_index"] for p, b in CALLS if p == "/reset") == [0, 0, 1, 1]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.hf_checkpoint)
    assert sorted((s.group_index, s.index) for s in samples) == [(0, 0), (0, 0), (1, 1), (1, 1)]
    for s in samples:
        assert s.status == "completed" == Status.COMPLETED and s.reward == 1.0 and s.metadata["task"] == s.index
        assert s.response_length == len(s.loss_mask) > 0 and not s.rollout_log_probs
        assert tok.decode(s.tokens).startswith(_flat(s.prompt)) and s.prompt.endswith("<assistant>")
        env_turns = [text for m, text in _segments(tok, s) if m == 0]
        assert env_turns[0] == "<tool>shipped<assistant>" and env_turns[-1] == "<user>thanks,bye"
        assert sum(1 for m, _ in _segments(tok, s) if m == 1) == 2               # two assistant turns trained


def test_multi_agent_shape(engine_url, make_args, prompt_file):
    """multi_agent returns several samples per prompt whose rewards it set itself (batched_async_rm, then weighted):
    the rollout keeps them (slime scores only samples without a reward) and files them in the prompt's group."""
    CALLS.clear()
    rows = [{"q": f"What is {i} + {i}?", "a": str(2 * i)} for i in range(2)]
    args = make_args(prompt_file(rows), "--rollout-batch-size", 2, "--n-samples-per-prompt", 1,
                     "--rollout-max-response-len", 8, "--rm-type", "remote_rm", "--rm-url",
                     ex.TOOL_URL["url"] + "/reward", "--custom-generate-function-path", f"{MOD}.multi_agent_generate")
    samples, _ = RolloutController(args, [engine_url]).generate(0)
    assert [p for p, _ in CALLS].count("/reward") == 4               # the solvers only, once each
    assert len(samples) == 6 and len(to_train_batch(args, samples)["tokens"]) == 6
    for g in (0, 1):
        group = [s for s in samples if s.group_index == g]
        assert sorted(s.reward for s in group) == [0.0, 0.8, 0.8]      # as the agents set them, not re-scored
        assert len({s.rollout_id for s in group}) == 1
        for s in group:
            assert s.response_length == len(s.loss_mask) == len(s.rollout_log_probs) > 0
