"""Text of `train.py --dry-run`: resolved config per role (only what differs from defaults), batch
arithmetic, placement plan per node. `plan` is a slime_like.plan.Plan (passed in: config/ imports no
module above it)."""
from __future__ import annotations

from slime_like.config.disaggregation import roles_text
from slime_like.config.parser import defaults_of, group_of, shared_parser
from slime_like.config.role_overrides import apply_role
from slime_like.config.trainer_megatron import precision_line

# Bookkeeping attributes that are not flags (still shown when relevant, in their own section); the dry run
# prints what a user set or can set, not the parse's own records (issue 32: `hf_model_type =` empty,
# `vllm_cli_options = {}`).
_INTERNAL = {"cli_dests", "megatron_role_entries", "megatron_role_overrides", "sglang_server_args", "sglang_passthrough_mode",
             "router_args", "placement_map", "reference_worker", "rollout_engine_requested", "role",
             "model_args_from_hf", "rollout_external", "dry_run", "hf_model_type", "hf_yarn", "custom_config",
             "hf_text_of_vlm", "hf_linear_attention", "hf_sparse_attention",
             "eval_datasets", "vllm_server_args", "vllm_cli_options", "vllm_passthrough_mode"}
_EMPTY = (None, "", {}, [], ())


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, list):
        return " ".join(_fmt(x) for x in v) if len(v) <= 12 else f"[{len(v)} values]"
    return str(v)


def config_diff(args, defaults: dict) -> dict:
    """The flags whose value differs from the parser's default, and the derived values that hold one."""
    return {k: ("<secret>" if k == "engine_api_key" else v) for k, v in vars(args).items()
            if k not in _INTERNAL and not k.startswith("sglang_")
            and (defaults[k] != v if k in defaults else not any(v is e or v == e for e in _EMPTY))}


def _section(lines, title, diff, groups, sources=None):
    lines.append(title)
    if not diff:
        lines.append("  (all defaults)")
        return
    by_group: dict = {}
    for k, v in diff.items():
        by_group.setdefault(groups.get(k, "derived"), []).append((k, v))
    for g in sorted(by_group, key=lambda t: (t == "derived", t)):
        lines.append(f"  [{g}]")
        for k, v in sorted(by_group[g]):
            note = f"    <- {sources[k]}" if sources and k in sources else ""
            lines.append(f"    {k} = {_fmt(v)}{note}")


def dry_run_text(args, plan, report) -> str:
    """The dry run's text from the validated `args`, the placement `plan` and the ConfigReport `report`."""
    parser = shared_parser()
    defaults, groups = defaults_of(parser), group_of(parser)
    lines = ["== slime_like dry run: configuration valid =="]
    warnings = report.warnings
    if warnings:  # each was printed once on stderr when it was found
        lines.append(f"({len(warnings)} WARNING line(s) printed above)")
    for note in report.notes:
        lines.append(f"NOTE: {note}")
    refusals = report.launch_refusals
    if refusals:
        lines.append(f"\n-- refused at launch: the plan below is valid, but slime_like will not start this run "
                     f"({len(refusals)}) --")
        lines.extend(f"REFUSED AT LAUNCH: {r}" for r in refusals)
    roles = ["actor"] + (["critic"] if args.use_critic else [])
    views = {r: apply_role(args, r) for r in roles}
    per_role = {r: config_diff(v, defaults) for r, v in views.items()}
    common = {k: v for k, v in per_role["actor"].items()
              if all(k in d and d[k] == v for d in per_role.values())}
    _section(lines, "\n-- resolved config, shared by all roles (differs from defaults) --", common, groups)
    overrides, entries = args.megatron_role_overrides, args.megatron_role_entries
    for r in roles:
        own = {k: v for k, v in per_role[r].items() if k not in common}
        own.update({k: defaults.get(k) for k in common if k not in per_role[r]})
        # a YAML entry decided these even where the value equals the default (ppo.yaml's actor lr: 1e-6)
        yaml_keys = overrides.get(r, {})
        own.update({k: getattr(views[r], k) for k in yaml_keys})
        sources = {k: f"YAML megatron[{entries.get(r, '?')}]" + (
            f", over the CLI's --{k.replace('_', '-')} {_fmt(getattr(args, k))}"
            if k in args.cli_dests and getattr(args, k) != getattr(views[r], k) else "")
            for k in yaml_keys}
        if own or len(roles) > 1:
            _section(lines, f"\n-- role {r}: values not shared by every role --", own, groups, sources)
    if args.sglang_server_args:
        lines.append(f"\n-- SGLang passthrough ({args.sglang_passthrough_mode}) --")
        lines += [f"    --{k.replace('_', '-')} {_fmt(v)}" for k, v in sorted(args.sglang_server_args.items())]
    if args.vllm_server_args:
        lines.append(f"\n-- vLLM passthrough ({args.vllm_passthrough_mode}) --")
        lines += [f"    {args.vllm_cli_options.get(k, '--' + k.replace('_', '-'))} {_fmt(v)}"
                  for k, v in sorted(args.vllm_server_args.items())]
    if args.router_args:
        lines.append("\n-- sglang-router passthrough --")
        lines += [f"    --{k.replace('_', '-')} {_fmt(v)}" for k, v in sorted(args.router_args.items())]
    t = report.translation
    if t is not None:
        lines += translation_lines(t)
    lines += ["\n-- batch arithmetic --"] + batch_lines(args) + [precision_line(args)]
    lines += ["\n-- placement plan --"] + plan_lines(plan, args)
    return "\n".join(lines)


def batch_lines(args) -> list:
    samples = args.rollout_batch_size * args.n_samples_per_prompt
    tp, pp, cp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size
    world = args.actor_num_nodes * args.actor_num_gpus_per_node
    dp = max(world // (tp * pp * cp), 1)
    out = [f"  samples per rollout   = rollout_batch_size {args.rollout_batch_size} x n_samples_per_prompt "
           f"{args.n_samples_per_prompt} = {samples}",
           f"                        = global_batch_size {args.global_batch_size} x num_steps_per_rollout "
           f"{args.num_steps_per_rollout}",
           f"  actor parallelism     = {world} GPUs = DP {dp} x TP {tp} x PP {pp} x CP {cp}",
           f"  samples per DP rank   = {args.global_batch_size // dp} per optimizer step"]
    if args.use_dynamic_batch_size:
        out.append(f"  micro-batches         = dynamic, up to {args.max_tokens_per_gpu} tokens per GPU")
    else:
        out.append(f"  micro-batches / step  = {args.global_batch_size // dp} / micro_batch_size "
                   f"{args.micro_batch_size} = {max(args.global_batch_size // dp // args.micro_batch_size, 1)} "
                   "per DP rank")
    if args.over_sampling_batch_size != args.rollout_batch_size:
        out.append(f"  over-sampling         = {args.over_sampling_batch_size} prompts per sampling round")
    if args.num_rollout is not None:
        out.append(f"  optimizer steps       = num_rollout {args.num_rollout} x {args.num_steps_per_rollout} = "
                   f"{args.num_rollout * args.num_steps_per_rollout}")
    if args.rollout_max_response_len:
        out.append(f"  response tokens / rollout <= {samples} x {args.rollout_max_response_len} = "
                   f"{samples * args.rollout_max_response_len}")
    return out


def plan_lines(plan, args) -> list:
    mode = "colocated (trainers and engines take turns on the same GPUs)" if plan.colocate else "disaggregated"
    out = [f"  {plan.num_nodes} node(s) x {plan.gpus_per_node} GPU slots, {mode}; engine: {plan.engine_kind}; "
           f"{plan.num_slots} bundles reserved",
           f"  actor: {len(plan.actor)} rank(s)" + (f", critic: {len(plan.critic)} rank(s)" if plan.critic else "")
           + f", engines: {len(plan.engines)} x {args.rollout_num_gpus_per_engine} GPU(s)"
           + roles_text(args, len(plan.engines))]
    placement = args.placement_map
    if placement:
        from slime_like.config.placement_spec import placement_text

        out.append(f"  explicit placement: --placement {' '.join(placement_text(placement))}")
        if args.reference_worker:
            out.append(f"  reference: its own worker, {len(plan.reference)} rank(s) (frozen; ref log-probs computed "
                       "there and sent to the actor)")
        elif placement.get("reference"):
            out.append("  reference: on the actor's GPUs, its log-probs computed inside the actor ranks")
    for node, gpus in plan.by_node().items():
        out.append(f"  node {node}:")
        for g, labels in gpus.items():
            bundle = node * plan.gpus_per_node + g
            out.append(f"    gpu {g} (bundle {bundle:>3}): {' + '.join(labels) if labels else '-'}")
    return out


def translation_lines(t) -> list:
    """The --config file as the slime_like command line it stands for, plus its per-role overlay."""
    from slime_like.config.frontends import command_line

    out = [f"\n-- equivalent command line ({t.fmt} file {t.path}"
           + (f" with {' '.join(t.overrides)}" if getattr(t, "overrides", None) else "") + ") --",
           "  python train.py \\"]
    body = command_line(t)
    out += [f"    {line}" + (" \\" if i + 1 < len(body) else "") for i, line in enumerate(body)]
    if t.roles:
        out.append("  --megatron-config-path ROLES.yaml, where ROLES.yaml is:")
        out.append("    megatron:")
        for role, values in t.roles.items():
            out.append(f"      - role: {role}")
            out.append("        overrides: {" + ", ".join(f"{k}: {_fmt(v)}" for k, v in values.items()) + "}")
    from slime_like.config.frontends.defaults import defaults_lines

    return out + defaults_lines(t)
