"""The project's GPU check suite: `scripts/gpu-check.sh` (or `python -m slime_like.tools.gpu_check`).

    python -m slime_like.tools.gpu_check --out DIR               # one GPU: Qwen2.5-0.5B's shape, random weights
    python -m slime_like.tools.gpu_check --cpu-smoke --out DIR   # the same code: 2-layer model, gloo, CPU

Every check runs in its own process (its own session, killed with its process group when its time budget runs out),
so a hang or a CUDA crash costs that check only; DIR/gpu_summary.json is rewritten after each check (pass / fail /
skip with the reason, the numbers) and a table is printed at the end. One module per check:

  prep           a random-init Qwen2 checkpoint written by transformers (bf16 on the GPU, fp32 in the smoke)
  parity         Megatron trainer's model (real parser -> config.json -> build_model -> HF weights) vs transformers,
                 fp32 and bf16 logits / log-probs, and which layer spec was built
  megatron_grpo  MegatronTrainer: GRPO steps with a KL reference (finite, learning, tokens/s, MFU, peak memory, GPU
  fsdp_grpo      FSDPTrainer     kernel share of a step from torch.profiler, ratio to a plain transformers step on
                                 the same micro-batches in the same process), offload / onload; Megatron: HF export
  push           the colocated push (TensorWeightSender: CUDA IPC on the GPU, shared memory in the smoke) into the
                 project's CPU engine: bit-identical by its /weights_checker, time vs a device-to-device copy
  export         the HF export of the trained weights reproduces the trained Megatron logits in transformers
  sglang         a real SGLang engine receives a push and generates with it (skipped when sglang is not importable)
"""
