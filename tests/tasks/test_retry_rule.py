"""Which failures a stage task retries: crashes and storage errors yes; code errors and NaN losses no."""

from __future__ import annotations

import pytest
from prefect.states import Failed

from tasks.runner.common import StageFailed, WorkerCrashed, artifact_key, fingerprint, retry_on_crash
from tasks.storage.manifest import StageRef
from tasks.storage.store import StoreError, TransientStoreError


@pytest.mark.parametrize("exc, retried", [
    (WorkerCrashed("grpo_train worker process died: killed by SIGKILL"), True),
    (TransientStoreError("S3 endpoint http://x: error while uploading"), True),
    (ConnectionError("reset"), True),
    (StoreError("access denied by S3 endpoint http://x"), False),  # configuration: retrying cannot help
    (StageFailed("grpo_train failed in rank 0: ValueError: bad"), False),
    (FloatingPointError("non-finite SFT loss nan at step 3"), False),
    (KeyError("answer"), False),
])
def test_retry_condition(exc, retried):
    assert retry_on_crash(None, None, Failed(data=exc)) is retried


def _ref(version: str) -> StageRef:
    return StageRef(run="r", stage="prepare_data", version=version, path=f"r/prepare_data/{version}",
                    fingerprint="f", created="t")


def test_fingerprint_depends_on_config_and_exact_parent_versions():
    from grpo_core.config import GRPOConfig

    a = fingerprint("grpo_train", GRPOConfig(), {"prepare_data": _ref("v1")})
    assert a == fingerprint("grpo_train", GRPOConfig(), {"prepare_data": _ref("v1")})
    assert a != fingerprint("grpo_train", GRPOConfig(beta=0.5), {"prepare_data": _ref("v1")})
    assert a != fingerprint("grpo_train", GRPOConfig(), {"prepare_data": _ref("v2")})
    assert a != fingerprint("final_rl", GRPOConfig(), {"prepare_data": _ref("v1")})


def test_artifact_keys_are_prefect_safe():
    assert artifact_key("My_Run.1", "grpo_train", "progress") == "my-run-1-grpo-train-progress"
