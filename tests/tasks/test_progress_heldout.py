"""The Prefect progress artifact of a training stage (tasks.runner.common.Progress): with eval_steps it shows the latest
held-out evaluation, with the step it was made at, until the next one; every update goes through the one client
made with the artifact (Prefect's update_progress_artifact makes a client per call, each loading the CA bundle:
~0.2 s of CPU, taken from the trainer on every update)."""

from __future__ import annotations

import prefect.artifacts
import prefect.client.orchestration

import tasks.runner.common
from tasks.runner.common import Progress


class FakeClient:
    def __init__(self) -> None:
        self.shown: list[tuple[str, float, str]] = []

    def update_artifact(self, artifact_id, artifact):
        self.shown.append((artifact_id, artifact.data, artifact.description))


def test_progress_shows_the_latest_heldout_evaluation_until_the_next_through_one_client(monkeypatch):
    clients: list[FakeClient] = []
    monkeypatch.setattr(tasks.runner.common, "in_prefect_run", lambda: True)
    monkeypatch.setattr(prefect.artifacts, "create_progress_artifact", lambda *a, **k: "artifact-id")
    monkeypatch.setattr(prefect.client.orchestration, "get_client",
                        lambda sync_client=False: clients.append(FakeClient()) or clients[-1])
    progress = Progress("r", "grpo_train")
    progress.update(25, 100, {"reward": 0.5, "loss": 0.1, "eval/accuracy": 0.75, "eval/pass@1": 0.5})
    progress.update(26, 100, {"reward": 0.6, "loss": 0.1})
    progress.update(26, 100, {"reward": 0.6, "loss": 0.1})  # under 1% further: not sent
    progress.update(27, 100, {"reward": 0.7, "loss": 0.1})
    for step in range(28, 101):
        progress.update(step, 100, {"reward": 0.7, "loss": 0.1})
    assert len(clients) == 1  # one client for the stage, however many updates
    shown = clients[0].shown
    assert shown[0] == ("artifact-id", 25.0, "step 25/100 {'reward': 0.5, 'loss': 0.1, 'eval/accuracy': 0.75, "
                                             "'eval/pass@1': 0.5, 'eval_step': 25}")
    assert [pct for _, pct, _ in shown[:3]] == [25.0, 26.0, 27.0] and shown[-1][1] == 100.0
    assert all("'eval/accuracy': 0.75" in d and "'eval_step': 25" in d for _, _, d in shown)
