"""The shared training skeleton: the progress line's schedule and format."""

from __future__ import annotations

import logging

from grpo_core.trainer.skeleton import ProgressLog


def _logged(caplog, progress: ProgressLog, steps: range, **values: float) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="grpo_core.trainer.skeleton"):
        for step in steps:
            progress.update(step, **values)
    return caplog.messages


def test_progress_line_first_every_five_percent_and_last(caplog):
    lines = _logged(caplog, ProgressLog("grpo", 100, 0), range(1, 101), loss=0.0123, reward=0.512, lr=5e-5)
    assert [int(m.split()[2].split("/")[0]) for m in lines] == [1] + list(range(5, 101, 5))
    assert lines[7].startswith("grpo step 35/100 (35%) loss 0.0123 reward 0.512 lr 5e-05 elapsed ")
    assert lines[-1].endswith("ETA 0s")


def test_progress_line_after_a_resume_and_for_few_steps(caplog):
    lines = _logged(caplog, ProgressLog("sft", 50, 37), range(38, 51), loss=1.5, lr=1e-3)
    assert [int(m.split()[2].split("/")[0]) for m in lines] == [38, 39, 42, 45, 48, 50]  # every ceil(50/20)=3
    assert lines[0].startswith("sft step 38/50 (76%) loss 1.5 lr 0.001 elapsed ")
    assert [m.split()[2] for m in _logged(caplog, ProgressLog("sft", 3, 0), range(1, 4), loss=1.0)] == ["1/3", "2/3", "3/3"]
