"""The optimizer and learning-rate schedule (Megatron flags with slime's defaults: lr 1e-6, clip_grad 1.0) and
slime's stateless Adam. The schedule's arithmetic (warm-up vs decay horizon): schedule.py."""
from __future__ import annotations

from slime_like.config.errors import ConfigError
from slime_like.config.types import Float, Int


def add_optimizer_group(parser):
    g = parser.add_argument_group("optimizer & LR schedule", "Optimizer and learning-rate schedule (Megatron flags)")
    a = g.add_argument
    a("--optimizer", default="adam", choices=["adam", "sgd"], help="Optimizer.")
    a("--lr", type=Float(0), default=1e-6, help="Peak learning rate (slime default 1e-6).")
    a("--min-lr", type=Float(0), default=0.0, help="Floor of the decayed learning rate.")
    a("--lr-decay-style", default="linear", choices=["constant", "linear", "cosine", "inverse-square-root", "WSD"],
      help="Learning-rate decay schedule (Megatron default linear).")
    a("--lr-decay-iters", type=Int(1), default=None, help="Optimizer steps to decay over; default = all steps.")
    a("--lr-warmup-iters", type=Int(0), default=0, help="Linear warmup steps.")
    a("--lr-warmup-fraction", type=Float(0, 1), default=None, help="Warmup as a fraction of --lr-decay-iters.")
    a("--lr-warmup-init", type=Float(0), default=0.0, help="Learning rate at the start of warmup.")
    a("--lr-wsd-decay-style", default="exponential", choices=["exponential", "linear", "cosine"],
      help="Decay style of the WSD schedule's final phase.")
    a("--lr-wsd-decay-iters", type=Int(0), default=None, help="Steps of the WSD decay phase.")
    a("--weight-decay", type=Float(0), default=0.01, help="Weight decay (Megatron default 0.01).")
    a("--start-weight-decay", type=Float(0), default=None, help="Initial weight decay for an increasing schedule.")
    a("--end-weight-decay", type=Float(0), default=None, help="Final weight decay for an increasing schedule.")
    a("--weight-decay-incr-style", default="constant", choices=["constant", "linear", "cosine"],
      help="Weight-decay schedule.")
    a("--clip-grad", type=Float(0), default=1.0, help="Global gradient-norm clip (slime default 1.0).")
    a("--adam-beta1", type=Float(0, 1, hi_open=True), default=0.9, help="Adam beta1.")
    a("--adam-beta2", type=Float(0, 1, hi_open=True), default=0.999, help="Adam beta2.")
    a("--adam-eps", type=Float(0, lo_open=True), default=1e-8, help="Adam epsilon.")
    a("--sgd-momentum", type=Float(0, 1), default=0.9, help="SGD momentum.")
    a("--loss-scale", type=Float(0, lo_open=True), default=None, help="Static loss scale for fp16; None = dynamic.")
    a("--initial-loss-scale", type=Float(0, lo_open=True), default=2 ** 32, help="Initial dynamic loss scale (fp16).")
    a("--min-loss-scale", type=Float(0, lo_open=True), default=1.0, help="Minimum dynamic loss scale (fp16).")
    a("--loss-scale-window", type=Float(1), default=1000, help="Steps between dynamic loss-scale increases.")
    a("--hysteresis", type=Int(1), default=2, help="Dynamic loss-scale hysteresis.")
    a("--override-opt_param-scheduler", action="store_true", dest="override_opt_param_scheduler",
      help="Ignore the scheduler state stored in the checkpoint.")
    a("--use-checkpoint-opt_param-scheduler", action="store_true", dest="use_checkpoint_opt_param_scheduler",
      help="Take the scheduler settings from the checkpoint.")
    a("--train-iters", type=Int(1), default=None, help="Total optimizer steps for the LR schedule; default derived "
      "from --num-rollout * --num-steps-per-rollout.")
    a("--reset-optimizer-states", action="store_true", help="Clear optimizer state after each rollout (slime).")
    a("--critic-lr", type=Float(0), default=None, help="Critic learning rate; default = --lr (slime).")
    a("--critic-lr-warmup-iters", type=Int(0), default=0, help="Critic linear warmup steps (slime).")
    return parser


def add_stateless_adam_flag(g):
    """(slime extras group)"""
    a = g.add_argument
    a("--use-stateless-adam", action="store_true", help="Adam without persistent moments (needs --no-save-optim).")


def check_stateless_adam(args):
    if args.use_stateless_adam and (args.optimizer != "adam" or not args.no_save_optim):
        raise ConfigError(f"--use-stateless-adam (with --optimizer {args.optimizer}"
                          + ("" if args.no_save_optim else ", without --no-save-optim")
                          + "): slime's stateless Adam is an Adam and keeps no moments to save; use --optimizer adam "
                            "--no-save-optim")
