"""``r1 check`` on configs/qwen2.5-0.5b-gsm8k.yaml with stand-ins of its hub models and data sets (tests/standins.py):
Qwen2.5-0.5B-Instruct's architecture, Qwen2Tokenizer and ChatML template, the Skywork Qwen3 reward model loaded
for rejection sampling, final RL and evaluation, GSM8K, UltraFeedback, PKU-SafeRLHF, OpenR1-Math and UltraChat in
their hub schemas read through ``datasets.load_dataset``; all of them together, as the real run has them."""

from __future__ import annotations

import pytest

from tests.flows.check_cases import assert_check_passes


@pytest.mark.extended
@pytest.mark.slow
def test_check_runs_the_05b_gsm8k_config_end_to_end(tmp_path):
    out = assert_check_passes("qwen2.5-0.5b-gsm8k.yaml", tmp_path, gpu=True)
    assert "rm_helpful (Skywork/Skywork-Reward-V2-Qwen3-0.6B)" in out  # the reward models final RL loads
    assert "data/num_train=" in out
