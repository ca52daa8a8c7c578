"""``r1 check`` on the CPU configs (built-in tasks, the tiny model built by prepare_data: nothing to stand in for),
and every file in configs/ has its check in CI."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.flows.check_cases import ROOT, assert_check_passes

CHECKED_HERE = ("ci-tiny.yaml", "tiny-cpu.yaml")


def test_every_shipped_config_is_checked():
    """A config added to configs/ without a check test fails here: a config that cannot run must not ship."""
    tests = Path(__file__).parent
    checked = set(CHECKED_HERE) | {name for f in tests.glob("test_check_*.py") for name in
                                   (p.name for p in (ROOT / "configs").glob("*.yaml")) if f'"{name}"' in f.read_text()}
    assert {p.name for p in (ROOT / "configs").glob("*.yaml")} <= checked


@pytest.mark.slow
@pytest.mark.parametrize("config_name", CHECKED_HERE)
def test_check_runs_the_cpu_configs_end_to_end(tmp_path, config_name):
    assert_check_passes(config_name, tmp_path, gpu=False)
