"""Is the Prefect server answering? One short probe before the CLI starts flows or registers deployments.

Prefect's client waits ``PREFECT_API_REQUEST_TIMEOUT`` (60 s) for each request and retries it 5 times
(``PREFECT_CLIENT_MAX_RETRIES``), so a server that accepts connections and never answers would keep
``r1 run`` or ``r1 deploy`` silent for many minutes. ``check_prefect_api`` sends one ``GET {api}/health``
through Prefect's own client (so its TLS and auth settings apply), with no retry, waiting at most
``R1_PREFECT_PROBE_TIMEOUT`` seconds (default 10), and fails with one line naming the URL. Without
``PREFECT_API_URL`` (Prefect's ephemeral mode) there is no server to probe.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

PROBE_TIMEOUT_ENV = "R1_PREFECT_PROBE_TIMEOUT"
DEFAULT_PROBE_TIMEOUT = 10.0


class PrefectAPIUnreachable(RuntimeError):
    """The configured Prefect server did not answer; the message names its URL and what to check."""


def probe_timeout() -> float:
    raw = os.environ.get(PROBE_TIMEOUT_ENV, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_PROBE_TIMEOUT
    except ValueError:
        value = float("nan")
    if not value > 0:  # also NaN
        raise PrefectAPIUnreachable(f"{PROBE_TIMEOUT_ENV}={raw!r} is not a number of seconds > 0; unset it for "
                                    f"the default ({DEFAULT_PROBE_TIMEOUT:g})")
    return value


def _shown(url: str) -> str:
    """``url`` without any user:password part."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


def check_prefect_api(*, serverless_ok: bool = True) -> None:
    """Raise ``PrefectAPIUnreachable`` unless the server at ``PREFECT_API_URL`` answers (any HTTP status) in time.

    ``serverless_ok``: the command also works without a server (``r1 run``), so the message offers that.
    """
    import httpx
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    url = PREFECT_API_URL.value()
    if not url:
        return
    timeout = probe_timeout()
    with temporary_settings(updates={PREFECT_CLIENT_MAX_RETRIES: 0}):
        with get_client(sync_client=True, httpx_settings={"timeout": httpx.Timeout(timeout)}) as client:
            problem = client.api_healthcheck()
    where = f"the Prefect API at {_shown(url)} (PREFECT_API_URL)"
    unset = ", or unset PREFECT_API_URL to run without a server" if serverless_ok else ""
    if isinstance(problem, httpx.TimeoutException):
        raise PrefectAPIUnreachable(f"no answer from {where} within {timeout:g} s ({PROBE_TIMEOUT_ENV}); check that "
                                    f"the server is up and the URL is right{unset}")
    if isinstance(problem, httpx.TransportError):
        reason = f"{type(problem).__name__}: {problem}".splitlines()[0][:200]
        raise PrefectAPIUnreachable(f"cannot connect to {where} ({reason}); start it (prefect server start) or "
                                    f"fix the URL{unset}")
    # Any HTTP answer (even an error status) means the server is alive; Prefect reports its own errors.
