"""`r1` sets OMP_WAIT_POLICY=PASSIVE for its own process (inline stages, the temporary Prefect server) and so for
every stage child, unless the user set it (tasks/runner/launch.py gives it to children started elsewhere)."""

from __future__ import annotations

import os
import sys

import pytest

from flows.cli import main


@pytest.mark.parametrize("value", [None, "ACTIVE"])
def test_r1_sets_the_wait_policy_unless_the_user_did(value: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["r1", "--help"])
    if value is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", value)
    with pytest.raises(SystemExit):
        main()
    assert os.environ["OMP_WAIT_POLICY"] == (value or "PASSIVE")
