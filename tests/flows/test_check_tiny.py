"""``r1 check`` on the embedded default (built-in tasks, the tiny model built by prepare_data: nothing to stand in
for), and every file in configs/ has its check (ci-tiny.yaml runs in full in test_pipeline.py). In the CI tier:
ci-tiny's full run and qwen2.5-7b-math-lora's check; this one and the 0.5B and 8-GPU 7B checks are in the extended
tier (``pytest -m extended``), to keep CI within its time."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.flows.check_cases import ROOT, assert_check_passes

CHECKED_HERE = ("tiny-cpu.yaml", "tiny-tools.yaml")
# Configs the suite runs in full (every stage, real Prefect, S3), a stronger check than the miniature one.
RUN_IN_FULL = {"ci-tiny.yaml": Path(__file__).parent / "test_pipeline.py"}


def test_every_shipped_config_is_checked():
    """A config added to configs/ without a check test fails here: a config that cannot run must not ship."""
    tests = Path(__file__).parent
    assert all(f'"{name}"' in test.read_text() for name, test in RUN_IN_FULL.items())
    checked = set(CHECKED_HERE) | set(RUN_IN_FULL) | {name for f in tests.glob("test_check_*.py") for name in
                                   (p.name for p in (ROOT / "configs").glob("*.yaml")) if f'"{name}"' in f.read_text()}
    assert {p.name for p in (ROOT / "configs").glob("*.yaml")} <= checked


@pytest.mark.extended
@pytest.mark.slow
@pytest.mark.parametrize("config_name", CHECKED_HERE)
def test_check_runs_the_cpu_configs_end_to_end(tmp_path, config_name):
    assert_check_passes(config_name, tmp_path, gpu=False)
