"""What every rollout engine shares: the wire format (protocol, tensor serializer, weight-sync process group),
the one HTTP client, the process launcher, and the `Engine` interface with its `--rollout-engine` registry."""
