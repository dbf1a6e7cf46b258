"""Helpers shared by the configuration tests (imported as a top-level module: tests/ has no __init__.py)."""
import json
import os

# Values of slime_like.tools.tiny_model.build_tiny_checkpoint() defaults (qwen2 arch).
TINY_QWEN2 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 128,
              "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "hidden_act": "silu",
              "max_position_embeddings": 256}


def write_hf_dir(path, cfg=None) -> str:
    """A placeholder HF model directory: config.json, plus the tokenizer and weight file names the preflight
    looks for (empty: configuration tests never load them)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg or TINY_QWEN2, f)
    for name in ("tokenizer.json", "model.safetensors"):
        open(os.path.join(path, name), "a").close()
    return str(path)


def parse(argv):
    from slime_like.args import parse_args

    return parse_args([str(a) for a in argv], exit_on_error=False)


def parse_report(argv):
    """(args, report): the validated Namespace and the ConfigReport (warnings, launch refusals, provenance)."""
    from slime_like.args import parse_run

    args, _, report = parse_run([str(a) for a in argv], exit_on_error=False)
    return args, report


def refuse_at_launch(argv):
    """What the launch does after the dry run: raise ConfigError naming every refused setting of `argv`."""
    parse_report(argv)[1].refuse_at_launch()
