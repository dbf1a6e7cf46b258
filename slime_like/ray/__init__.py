"""The Ray layer: placement groups, the trainer actor groups, the engine actors and the rollout manager."""
