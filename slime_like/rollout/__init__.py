"""Rollout: prompts -> engines (SGLang HTTP) -> samples -> rewards -> filters -> the trainer batch."""
