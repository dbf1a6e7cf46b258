"""The per-run engine secret: who may call an engine's HTTP routes.

Every engine route (ours, SGLang's and vLLM's ``--api-key``) requires ``Authorization: Bearer <secret>``.
The driver generates one secret per run (``secrets.token_urlsafe``) unless the user gives one for engines
they started themselves (``--engine-api-key`` or the environment variable below, which keeps it out of
``ps`` listings and shell history). The CPU engine reads it from the same variable, never from its argv.
See docs/security.md for the threat model.
"""
from __future__ import annotations

import hmac
import os
import secrets

API_KEY_ENV = "SLIME_LIKE_ENGINE_API_KEY"


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def resolve_api_key(explicit: str | None = None) -> str | None:
    """The key a client sends: the explicit one, else the environment's, else None (no header)."""
    return explicit or os.environ.get(API_KEY_ENV) or None


def auth_headers(api_key: str | None = None) -> dict:
    key = resolve_api_key(api_key)
    return {"Authorization": f"Bearer {key}"} if key else {}


def authorized(header: str | None, api_key: str) -> bool:
    """Constant-time check of an ``Authorization`` header value against the expected key."""
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer "):].encode(), api_key.encode())
