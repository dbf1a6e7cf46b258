"""slime's engine-layout format of --sglang-config (slime/backends/sglang_utils/sglang_config.py):

    sglang:
      - name: actor
        model_path: /path/to/actor          # default: --hf-checkpoint
        num_gpus_per_engine: 2              # default: --rollout-num-gpus-per-engine
        server_groups:                      # (engine_groups: slime's older name)
          - worker_type: regular            # regular / prefill / decode / placeholder / encoder
            num_gpus: 8
            num_gpus_per_engine: 2
            overrides: {mem_fraction_static: 0.7}   # SGLang ServerArgs fields on top of --sglang-*

Honoured where it maps onto this project's engines: one model, the trained one (update_weights true, model_path
--hf-checkpoint), whose groups share one engine size and one set of overrides: that is --rollout-num-gpus (the
groups' GPUs summed), --rollout-num-gpus-per-engine and the SGLang server settings. Groups are either all
`regular`, or `prefill` and `decode` ones: prefill / decode disaggregation, the same setting as slime's
--prefill-num-servers (the prefill groups' engines; disaggregation.py), so not together with that flag.
Everything else (encoder disaggregation, placeholder slots, frozen models served beside the policy, groups of
different shapes) is refused with the key that asks for it.
"""
from __future__ import annotations

from slime_like.config.errors import ConfigError

_NOT_BUILT = {
    "encoder": "encoder / prefill / decode disaggregation is not built",
    "placeholder": "GPU slots reserved without engines are not built; place components with --placement",
}
_MODEL_KEYS = {"name", "model_path", "num_gpus_per_engine", "server_groups", "engine_groups", "update_weights"}
_GROUP_KEYS = {"worker_type", "num_gpus", "num_gpus_per_engine", "overrides"}


def is_slime_layout(data: dict) -> bool:
    return isinstance(data.get("sglang"), list)


def apply_slime_layout(args, parser, path: str, data: dict) -> dict:
    """Set the engine layout on `args` from the file; return the SGLang server fields its groups override."""
    where = f"--sglang-config {path}"
    extra = sorted(set(data) - {"sglang"})
    if extra:
        raise ConfigError(f"{where}: {', '.join(extra)}: slime's layout file has only the 'sglang' list")
    models = data["sglang"]
    if len(models) != 1:
        names = [m.get("name", "?") if isinstance(m, dict) else "?" for m in models]
        raise ConfigError(f"{where}: sglang: {len(models)} models ({', '.join(map(str, names))}); one is served "
                          "here, the policy being trained: frozen models (reference, reward) served by SGLang "
                          "beside it are not built (the reference runs in the trainer: --ref-load)")
    model = models[0]
    if not isinstance(model, dict):
        raise ConfigError(f"{where}: sglang[0]: expected a mapping (name, server_groups, ...), got {model!r}")
    _unknown(where, "sglang[0]", model, _MODEL_KEYS)
    if model.get("update_weights") is False:
        raise ConfigError(f"{where}: sglang[0].update_weights: false: the one model served here is the policy, "
                          "which receives every weight update")
    path_of = model.get("model_path")
    groups = model.get("server_groups") or model.get("engine_groups") or []
    if not groups:
        raise ConfigError(f"{where}: sglang[0].server_groups: empty; list the engine groups (worker_type, num_gpus)")
    sizes, overrides, total, gpus_of = set(), [], 0, {}
    for i, group in enumerate(groups):
        kind, gpus, per_engine = _group(args, where, f"sglang[0].server_groups[{i}]", group, model)
        sizes.add(per_engine)
        total += gpus
        gpus_of[kind] = gpus_of.get(kind, 0) + gpus
        group_overrides = dict(group.get("overrides") or {})
        path_of = group_overrides.pop("model_path", path_of)
        overrides.append(group_overrides)
    if len(sizes) > 1:
        raise ConfigError(f"{where}: sglang[0].server_groups: engines of {sorted(sizes)} GPUs; the engines here are "
                          "all one size (--rollout-num-gpus-per-engine): give every group the same num_gpus_per_engine")
    if any(o != overrides[0] for o in overrides):
        raise ConfigError(f"{where}: sglang[0].server_groups: different overrides per group; the engines here share "
                          "one set of SGLang settings: give every group the same overrides")
    if path_of and args.hf_checkpoint and path_of != args.hf_checkpoint:
        raise ConfigError(f"{where}: sglang[0].model_path {path_of} differs from --hf-checkpoint "
                          f"{args.hf_checkpoint}: the engines serve the policy, which starts from --hf-checkpoint")
    per_engine = sizes.pop()
    _set_layout(args, parser, where, total, per_engine)
    _set_roles(args, where, gpus_of, per_engine)
    return overrides[0]


def _group(args, where: str, key: str, group, model: dict) -> tuple:
    """One server group's (worker_type, num_gpus, GPUs per engine), each checked."""
    if not isinstance(group, dict):
        raise ConfigError(f"{where}: {key}: expected a mapping (worker_type, num_gpus, ...), got {group!r}")
    _unknown(where, key, group, _GROUP_KEYS)
    kind = group.get("worker_type")
    if kind in _NOT_BUILT:
        raise ConfigError(f"{where}: {key}.worker_type: {kind}: {_NOT_BUILT[kind]}; use worker_type: regular")
    if kind not in ("regular", "prefill", "decode"):
        raise ConfigError(f"{where}: {key}.worker_type: {kind!r}: use regular, or prefill and decode (slime "
                          "also knows placeholder and encoder, which are not built here)")
    gpus = group.get("num_gpus")
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise ConfigError(f"{where}: {key}.num_gpus: must be an integer >= 1, got {gpus!r}")
    per_engine = group.get("num_gpus_per_engine") or model.get("num_gpus_per_engine") \
        or args.rollout_num_gpus_per_engine
    if gpus % per_engine:
        raise ConfigError(f"{where}: {key}: num_gpus {gpus} is not a multiple of num_gpus_per_engine {per_engine}")
    return kind, gpus, per_engine


def _set_roles(args, where: str, gpus_of: dict, per_engine: int) -> None:
    """prefill / decode groups: the first prefill-GPUs / engine-size engines prefill (--prefill-num-servers)."""
    if set(gpus_of) == {"regular"}:
        return
    if "regular" in gpus_of or set(gpus_of) != {"prefill", "decode"}:
        raise ConfigError(f"{where}: sglang[0].server_groups: worker types {sorted(gpus_of)}; prefill / decode "
                          "disaggregation needs prefill and decode groups and no regular one (the router sends "
                          "every request to one prefill and one decode engine)")
    if args.prefill_num_servers is not None:
        raise ConfigError(f"{where}: prefill / decode groups and --prefill-num-servers {args.prefill_num_servers} "
                          "set the same thing (slime: mutually exclusive); keep one")
    args.prefill_num_servers = gpus_of["prefill"] // per_engine


def _set_layout(args, parser, where: str, total: int, per_engine: int) -> None:
    default_per_engine = parser.get_default("rollout_num_gpus_per_engine")
    if args.rollout_num_gpus_per_engine not in (default_per_engine, per_engine):
        raise ConfigError(f"{where}: engines of {per_engine} GPUs, but --rollout-num-gpus-per-engine "
                          f"{args.rollout_num_gpus_per_engine}; drop one")
    args.rollout_num_gpus_per_engine = per_engine
    if args.placement:
        raise ConfigError(f"{where}: server_groups place the engines, and so does --placement; keep one")
    if args.colocate:  # the engines take the actor's GPUs: the groups must add up to them
        actor = args.actor_num_nodes * args.actor_num_gpus_per_node
        if total != actor:
            raise ConfigError(f"{where}: server_groups hold {total} GPUs, but --colocate puts the engines on the "
                              f"actor's {actor}; make them equal")
        return
    if args.rollout_num_gpus not in (None, total):
        raise ConfigError(f"{where}: server_groups hold {total} GPUs, but --rollout-num-gpus {args.rollout_num_gpus}; "
                          "drop one")
    args.rollout_num_gpus = total


def _unknown(where: str, key: str, entry: dict, known: set) -> None:
    unknown = sorted(set(entry) - known)
    if unknown:
        raise ConfigError(f"{where}: {key}: unknown key(s) {', '.join(unknown)}; slime's layout keys are "
                          f"{', '.join(sorted(known))}")
