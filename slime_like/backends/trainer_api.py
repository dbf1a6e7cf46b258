"""The trainer backend interface, and the registry that maps `--train-backend NAME` to an implementation.

One instance is one rank of one role (actor or critic). The Ray layer (`ray/trainer_group.py`) builds it with
`build(args, role=, rank=, world_size=, master_addr=, master_port=, resume_iteration=)` and then calls only the
methods below (`resume_iteration`: the run's checkpoint iteration, the same for every role; None: a fresh start,
or the backend's latest published iteration of --load).
Every method that runs collectives must be called on every rank of the role's group. Batches are dicts of
per-sample lists (`rollout/batch.py` builds them); per-token outputs are 1-D float32 CPU tensors over each
response, in batch order, identical on every rank of one model replica.

A new backend implements `TrainerBackend` and registers its class under its flag value (`register_backend`, or
an entry of slime_like/registry.py's TRAINER_BACKENDS, imported lazily so `--dry-run` stays free of torch).
"""
from __future__ import annotations

from typing import Iterator, Protocol, runtime_checkable

from slime_like.config.role_overrides import ROLES
from slime_like.registry import TRAINER_BACKENDS

# Roles a backend runs: the YAML overlay roles, plus "reference", a frozen forward-only copy placed on GPUs of its
# own (--placement reference:...); its compute_log_probs returns {"ref_log_probs": ...} and nothing else is called
# on it. A backend that cannot run it raises in its constructor.
TRAINER_ROLES = ROLES + ("reference",)


@runtime_checkable
class TrainerBackend(Protocol):
    # the rollout id whose checkpoint was loaded at start (None: a fresh start, or --finetune)
    loaded_rollout_id: int | None
    # what save() writes: "torch_dist" (Megatron distributed checkpoint), "dcp" (torch DCP), ...
    checkpoint_format: str

    def parallel_info(self) -> dict:
        """This rank's place: dp_rank, dp_size, tp_rank, pp_rank (the Ray layer shards data by dp_rank and picks
        weight senders among tp_rank == 0, dp_rank == 0)."""

    def old_log_probs_needed(self) -> bool:
        """Whether train_step needs the old policy's log-probs from a separate forward pass first."""

    def compute_log_probs(self, batch: dict, old_policy: bool = True) -> dict:
        """Actor: `log_probs` (skipped when old_policy is False) and `ref_log_probs` with a reference model inside;
        role "reference": `ref_log_probs` only."""

    def compute_values(self, batch: dict) -> dict:
        """Critic: per-token `values`."""

    def compute_advantages(self, batch: dict) -> dict:
        """`advantages` and `returns` per sample (the estimator's token step, whitening over all DP ranks)."""

    def train_step(self, rollout_id: int, batch: dict) -> dict:
        """The rollout's optimizer steps; metrics averaged over DP ranks (the same dict on every rank)."""

    def iter_hf_weights(self) -> Iterator[tuple[str, object]]:
        """(HF name, full tensor) pairs for weight sync; every rank iterates (gathers are collectives)."""

    def save(self, rollout_id: int) -> str:
        """Checkpoint this role into its --save directory; returns the directory."""

    def offload(self) -> None:
        """Release accelerator memory while colocated engines generate (a no-op record on CPU)."""

    def onload(self) -> None:
        """Inverse of offload()."""


# --train-backend value -> "module:Class" whose constructor takes (args, role=, rank=, world_size=, master_addr=,
# master_port=, resume_iteration=): a subclass of backends/training/base.py RLTrainerBase, registered in
# slime_like/registry.py's TRAINER_BACKENDS, the table the parser's choices come from.


def register_backend(name: str, target: str | type, **entry) -> None:
    """Add a trainer backend under its `--train-backend` value (a class or a lazy "module:Class" path); `entry`:
    capabilities, flag_group, add_flags, validator (slime_like/registry.py). It is a valid choice from then on."""
    TRAINER_BACKENDS.register(name, target, **entry)


def backend_names() -> list[str]:
    return sorted(TRAINER_BACKENDS.names())


def backend_class(name: str) -> type:
    if name not in TRAINER_BACKENDS:
        raise ValueError(f"unknown --train-backend {name!r}; registered: {backend_names()}")
    return TRAINER_BACKENDS.load(name)


def build(args, *, role: str, rank: int, world_size: int, master_addr: str, master_port: int,
          resume_iteration: int | None = None) -> TrainerBackend:
    """One rank of `role` of the backend named by `args.train_backend`, resuming from `resume_iteration` of its
    --load (the driver's choice for the whole run: ray/run_checkpoint.py)."""
    if role not in TRAINER_ROLES:
        raise ValueError(f"trainer role must be one of {TRAINER_ROLES}, got {role!r}")
    return backend_class(args.train_backend)(args, role=role, rank=rank, world_size=world_size,
                                             master_addr=master_addr, master_port=master_port,
                                             resume_iteration=resume_iteration)
