"""Build tiny Hugging Face checkpoints locally: config.json + model.safetensors + tokenizer files.

Tests, the demo and the benchmarks use these instead of downloading anything. The tokenizer is
character-level (one token per character, built with the `tokenizers` library), so any text over its
alphabet round-trips exactly and token counts are easy to reason about.

    python -m slime_like.tools.tiny_model OUT_DIR [--arch qwen2|qwen3|qwen3_moe|llama|glm4|...] [--hidden-size 64] ...
"""
from __future__ import annotations

import argparse
import os
import string

PAD, EOS = "<pad>", "<eos>"
ARCHS = ("qwen2", "qwen3", "qwen3_moe", "llama", "glm4", "glm4_moe", "deepseek_v3", "moonlight", "kimi_k2",
         "minimax_m2", "qwen2_moe", "glm4_moe_lite", "mimo", "qwen3_next", "qwen3_5", "qwen3_5_moe",
         "deepseek_v32", "glm_moe_dsa")
# ChatML-style turns, written with plain characters so the char tokenizer covers them.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<' + message['role'] + '>' + message['content'] + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<assistant>' }}{% endif %}"
)
DEFAULT_ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n"


def build_char_tokenizer(alphabet: str = DEFAULT_ALPHABET):
    """A fast HF tokenizer with ids 0=<pad>, 1=<eos>, then one id per character of `alphabet`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list(dict.fromkeys(alphabet))  # dedupe, keep order
    vocab = {tok: i for i, tok in enumerate([PAD, EOS] + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()  # characters concatenate with no separator
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, bos_token=None,
                                 unk_token=None, padding_side="left", clean_up_tokenization_spaces=False)
    hf.chat_template = CHAT_TEMPLATE
    return hf


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def build_tiny_checkpoint(out_dir: str, arch: str = "qwen2", hidden_size: int = 64, num_layers: int = 2,
                          num_heads: int = 4, num_kv_heads: int = 2, ffn_hidden_size: int = 128,
                          tie_embeddings: bool = True, alphabet: str = DEFAULT_ALPHABET, vocab_multiple: int = 64,
                          max_position_embeddings: int = 256, rope_theta: float = 10000.0, seed: int = 0,
                          num_experts: int = 0, moe_topk: int = 2, init_std: float = 0.02,
                          mtp_layers: int = 0) -> str:
    """Write a randomly initialised model of `arch` and its char tokenizer to `out_dir`; return out_dir.

    `mtp_layers` (DeepSeek-V3 / GLM-4.5 archs): that many MTP layers appended as model.layers.<num_layers + i>.*
    (MiMo always has its one, model.mtp_layers.0.*).

    The config's vocab_size is the tokenizer size rounded up to `vocab_multiple`, like Megatron's
    padded vocabulary, so the same checkpoint splits evenly at TP=2. Deterministic for a given seed.
    """
    import torch

    tok = build_char_tokenizer(alphabet)
    common = dict(vocab_size=_round_up(len(tok), vocab_multiple), hidden_size=hidden_size,
                  intermediate_size=ffn_hidden_size, num_hidden_layers=num_layers,
                  num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                  max_position_embeddings=max_position_embeddings, rope_theta=rope_theta,
                  rms_norm_eps=1e-6, tie_word_embeddings=tie_embeddings, initializer_range=init_std,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    cfg, cls = _config_and_class(arch, common, head=hidden_size // num_heads, num_experts=num_experts or 4,
                                 moe_topk=moe_topk, ffn_hidden_size=ffn_hidden_size)
    torch.manual_seed(seed)
    model = cls(cfg).to(torch.float32)
    _make_defaults_matter(model, arch, seed)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    if arch == "kimi_k2":  # Kimi-K2's config.json names its own model_type over DeepSeek-V3's architecture
        _set_model_type(out_dir, "kimi_k2")
    if arch == "mimo":
        _add_mimo_mtp_layer(out_dir, hidden_size, seed)
    for i in range(mtp_layers):
        _add_appended_mtp_layer(out_dir, num_layers, i, hidden_size, seed)
    tok.save_pretrained(out_dir)
    return out_dir


def _config_and_class(arch: str, common: dict, head: int, num_experts: int, moe_topk: int, ffn_hidden_size: int):
    """(transformers config, model class) of a tiny `arch`; `common`: the fields every architecture shares."""
    for family in (_qwen_or_llama, _glm, _latent_attention, _minimax, _linear_attention):
        made = family(arch, common, head, num_experts, moe_topk, ffn_hidden_size)
        if made is not None:
            return made
    raise ValueError(f"unknown tiny arch {arch!r}; choose {', '.join(ARCHS)}")


def _qwen_or_llama(arch: str, common: dict, head: int, num_experts: int, moe_topk: int, ffn_hidden_size: int):
    """Qwen2 (and MiMo's main model), Qwen2-MoE, Qwen3, Qwen3-MoE, Llama; None for another arch."""
    import transformers

    if arch in ("qwen2", "mimo"):  # MiMo: Qwen2's main model (+ an MTP layer, _add_mimo_mtp_layer)
        cfg, cls = transformers.Qwen2Config(**common), transformers.Qwen2ForCausalLM
    elif arch == "qwen2_moe":  # dense layer 0 (mlp_only_layers), then MoE with a sigmoid-gated shared expert;
        # norm_topk_prob false: softmax over all experts, top-k weights not renormalised
        cfg = transformers.Qwen2MoeConfig(num_experts=num_experts, num_experts_per_tok=moe_topk,
                                          moe_intermediate_size=ffn_hidden_size // 4,
                                          shared_expert_intermediate_size=ffn_hidden_size // 2, decoder_sparse_step=1,
                                          mlp_only_layers=[0], norm_topk_prob=False, router_aux_loss_coef=0.001,
                                          **common)
        cls = transformers.Qwen2MoeForCausalLM
    elif arch == "qwen3":
        cfg, cls = transformers.Qwen3Config(head_dim=head, **common), transformers.Qwen3ForCausalLM
    elif arch == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(head_dim=head, num_experts=num_experts,
                                          num_experts_per_tok=moe_topk, moe_intermediate_size=ffn_hidden_size,
                                          decoder_sparse_step=1, norm_topk_prob=True, **common)
        cls = transformers.Qwen3MoeForCausalLM
    elif arch == "llama":
        cfg, cls = transformers.LlamaConfig(attention_bias=False, mlp_bias=False, **common), transformers.LlamaForCausalLM
    else:
        return None
    return cfg, cls


def _glm(arch: str, common: dict, head: int, num_experts: int, moe_topk: int, ffn_hidden_size: int):
    """GLM-4 dense, GLM-4.5 MoE and GLM-4.7-Flash (MLA); None for another arch."""
    import transformers

    if arch == "glm4":  # GLM-4 dense: sandwich norms, half the head dims rotated as interleaved pairs, QKV bias
        cfg = transformers.Glm4Config(head_dim=head, partial_rotary_factor=0.5, attention_bias=True,
                                      **common)
        cls = transformers.Glm4ForCausalLM
    elif arch == "glm4_moe":  # GLM-4.5 style: one dense layer, then MoE with a biased sigmoid router
        cfg = transformers.Glm4MoeConfig(head_dim=head, n_routed_experts=num_experts,
                                         num_experts_per_tok=moe_topk, moe_intermediate_size=ffn_hidden_size // 4,
                                         n_shared_experts=1, n_group=2, topk_group=1, routed_scaling_factor=2.5,
                                         norm_topk_prob=True, first_k_dense_replace=1, partial_rotary_factor=0.5,
                                         use_qk_norm=True, attention_bias=True, **common)
        cls = transformers.Glm4MoeForCausalLM
    elif arch == "glm4_moe_lite":  # GLM-4.7-Flash: DeepSeek-V3's MLA + GLM-4.5's router, layers from mlp_layer_types
        cfg = transformers.Glm4MoeLiteConfig(n_routed_experts=num_experts, num_experts_per_tok=moe_topk,
                                             moe_intermediate_size=ffn_hidden_size // 4, n_shared_experts=1,
                                             n_group=1, topk_group=1, routed_scaling_factor=1.8, norm_topk_prob=True,
                                             q_lora_rank=2 * head, kv_lora_rank=head, qk_nope_head_dim=head,
                                             qk_rope_head_dim=head // 2, v_head_dim=head, rope_interleave=True,
                                             mlp_layer_types=["dense"] + ["sparse"] * (common["num_hidden_layers"] - 1),
                                             **dict(common, num_key_value_heads=common["num_attention_heads"]))
        cls = transformers.Glm4MoeLiteForCausalLM
    else:
        return None
    return cfg, cls


def _latent_attention(arch: str, common: dict, head: int, num_experts: int, moe_topk: int, ffn_hidden_size: int):
    """DeepSeek-V3's multi-latent attention family: DeepSeek-V3, Moonlight, Kimi-K2; None for another arch."""
    import transformers

    if arch in ("deepseek_v32", "glm_moe_dsa"):
        return _sparse_attention(arch, common, head, num_experts, moe_topk, ffn_hidden_size)
    if arch not in ("deepseek_v3", "moonlight", "kimi_k2"):
        return None
    # multi-latent attention + GLM-4.5's router; Moonlight: no q low rank, 1 group, 2 shared experts
    moonlight = arch == "moonlight"
    if arch == "kimi_k2":  # Kimi-K2's YaRN shape (beta_fast = beta_slow = 1), scaled to the tiny context;
        # mscale != mscale_all_dim so the cos/sin and softmax scales are not 1
        common = dict(common, rope_parameters=dict(
            rope_type="yarn", rope_theta=common["rope_theta"], factor=4.0, mscale=1.0, mscale_all_dim=0.5,
            original_max_position_embeddings=common["max_position_embeddings"] // 4, beta_fast=1.0,
            beta_slow=1.0))
    cfg = transformers.DeepseekV3Config(n_routed_experts=num_experts, num_experts_per_tok=moe_topk,
                                        moe_intermediate_size=ffn_hidden_size // 4,
                                        n_shared_experts=2 if moonlight else 1, n_group=1 if moonlight else 2,
                                        topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                                        first_k_dense_replace=1, q_lora_rank=None if moonlight else 2 * head,
                                        kv_lora_rank=head,
                                        qk_nope_head_dim=head, qk_rope_head_dim=head // 2, v_head_dim=head,
                                        rope_interleave=True,
                                        **dict(common, num_key_value_heads=common["num_attention_heads"]))
    cls = transformers.DeepseekV3ForCausalLM
    return cfg, cls


def _sparse_attention(arch: str, common: dict, head: int, num_experts: int, moe_topk: int, ffn_hidden_size: int):
    """DeepSeek-V3.2 / GLM-5: DeepSeek-V3's MLA and router plus a lightning indexer keeping the top index_topk keys
    (6: fewer than most tests' samples, so the top-k selection matters; 8 indexer heads, so an all-zero ReLU score,
    a tie, is rare)."""
    import transformers

    kw = dict(n_routed_experts=num_experts, num_experts_per_tok=moe_topk, moe_intermediate_size=ffn_hidden_size // 4,
              n_shared_experts=1, n_group=1, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
              first_k_dense_replace=1, q_lora_rank=2 * head, kv_lora_rank=head, qk_nope_head_dim=head,
              qk_rope_head_dim=head // 2, v_head_dim=head, index_topk=6, index_n_heads=8, index_head_dim=head,
              **dict(common, num_key_value_heads=common["num_attention_heads"]))
    if arch == "deepseek_v32":
        return transformers.DeepseekV32Config(**kw), transformers.DeepseekV32ForCausalLM
    n = common["num_hidden_layers"]
    return (transformers.GlmMoeDsaConfig(mlp_layer_types=["dense"] + ["sparse"] * (n - 1), **kw),
            transformers.GlmMoeDsaForCausalLM)


def _minimax(arch: str, common: dict, head: int, num_experts: int, moe_topk: int, ffn_hidden_size: int):
    """MiniMax-M2; None for another arch."""
    import transformers

    if arch != "minimax_m2":
        return None
    # every layer MoE (sigmoid router + correction bias), norms over all q / k heads, RoPE on half of each head
    cfg = transformers.MiniMaxM2Config(head_dim=head, rotary_dim=head // 2, num_local_experts=num_experts,
                                       num_experts_per_tok=moe_topk,
                                       **dict(common, intermediate_size=ffn_hidden_size // 4))
    cls = transformers.MiniMaxM2ForCausalLM
    return cfg, cls


def _linear_attention(arch: str, common: dict, head: int, num_experts: int, moe_topk: int, ffn_hidden_size: int):
    """Qwen3-Next and Qwen3.5 dense / MoE (vision-language layout, a one-block vision tower): gated delta net and
    gated full attention alternating, RoPE on a quarter of each head; None for another arch."""
    import transformers

    if arch not in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):
        return None
    n = common["num_hidden_layers"]
    text = dict(common, head_dim=head, partial_rotary_factor=0.25, linear_num_key_heads=2, linear_num_value_heads=4,
                linear_key_head_dim=head // 2, linear_value_head_dim=head // 2, linear_conv_kernel_dim=4,
                layer_types=["full_attention" if i % 2 else "linear_attention" for i in range(n)])
    moe = dict(num_experts=num_experts, num_experts_per_tok=moe_topk, moe_intermediate_size=ffn_hidden_size // 4,
               shared_expert_intermediate_size=ffn_hidden_size // 2)
    if arch == "qwen3_next":
        return transformers.Qwen3NextConfig(**text, **moe, norm_topk_prob=True), transformers.Qwen3NextForCausalLM
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=common["hidden_size"])
    if arch == "qwen3_5":
        cfg = transformers.Qwen3_5Config(text_config=text, vision_config=vision,
                                         tie_word_embeddings=common["tie_word_embeddings"])
        return cfg, transformers.Qwen3_5ForConditionalGeneration
    text.pop("intermediate_size")  # as published: every layer MoE, no dense width
    cfg = transformers.Qwen3_5MoeConfig(text_config=dict(text, **moe), vision_config=vision,
                                        tie_word_embeddings=common["tie_word_embeddings"])
    return cfg, transformers.Qwen3_5MoeForConditionalGeneration


def _make_defaults_matter(model, arch: str, seed: int) -> None:
    """HF initialises norms to ones and the routers' correction bias to zeros: random values make a misplaced
    norm or an ignored bias show in a parity test."""
    import torch

    if arch in ("glm4", "minimax_m2", "qwen2_moe", "glm4_moe_lite", "deepseek_v32", "glm_moe_dsa"):
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(("layernorm.weight", "q_norm.weight", "k_norm.weight")):
                    p.copy_(1 + 0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
                elif name.endswith("indexer.k_norm.bias"):  # the indexer's LayerNorm bias (HF starts it at 0)
                    p.copy_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    if arch in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):  # zero-centred norms (1 + w: HF starts w at 0), the gated
        with torch.no_grad():  # norm (w, starts at 1), dt_bias (starts at 1)
            for name, p in model.named_parameters():
                g = torch.Generator().manual_seed(len(name))
                if name.endswith(("layernorm.weight", "q_norm.weight", "k_norm.weight", ".norm.weight")):
                    p.copy_((0.0 if "linear_attn" not in name else 1.0) + 0.3 * torch.randn(p.shape, generator=g))
                elif name.endswith("dt_bias"):
                    p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g))
    for name, buf in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buf.copy_(torch.randn(buf.shape, generator=torch.Generator().manual_seed(seed + 1)) * 0.1)


def _add_mimo_mtp_layer(out_dir: str, hidden: int, seed: int) -> None:
    """MiMo's config.json (model_type mimo, one MTP layer) and its MTP layer's tensors (model.mtp_layers.0.*, the
    names of XiaomiMiMo's modeling_mimo.py: a Qwen2 decoder layer plus token_layernorm, hidden_layernorm,
    input_proj [hidden; token] -> hidden, final_layernorm), random, written next to the Qwen2 weights."""
    import torch
    from safetensors.torch import load_file, save_file

    _set_model_type(out_dir, "mimo", num_nextn_predict_layers=1, architectures=["MiMoForCausalLM"])
    path = os.path.join(out_dir, "model.safetensors")
    tensors = load_file(path)
    g = torch.Generator().manual_seed(seed + 2)
    layer0 = "model.layers.0."
    for name in sorted(n for n in tensors if n.startswith(layer0)):  # a decoder layer's shapes, fresh values
        base = tensors[name]
        fresh = 1 + 0.1 * torch.randn(base.shape, generator=g) if name.endswith("layernorm.weight") \
            else 0.1 * torch.randn(base.shape, generator=g)
        tensors["model.mtp_layers.0." + name[len(layer0):]] = fresh.to(base.dtype)
    for name in ("token_layernorm", "hidden_layernorm", "final_layernorm"):
        tensors[f"model.mtp_layers.0.{name}.weight"] = 1 + 0.1 * torch.randn(hidden, generator=g)
    tensors["model.mtp_layers.0.input_proj.weight"] = 0.1 * torch.randn(hidden, 2 * hidden, generator=g)
    save_file(tensors, path, metadata={"format": "pt"})


def _add_appended_mtp_layer(out_dir: str, num_layers: int, index: int, hidden: int, seed: int) -> None:
    """DeepSeek-V3 / GLM-4.5's MTP layer `index` as their checkpoints hold it: model.layers.<num_layers + index>.*, a
    decoder layer shaped as the last one plus enorm, hnorm, eh_proj [token; hidden] -> hidden, shared_head.norm, and
    copies of the embedding (embed_tokens) and of the LM head (shared_head.head); random, config.json's
    num_nextn_predict_layers counts it."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    path = os.path.join(out_dir, "model.safetensors")
    tensors = load_file(path)
    g = torch.Generator().manual_seed(seed + 3 + index)
    last, pre = f"model.layers.{num_layers - 1}.", f"model.layers.{num_layers + index}."
    for name in sorted(n for n in tensors if n.startswith(last)):
        base = tensors[name]
        fresh = 1 + 0.1 * torch.randn(base.shape, generator=g) if name.endswith("norm.weight") \
            else 0.1 * torch.randn(base.shape, generator=g)
        tensors[pre + name[len(last):]] = fresh.to(base.dtype)
    for name in ("enorm", "hnorm", "shared_head.norm"):
        tensors[f"{pre}{name}.weight"] = 1 + 0.1 * torch.randn(hidden, generator=g)
    tensors[f"{pre}eh_proj.weight"] = 0.1 * torch.randn(hidden, 2 * hidden, generator=g)
    tensors[f"{pre}embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    tensors[f"{pre}shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    save_file(tensors, path, metadata={"format": "pt"})
    cfg_path = os.path.join(out_dir, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["num_nextn_predict_layers"] = index + 1
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)


def _set_model_type(out_dir: str, model_type: str, **extra) -> None:
    import json

    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["model_type"] = model_type
    cfg.update(extra)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--arch", default="qwen2", choices=ARCHS)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--num-attention-heads", type=int, default=4)
    p.add_argument("--num-query-groups", type=int, default=2)
    p.add_argument("--ffn-hidden-size", type=int, default=128)
    p.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    p.add_argument("--alphabet", default=DEFAULT_ALPHABET)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    build_tiny_checkpoint(a.out_dir, arch=a.arch, hidden_size=a.hidden_size, num_layers=a.num_layers,
                          num_heads=a.num_attention_heads, num_kv_heads=a.num_query_groups,
                          ffn_hidden_size=a.ffn_hidden_size, tie_embeddings=not a.untie_embeddings_and_output_weights,
                          alphabet=a.alphabet, seed=a.seed)
    print(a.out_dir)


if __name__ == "__main__":
    main()
