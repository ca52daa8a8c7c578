"""The fence crosses the process boundary: under ``run.isolation: subprocess`` the training child commits the
checkpoints, and once another writer takes the run it commits none (issue 45: 31 checkpoints in the 14 s after a
takeover, and the new writer resumed from them)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from tasks.config.pipeline import PipelineConfig
from tasks.config.stages import get_stage
from tasks.storage.lease import LEASE, acquire_lease
from tasks.storage.store import Store
from tests.tasks.test_training_spec import TINY, commit_prepare_data

RUN = "taken"


def complete_steps(root: Path) -> set[int]:
    """Steps of the checkpoints committed (``_COMPLETE`` written) in the run's cold_start_sft stage."""
    return {int(p.parent.name.split("-")[1])
            for p in (root / RUN / "cold_start_sft" / "_checkpoints").glob("*/checkpoint-*/_COMPLETE")}


def test_the_training_child_of_a_writer_that_lost_its_lease_commits_no_checkpoint(tmp_path):
    config = PipelineConfig.model_validate({
        "model": {"tiny": TINY},
        "cold_start_sft": {"max_steps": 60, "per_device_train_batch_size": 4, "max_length": 64, "learning_rate": 1e-3,
                           "save_steps": 1, "report_to": ["jsonl"]},
        "run": {"isolation": "subprocess", "torch_num_threads": 1, "retries": 0, "keep_checkpoints": 100},
    })
    root = tmp_path / "store"
    store = Store(root)
    data = commit_prepare_data(store, RUN, tmp_path)
    at_takeover: dict[str, set[int]] = {}

    def take_over() -> None:  # another writer takes the run (--force-unlock) once the child has checkpointed
        deadline = time.monotonic() + 120
        while not complete_steps(root) and time.monotonic() < deadline:
            time.sleep(0.05)
        store.write_json(store.run_file(RUN, LEASE), {"owner": "b", "host": "host-b", "pid": 4242,
                                                     "heartbeat_at": time.time(), "expires_at": time.time() + 60})
        at_takeover["steps"] = complete_steps(root)

    taker = threading.Thread(target=take_over, daemon=True)
    with acquire_lease(store, RUN, heartbeat_s=0.5, settle_s=0):  # no on_lost: nothing stops the child but its fence
        taker.start()
        with pytest.raises(Exception) as err:
            get_stage("cold_start_sft").task.fn(config, RUN, str(root), {"prepare_data": data})
    taker.join(timeout=5)
    assert at_takeover["steps"], "the child committed no checkpoint before the takeover"
    assert complete_steps(root) <= at_takeover["steps"]  # nothing committed after the takeover
    assert "LeaseLost" in str(err.value) and "host-b pid 4242" in str(err.value)  # the child's own refusal
    assert max(at_takeover["steps"]) < 60


def test_the_owner_token_crosses_to_a_child_whose_check_wants_the_lease_ours_and_fresh(tmp_path):
    from tasks.storage.fence import HOLDER, MODE_ENV, OWNER_ENV, fence_env, owner_from_env
    from tasks.storage.lease import LeaseLost, owner_check

    store = Store(tmp_path)
    lease = acquire_lease(store, RUN, heartbeat_s=3600, settle_s=0)
    env = fence_env(store.url, RUN)
    assert env == {OWNER_ENV: lease.owner, MODE_ENV: HOLDER}
    check = owner_check(store, RUN, *owner_from_env(env))
    assert abs(check("a checkpoint") - lease.valid_until) < 1e-3  # the child's writes are bounded by it
    record = json.loads(store.read_text(store.run_file(RUN, LEASE)))
    store.write_json(store.run_file(RUN, LEASE), {**record, "heartbeat_at": time.time() - 100,
                                                 "expires_at": time.time() - 40})  # the parent stopped refreshing
    with pytest.raises(LeaseLost, match="not refreshed since"):
        check("a checkpoint")
    lease.release()
    store.remove_run_file(RUN, LEASE)
    with pytest.raises(LeaseLost, match="released or removed"):
        check("a checkpoint")
    with pytest.raises(ValueError, match="R1_LEASE_MODE='bogus'"):
        owner_from_env({OWNER_ENV: "x", MODE_ENV: "bogus"})
