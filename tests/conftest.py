"""Shared fixtures. Real data sets are read from ../shared/data (never copied into the repo)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("R1_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data sets not found at {SHARED_DATA} (set R1_SHARED_DATA to the folder)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server on 127.0.0.1 (as s3fs's own tests use); yields its endpoint URL."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per S3 request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """AWS_* variables pointing s3fs/boto3 at the moto server, and a fresh bucket ``r1-test``; yields its URL."""
    import uuid

    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret-never-logged")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    bucket = f"r1-test-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=bucket)
    yield f"s3://{bucket}/runs"
