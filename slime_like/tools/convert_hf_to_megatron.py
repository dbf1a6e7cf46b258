"""Convert a Hugging Face checkpoint into a Megatron `torch_dist` checkpoint (iteration 0).

    slime-like convert hf-to-megatron   (or: python tools/convert_hf_to_megatron.py)
        --hf-checkpoint HF_DIR --save OUT \
        [--tensor-model-parallel-size N] [--pipeline-model-parallel-size M] [MODEL_ARGS ...]

Spawns N*M local ranks (gloo on CPU, nccl with one GPU per rank on CUDA machines), each building its
mcore model shard, loading its share of the HF weights and writing it; OUT/latest_checkpointed_iteration.txt
is published last. Model flags not given are read from HF_DIR/config.json. The result is topology-free
(dist_checkpointing reshards on load), typically used as --ref-load or as the first --load.
"""
import sys
import warnings


def parse(argv, prog: str = "convert_hf_to_megatron.py"):
    from slime_like.backends.megatron.model import padded_vocab_size
    from slime_like.config.hf_config import fill_args_from_hf
    from slime_like.config.parser import parse_namespace
    from slime_like.config.trainer_megatron import pipeline_split_problem, virtual_pipeline_problem

    args, _ = parse_namespace(list(argv), prog=prog)
    if not args.hf_checkpoint or not args.save:
        sys.exit(f"{prog}: error: --hf-checkpoint HF_DIR and --save OUT are required")
    args = fill_args_from_hf(args, args.hf_checkpoint)
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    split = pipeline_split_problem(args.num_layers, pp, args.decoder_first_pipeline_num_layers,
                                   args.decoder_last_pipeline_num_layers)
    if not split and (args.num_layers_per_virtual_pipeline_stage or args.num_virtual_stages_per_pipeline_rank):
        split = virtual_pipeline_problem(args.num_layers, pp, args.num_layers_per_virtual_pipeline_stage,
                                         args.num_virtual_stages_per_pipeline_rank,
                                         args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers)
    problems = [(args.num_query_groups % tp, f"--num-query-groups {args.num_query_groups} not divisible by TP {tp}"),
                (split, split),
                (args.ffn_hidden_size % tp, f"--ffn-hidden-size {args.ffn_hidden_size} not divisible by TP {tp}")]
    for bad, msg in problems:
        if bad:
            sys.exit(f"{prog}: error: {msg}; choose another parallel size")
    padded_vocab_size(args)
    return args


def convert_rank(rank, world, port, argv):
    warnings.filterwarnings("ignore")
    from slime_like.backends.megatron import checkpoint, hf_weights, parallel
    from slime_like.tools.convert_ranks import rank_model

    args = parse(argv)
    chunks = rank_model(rank, world, port, args)
    hf_weights.load_hf_weights(chunks, args.hf_checkpoint, args)
    path = checkpoint.save_checkpoint(args.save, 0, chunks, extra_state={"converted_from": args.hf_checkpoint})
    parallel.destroy_distributed()
    return path


def main(argv=None, prog: str = "convert_hf_to_megatron.py"):
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv, prog)  # fail on bad input before spawning anything
    from slime_like.tools.convert_ranks import run_on_ranks

    path = run_on_ranks(convert_rank, args, argv)
    print(f"wrote {path} (TP={args.tensor_model_parallel_size}, PP={args.pipeline_model_parallel_size})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
