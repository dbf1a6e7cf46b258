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


class OldActorWeights:
    """The pushed weight copies of one actor rank (MegatronTrainer.old_actor): `chunks` are the model chunks the
    copies are taken from and swapped into; `max_staleness` bounds how many are kept."""

    def __init__(self, chunks: list, max_staleness: int | None):
        self.chunks = chunks
        self.kept_versions = max(2, int(max_staleness or 0) + 1)
        self.pushed: dict = {}
        self.trained = None

    def _host_copy(self) -> list[dict]:
        return [{name: p.detach().to("cpu", copy=True) for name, p in chunk.named_parameters()}
                for chunk in self.chunks]

    def keep_trained(self) -> None:
        """After each train step: the weights the next push sends. Copied now, while they are resident (a
        colocated GPU trainer is offloaded by the time the push happens)."""
        self.trained = self._host_copy()

    def remember_pushed(self, version) -> None:
        """After every weight push, with the version the engines now report."""
        self.pushed[int(version)] = self.trained if self.trained is not None else self._host_copy()  # first: loaded
        self.trained = None
        while len(self.pushed) > self.kept_versions:
            del self.pushed[min(self.pushed)]

    @contextlib.contextmanager
    def _weights_of(self, version: int):
        """The actor's parameters hold the pushed copy `version` inside the block, their own values after it."""
        saved = [{name: p.detach().clone() for name, p in chunk.named_parameters()} for chunk in self.chunks]
        try:
            with torch.no_grad():
                for chunk, copy in zip(self.chunks, self.pushed[version]):
                    for name, p in chunk.named_parameters():
                        p.copy_(copy[name].to(p.device))
            yield
        finally:
            with torch.no_grad():
                for chunk, own in zip(self.chunks, saved):
                    for name, p in chunk.named_parameters():
                        p.copy_(own[name])

    def log_probs(self, batch: dict, score) -> list:
        """Per-sample old-policy log-probs, each from the weights of its sample's `weight_versions` entry (a
        version no longer or never kept, or no versions at all: the latest push; nothing pushed yet: the
        current weights, which are then the ones the engines started from). `score(batch)` is the actor's
        scoring pass with whatever weights its chunks hold."""
        n = len(batch["tokens"])
        if not self.pushed:
            return score(batch)
        versions = batch.get("weight_versions") or [None] * n
        latest = max(self.pushed)
        resolved = [v if v in self.pushed else latest for v in versions]
        out = [None] * n
        for version in sorted(set(resolved)):
            idx = [i for i, v in enumerate(resolved) if v == version]
            sub = {k: [vals[i] for i in idx] for k, vals in batch.items() if isinstance(vals, list) and len(vals) == n}
            with self._weights_of(version):
                for i, lp in zip(idx, score(sub)):
                    out[i] = lp
        return out
