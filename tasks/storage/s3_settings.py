"""How the store talks to S3: the endpoint's name for messages, and the time and retry bounds of every request,
read from the ``R1_S3_*`` variables (s3fs options built from them).
"""

from __future__ import annotations

import os
from typing import Any

from tasks.storage.manifest import StoreError


def endpoint_name() -> str:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS S3 (default endpoint)"


# Every S3 operation is bounded as a whole (``tasks/storage/deadline.py``): R1_S3_READ_TIMEOUT is the longest one store
# operation (a listing, a read, a write; retries included) waits for the endpoint, and for a transfer the longest
# stretch without a finished block (``CHUNK``), so a multipart upload of a big checkpoint takes as long as it needs
# while bytes keep flowing. Inside that bound botocore's read_timeout (the same value) ends each silent request
# and R1_S3_MAX_ATTEMPTS x ``S3_TRIES`` retry the ones that fail fast (a 5xx, a reset); they no longer add up.
S3_TIMEOUT_ENV = {"connect": ("R1_S3_CONNECT_TIMEOUT", 10.0), "read": ("R1_S3_READ_TIMEOUT", 60.0)}
S3_ATTEMPTS_ENV = ("R1_S3_MAX_ATTEMPTS", 3)
S3_TRIES = 2  # s3fs's ``retries``: tries per call (its default, 5 with backoff, multiplies into minutes)


def _env_number(name: str, default: float, minimum: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= minimum:  # also NaN
        raise StoreError(f"{name}={raw!r} is not a number >= {minimum:g}; unset it for the default ({default:g})")
    return value


def s3_timeouts() -> dict[str, float]:
    """Connect and read timeouts (seconds) and attempts per request, from the ``R1_S3_*`` variables."""
    out = {key: _env_number(env, default, 0.1) for key, (env, default) in S3_TIMEOUT_ENV.items()}
    out["attempts"] = int(_env_number(S3_ATTEMPTS_ENV[0], S3_ATTEMPTS_ENV[1], 1))
    return out


def s3_options(t: dict[str, float], attempts: int | None = None) -> dict[str, Any]:
    """s3fs options for timeouts ``t`` (``s3_timeouts()``); ``attempts`` overrides ``t["attempts"]``."""
    # A fresh client per Store: the endpoint and credentials are read from the environment at creation.
    return {"config_kwargs": {"connect_timeout": t["connect"], "read_timeout": t["read"],
                              "retries": {"total_max_attempts": attempts or int(t["attempts"]), "mode": "standard"}},
            "skip_instance_cache": True}


def timed_out(e: BaseException) -> bool:
    """A connect or read timeout from botocore, aiohttp or asyncio (s3fs passes each through)."""
    return isinstance(e, TimeoutError) or "Timeout" in type(e).__name__ or "timeout on endpoint" in str(e).lower()
