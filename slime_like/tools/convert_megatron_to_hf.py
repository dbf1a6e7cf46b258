"""Convert a Megatron `torch_dist` checkpoint back to a Hugging Face directory.

    slime-like convert megatron-to-hf   (or: python tools/convert_megatron_to_hf.py)
        --load MCORE_DIR --hf-checkpoint HF_TEMPLATE_DIR --save-hf OUT_HF_DIR \
        [--ckpt-step N] [--tensor-model-parallel-size N] [--pipeline-model-parallel-size M] [MODEL_ARGS ...]

Writes safetensors (in the template config's dtype) + config.json + tokenizer files copied from the
template. Model flags not given come from the template's config.json. The checkpoint is resharded on
load, so any TP/PP works; the default (1, 1) runs in one local process.
"""
import os
import sys
import warnings


def parse(argv, prog: str = "convert_megatron_to_hf.py"):
    from slime_like.config.hf_config import fill_args_from_hf
    from slime_like.config.parser import parse_namespace

    args, _ = parse_namespace(list(argv), prog=prog)
    missing = [f for f, v in (("--load", args.load), ("--hf-checkpoint", args.hf_checkpoint),
                              ("--save-hf", args.save_hf)) if not v]
    if missing:
        sys.exit(f"{prog}: error: {', '.join(missing)} required "
                 "(--load MCORE_DIR --hf-checkpoint HF_TEMPLATE_DIR --save-hf OUT_HF_DIR)")
    if not os.path.isfile(os.path.join(args.load, "latest_checkpointed_iteration.txt")):
        sys.exit(f"{prog}: error: --load {args.load}: no latest_checkpointed_iteration.txt "
                 "(not a Megatron checkpoint directory)")
    return fill_args_from_hf(args, args.hf_checkpoint)


def export_rank(rank, world, port, argv):
    warnings.filterwarnings("ignore")
    from slime_like.backends.megatron import checkpoint, hf_weights, parallel
    from slime_like.tools.convert_ranks import rank_model

    args = parse(argv)
    chunks = rank_model(rank, world, port, args)
    it = checkpoint.load_checkpoint(args.load, chunks, load_optim=False, args=args, iteration=args.ckpt_step)
    hf_weights.export_hf(chunks, args, args.save_hf, args.hf_checkpoint)
    parallel.destroy_distributed()
    return it


def main(argv=None, prog: str = "convert_megatron_to_hf.py"):
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv, prog)
    from slime_like.tools.convert_ranks import run_on_ranks

    it = run_on_ranks(export_rank, args, argv)
    print(f"wrote {args.save_hf} from {args.load} iteration {it}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
