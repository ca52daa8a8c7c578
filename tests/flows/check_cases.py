"""What every ``r1 check`` test asserts of a shipped config (tests/flows/test_check_*.py: one file per GPU config,
so the two workers of the suite run them side by side)."""

from __future__ import annotations

from pathlib import Path

from tests.standins import run_check

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("prepare_data", "cold_start_sft", "grpo_train", "rejection_sample", "sft_consolidate", "final_rl")


def assert_check_passes(config_name: str, tmp_path: Path, *, gpu: bool, logs: bool = False) -> str:
    """The config runs end to end in miniature against stand-ins of its hub models and data sets; every stage
    commits, the user's store is never touched; returns the output (with ``logs`` the stages' log lines after it)."""
    out = run_check(ROOT / "configs" / config_name, tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]
    assert "check passed" in out.stdout
    for stage in STAGES:
        assert any(line.split()[:2] == [stage, "completed"] for line in out.stdout.splitlines()), (stage, out.stdout[-3000:])
    assert "what the real run spends" in out.stdout
    if gpu:  # the plan for the config's hardware header comes first
        assert "plan for" in out.stdout and "fits" in out.stdout
    assert not (tmp_path / "user-store").exists()
    return out.stdout + out.stderr if logs else out.stdout
