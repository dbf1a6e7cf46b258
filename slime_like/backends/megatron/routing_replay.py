"""MoE routing replay in the Megatron trainer, through megatron-core's RouterReplay (moe_enable_routing_replay).

    --use-rollout-routing-replay (slime's R3): every forward of the actor (old log-probs and training) routes each
        token to the experts the rollout engine routed it to (the batch's `rollout_routed_experts`, SGLang's base64
        int32 `[len(tokens) - 1, moe_layers, top_k]`; the last token, never fed to the engine, keeps expert ids
        0..k-1, as do padding slots: their outputs score nothing);
    --use-routing-replay (slime's R2): the old-policy scoring pass records the trainer's own routing
        (`replay_routing` in compute_log_probs' answer) and the training forwards replay it, so the optimizer
        steps of one rollout keep the old policy's routing. Without a separate scoring pass (one step per rollout,
        old_log_probs_needed() false) the first training forward is that routing already: nothing to replay.

mcore's router sees the micro-batch's tokens sequence-major (`[s, b]` flattened: index s * b_size + b); the
targets are laid out the same way. One pipeline stage, no sequence parallelism (config checks refuse the rest).
"""
from __future__ import annotations

import torch

from slime_like.backends.engine_api.routed_experts import decode


def replay_routers(chunks) -> list:
    """The RouterReplay object of every MoE layer of the model, in layer order."""
    return [m.router_replay for chunk in chunks for m in chunk.modules()
            if getattr(m, "router_replay", None) is not None]


def rollout_routing(batch: dict, layers: int, topk: int) -> list[torch.Tensor]:
    """Per sample `[len(tokens), layers, topk]` int32 from the engine's routing (the last row filled)."""
    out = []
    for i, (tokens, value) in enumerate(zip(batch["tokens"], batch["rollout_routed_experts"])):
        if value is None:
            raise ValueError(f"sample {i}: no rollout_routed_experts (--use-rollout-routing-replay needs the "
                             "engine's routing of every sample)")
        rows = decode(value, len(tokens) - 1)
        if rows.shape[1] != layers * topk:
            raise ValueError(f"sample {i}: the engine routed {rows.shape[1]} expert ids per token; this model has "
                             f"{layers} MoE layers x top-{topk}")
        fill = torch.arange(topk, dtype=torch.int32).repeat(layers)[None]
        out.append(torch.cat([rows, fill]).reshape(len(tokens), layers, topk))
    return out


def _lengths(batch: dict, mb) -> list[int]:
    return [len(batch["tokens"][i]) for i in mb.sample_ids]


def targets(per_sample: list[torch.Tensor], batch: dict, mb, layers: int, topk: int) -> list[torch.Tensor]:
    """Per layer `[s * b, topk]` (int64) in mcore's token order for micro-batch `mb`."""
    lens = _lengths(batch, mb)
    b, s = mb.tokens.shape
    grid = torch.arange(topk, dtype=torch.int32).expand(b, s, layers, topk).clone()
    if b == 1:                                      # packed: the samples one after the other in one row
        grid[0, :sum(lens)] = torch.cat([per_sample[i] for i in mb.sample_ids])
    else:                                           # padded rows, one sample each
        for row, (i, n) in enumerate(zip(mb.sample_ids, lens)):
            grid[row, :n] = per_sample[i]
    flat = grid.transpose(0, 1).reshape(s * b, layers, topk).long()
    return [flat[:, layer] for layer in range(layers)]


def per_sample(recorded: list[torch.Tensor], batch: dict, mb, topk: int) -> dict[int, torch.Tensor]:
    """Inverse of `targets`: the routing mcore recorded for `mb`, per sample `[len, layers, topk]` int32."""
    lens = _lengths(batch, mb)
    b, s = mb.tokens.shape
    grid = torch.stack([r.reshape(s, b, topk) for r in recorded], dim=2).transpose(0, 1).to(torch.int32).cpu()
    if b == 1:
        parts = torch.split(grid[0, :sum(lens)], lens)
    else:
        parts = [grid[row, :n] for row, n in enumerate(lens)]
    return {i: p.clone() for i, p in zip(mb.sample_ids, parts)}


class RoutingReplay:
    """The actor's replay state: which routing its next forwards use (set per pass by the trainer)."""

    def __init__(self, args, chunks):
        on = bool(args.use_routing_replay or args.use_rollout_routing_replay)
        self.routers = replay_routers(chunks) if on else []
        self.args, self.topk = args, int(args.moe_router_topk)
        self.batch = self.source = None     # the batch being run and its per-sample routing (None: route freely)
        self.recording = False
        self.recorded: dict[int, torch.Tensor] = {}

    def begin(self, batch: dict, scoring: bool) -> None:
        """Before the actor's forwards over `batch`: R3 replays the engine's routing in every pass; R2 records in
        the scoring pass and replays what it recorded (`replay_routing`) in training."""
        if not self.routers:
            return
        self.batch, self.recorded = batch, {}
        if self.args.use_rollout_routing_replay:
            self.source = rollout_routing(batch, len(self.routers), self.topk)
        elif scoring:
            self.source, self.recording = None, True
        else:
            self.source = batch.get("replay_routing")

    def end(self) -> list | None:
        """After the pass: R2's recording per sample (in batch order), else None."""
        out = [self.recorded[i] for i in range(len(self.batch["tokens"]))] if self.recording else None
        self.batch = self.source = None
        self.recording, self.recorded = False, {}
        return out

    def before_forward(self, model_is_actor: bool, mb) -> None:
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        if not self.routers or not model_is_actor:
            return
        for r in self.routers:
            r.clear_indices()
            r.clear_router_replay_action()
        if self.recording:
            for r in self.routers:
                r.set_router_replay_action(RouterReplayAction.RECORD)
        elif self.source is not None:
            device = mb.tokens.device
            for r, t in zip(self.routers, targets(self.source, self.batch, mb, len(self.routers), self.topk)):
                r.set_target_indices(t.to(device))
                r.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)

    def after_forward(self, model_is_actor: bool, mb) -> None:
        if self.routers and model_is_actor and self.recording:
            self.recorded.update(per_sample([r.get_recorded_indices() for r in self.routers], self.batch, mb,
                                            self.topk))
