"""--keep-old-actor (slime): the trainer keeps the weights it pushed to the engines, and scores each sample's
old-policy log-probs with the weights that generated it.

Why: with --update-weights-interval > 1, train_async.py's one-step-off pipeline or the fully async rollout, the
engines generate with weights older than the trainer's, so the PPO ratio's "old policy" must be those weights,
not the trainer's current ones. Each push is kept as a CPU copy keyed by its weight version (the one the engines
report with every answer, Sample.weight_versions); a sample is scored with the copy of its oldest version. slime
keeps the same two-deep queue of "rollout_actor" / "old_actor" copies; keyed versions also serve the fully async
mode, where a batch mixes versions (up to --max-staleness + 1 copies are kept).
Memory: one host copy of the model's weights per kept version.
"""
from __future__ import annotations

import contextlib

import torch


class OldActorMixin:
    """Needs `self.args`, `self.chunks` and `self._forward_only(model, batch, kind)` (MegatronTrainer)."""

    def _kept_versions(self) -> int:
        return max(2, int(self.args.max_staleness or 0) + 1)

    def _host_copy(self) -> list[dict]:
        return [{name: p.detach().to("cpu", copy=True) for name, p in chunk.named_parameters()}
                for chunk in self.chunks]

    def keep_trained_weights(self) -> None:
        """After each train step: the weights the next push sends. Copied now, while they are resident (a
        colocated GPU trainer is offloaded by the time the push happens)."""
        self._trained = self._host_copy()

    def remember_pushed_weights(self, version) -> None:
        """Called after every weight push with the version the engines now report."""
        if not hasattr(self, "_pushed"):
            self._pushed = {}
        trained = getattr(self, "_trained", None)
        self._pushed[int(version)] = trained if trained is not None else self._host_copy()  # first push: as loaded
        self._trained = None
        while len(self._pushed) > self._kept_versions():
            del self._pushed[min(self._pushed)]

    @contextlib.contextmanager
    def _weights_of(self, version: int):
        """The actor's parameters hold the pushed copy `version` inside the block, their own values after it."""
        saved = [{name: p.detach().clone() for name, p in chunk.named_parameters()} for chunk in self.chunks]
        try:
            with torch.no_grad():
                for chunk, copy in zip(self.chunks, self._pushed[version]):
                    for name, p in chunk.named_parameters():
                        p.copy_(copy[name].to(p.device))
            yield
        finally:
            with torch.no_grad():
                for chunk, own in zip(self.chunks, saved):
                    for name, p in chunk.named_parameters():
                        p.copy_(own[name])

    def old_actor_log_probs(self, batch: dict) -> list:
        """Per-sample old-policy log-probs, each from the weights of its sample's `weight_versions` entry (a
        version no longer or never kept, or no versions at all: the latest push; nothing pushed yet: the
        current weights, which are then the ones the engines started from)."""
        pushed = getattr(self, "_pushed", {})
        n = len(batch["tokens"])
        if not pushed:
            return self._forward_only(self.model, batch, "logp")
        versions = batch.get("weight_versions") or [None] * n
        latest = max(pushed)
        resolved = [v if v in pushed else latest for v in versions]
        out = [None] * n
        for version in sorted(set(resolved)):
            idx = [i for i, v in enumerate(resolved) if v == version]
            sub = {k: [vals[i] for i in idx] for k, vals in batch.items() if isinstance(vals, list) and len(vals) == n}
            with self._weights_of(version):
                for i, lp in zip(idx, self._forward_only(self.model, sub, "logp")):
                    out[i] = lp
        return out
