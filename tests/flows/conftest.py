"""Real Prefect for the flow tests: one temporary server for the session (~20 s to start on 2 cores)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")


@pytest.fixture(scope="session", autouse=True)
def prefect_harness(tmp_path_factory):
    from prefect.settings import (
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        PREFECT_HOME,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        temporary_settings,
    )
    from prefect.testing.utilities import prefect_test_harness

    home = tmp_path_factory.mktemp("prefect-home")
    with temporary_settings(updates={PREFECT_HOME: str(home), PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None,
                                     PREFECT_SERVER_ANALYTICS_ENABLED: False}):
        with prefect_test_harness(server_startup_timeout=300):
            yield
