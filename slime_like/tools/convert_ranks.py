"""What both checkpoint converters do around their own step: run it on TP x PP local ranks, and on each rank join
the process group and build that rank's model chunks."""


def rank_model(rank: int, world: int, port: int, args):
    """Join the local ranks' group for args' TP x PP and return this rank's model chunks."""
    from slime_like.backends.megatron import model, parallel
    from slime_like.backends.megatron.transformer_config import virtual_pipeline_size

    parallel.init_distributed(rank, world, master_port=port, tp=args.tensor_model_parallel_size,
                              pp=args.pipeline_model_parallel_size, seed=args.seed,
                              vpp=virtual_pipeline_size(args))
    return model.build_model(args)


def run_on_ranks(rank_fn, args, argv):
    """Run rank_fn(rank, world, port, argv) on TP x PP local ranks (gloo on CPU); rank 0's result."""
    from slime_like.backends.megatron.parallel import run_local_ranks

    world = args.tensor_model_parallel_size * args.pipeline_model_parallel_size
    return run_local_ranks(rank_fn, world, list(argv), timeout=6 * 3600)[0]
