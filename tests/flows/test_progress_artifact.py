"""A training stage's progress artifact on a real Prefect server: created at 0%, updated through one client, read
back at the last update's value and description (tasks.runner.common.Progress)."""

from __future__ import annotations

import prefect.client.orchestration


def test_progress_artifact_reaches_the_server_through_one_client(monkeypatch):
    from prefect import flow
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from tasks.runner.common import Progress, artifact_key

    made = []
    real = prefect.client.orchestration.get_client

    def counting(*args, **kwargs):
        made.append(kwargs.get("sync_client", False))
        return real(*args, **kwargs)

    @flow(name="progress-artifact")
    def stage() -> None:
        progress = Progress("progress-run", "grpo_train")
        monkeypatch.setattr(prefect.client.orchestration, "get_client", counting)  # from here: updates only
        for step in range(1, 51):
            progress.update(step, 50, {"reward": step / 50, "loss": 0.1})

    stage()
    assert made == []  # fifty updates, no new client
    with real(sync_client=True) as client:
        (artifact,) = client.read_latest_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[artifact_key("progress-run", "grpo_train", "progress")])))
    assert artifact.type == "progress" and artifact.data == 100.0
    assert artifact.description == "step 50/50 {'reward': 1.0, 'loss': 0.1}"
