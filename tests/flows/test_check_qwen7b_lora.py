"""``r1 check`` on configs/qwen2.5-7b-math-lora.yaml with the 7B config's stand-ins (tests/standins.py): every stage
trains LoRA adapters on Qwen2.5-Math-7B's architecture in miniature, vLLM samples from the merged weights (checked
after every sync), each committed model is the merged folder with its adapter beside it."""

from __future__ import annotations

import pytest

from tests.flows.check_cases import assert_check_passes


@pytest.mark.slow
def test_check_runs_the_7b_lora_config_end_to_end(tmp_path):
    out = assert_check_passes("qwen2.5-7b-math-lora.yaml", tmp_path, gpu=True)
    assert "plan for 1x" in out
