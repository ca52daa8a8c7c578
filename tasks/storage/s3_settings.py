"""How the store talks to S3: the endpoint's name for messages, the time and retry bounds of every request (read
from the ``R1_S3_*`` variables; s3fs options built from them), and its errors as one line each (``explain``).
"""

from __future__ import annotations

import os
from typing import Any

from tasks.storage.manifest import StoreError, TransientStoreError


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


class StoreStalled(StoreError):
    """An S3 operation got no answer within R1_S3_READ_TIMEOUT. Not retried by the stage task: the operation
    has waited its whole limit already, so the stage fails within it."""


def stalled(action: str, url: str, timeouts: dict[str, float]) -> StoreStalled:
    return StoreStalled(f"cannot reach S3 endpoint {endpoint_name()} for {url} while {action}: no answer "
                        f"within {timeouts['read']:g} s (R1_S3_READ_TIMEOUT, the limit on one store "
                        "operation); check AWS_ENDPOINT_URL_S3 and the network")


def explain(e: BaseException, action: str, url: str, timeouts: dict[str, float]) -> StoreError:
    """One line that says what failed and where (the store at ``url``; ``timeouts``: ``s3_timeouts()`` for an S3
    store, {} for a local one), never credentials."""
    if isinstance(e, StoreError):  # already explained (a stall, an integrity error)
        return e
    msg = f"{type(e).__name__}: {e}".splitlines()[0][:300]
    if not timeouts:
        return TransientStoreError(f"store {url}: error while {action} ({msg})")
    where = f"S3 endpoint {endpoint_name()} for {url}"
    text = str(e)
    if timed_out(e):
        if any(w in f"{type(e).__name__} {text}".lower() for w in ("connecttimeout", "connectiontimeout",
                                                                    "connect timeout")):
            return StoreError(f"cannot reach {where} while {action}: no connection within "
                              f"{timeouts['connect']:g} s (R1_S3_CONNECT_TIMEOUT); check "
                              "AWS_ENDPOINT_URL_S3 and the network")
        return stalled(action, url, timeouts)
    if isinstance(e, PermissionError) or any(s in text for s in ("AccessDenied", "InvalidAccessKeyId",
                                                                 "SignatureDoesNotMatch", "Forbidden")):
        return StoreError(f"access denied by {where} while {action} ({msg}); check AWS_ACCESS_KEY_ID / "
                          "AWS_SECRET_ACCESS_KEY and the bucket policy")
    if "NoSuchBucket" in text or isinstance(e, FileNotFoundError):
        return StoreError(f"bucket not found at {where} while {action} ({msg}); create it first")
    if any(s in text for s in ("Could not connect", "Connect timeout", "ConnectTimeout",
                               "Connection refused", "EndpointConnectionError", "Name or service")):
        return StoreError(f"cannot reach {where} while {action} ({msg}); check AWS_ENDPOINT_URL_S3 "
                          "and the network")
    return TransientStoreError(f"{where}: error while {action} ({msg})")
