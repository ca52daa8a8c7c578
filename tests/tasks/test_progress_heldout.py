"""The Prefect progress artifact of a GRPO stage with eval_steps shows the latest held-out evaluation, with the step it
was made at, until the next one (tasks.common.Progress)."""

from __future__ import annotations

import prefect.artifacts

from tasks.common import Progress


def test_progress_shows_the_latest_heldout_evaluation_until_the_next(monkeypatch):
    shown = []
    monkeypatch.setattr(prefect.artifacts, "update_progress_artifact",
                        lambda id, pct, description: shown.append((pct, description)))
    progress = Progress("r", "grpo_train")
    progress.id = "artifact-id"  # as inside a Prefect run
    progress.update(25, 100, {"reward": 0.5, "loss": 0.1, "eval/accuracy": 0.75, "eval/pass@1": 0.5})
    progress.update(26, 100, {"reward": 0.6, "loss": 0.1})
    progress.update(27, 100, {"reward": 0.7, "loss": 0.1})
    assert shown[0] == (25.0, "step 25/100 {'reward': 0.5, 'loss': 0.1, 'eval/accuracy': 0.75, 'eval/pass@1': 0.5, "
                              "'eval_step': 25}")
    assert [pct for pct, _ in shown] == [25.0, 26.0, 27.0]
    assert all("'eval/accuracy': 0.75" in d and "'eval_step': 25" in d for _, d in shown)
