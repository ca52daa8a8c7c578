"""Tool calls in training (issue 43): GRPO steps whose rollouts are multi-turn trajectories (``sampling.tools``,
``trainer/rollouts.py``) with their ``tools/...`` metrics; SFT labels that leave a trace's tool turns out of the loss
(``trainer/sft.py``: ``encode_completion``) while a row without tool turns encodes as before; the prompts' tool
schemas; the config fields, their checks, and the tiny base with tool tokens in the pipeline config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from transformers import AutoTokenizer

import grpo_core.trainer.loop as loop_module
from grpo_core.config import DataConfig, GRPOConfig
from grpo_core.data.calc import make_calc_cold_start, make_calc_rows, tool_call_text
from grpo_core.data.general import make_general_cold_start, make_general_rows
from grpo_core.data.synthetic import make_chain_rows, make_cold_start_rows
from grpo_core.generation.base import Rollout
from grpo_core.generation.prompts import encode_prompt, encode_prompts
from grpo_core.generation.trajectory import TrajectoryStats
from grpo_core.models.tiny import build_tiny_model, build_tiny_tokenizer
from grpo_core.recipe.prepare import prepare_datasets
from grpo_core.tools import TOOL_RESPONSE_CLOSE, TOOL_RESPONSE_OPEN, ToolSet, tool_response_spans
from grpo_core.trainer.loop import train_grpo
from grpo_core.trainer.metrics import completion_metrics, tool_metrics
from grpo_core.trainer.sft import IGNORE_INDEX, encode_sft_row
from tasks.config.pipeline import ConfigError, PipelineConfig, load_config
from tests.grpo_core.run_helpers import read_metrics, scripted_rollout

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-tools"), hidden_size=32, num_layers=2, num_heads=2,
                            tool_tokens=True)


def _config(**kw) -> GRPOConfig:
    sampling = {"num_generations": 4, "max_prompt_length": 16, "max_completion_length": 96, "use_vllm": False,
                "tools": ["calculator"], "max_turns": 3, **kw.pop("sampling", {})}
    return GRPOConfig(**{"max_steps": 1, "save_steps": 10, "learning_rate": 1e-3, "generation_batch_size": 8,
                         "per_device_train_batch_size": 8, "beta": 0.04, "report_to": ["jsonl"],
                         "reward_funcs": ["calc_accuracy"], "sampling": sampling, **kw})


# --- GRPO with tool rollouts ---


class CalcSampler:
    """A sampler that knows the calc format: in its first turn, completion j of a prompt calls the calculator when its
    seed is even and answers in its head, one off (wrong), when odd; after a tool turn it writes the sum it read back
    (right). Token log-probs are not reported (the trainer's own are used). Records every prompt it continues."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.continued = tokenizer, []

    def generate(self, prompt_ids, request):
        request = request.seeded(len(prompt_ids))
        out = []
        for i, seed in enumerate(request.seeds):
            prompt = list(prompt_ids[i // request.n])
            text = self.tokenizer.decode(prompt, skip_special_tokens=True)
            expression = text.split("=")[0]
            if TOOL_RESPONSE_CLOSE in text:
                self.continued.append(text)
                value = text.rsplit(TOOL_RESPONSE_OPEN, 1)[1].split(TOOL_RESPONSE_CLOSE)[0]
                turn = f"{expression}={value}</think><answer>{value}</answer>"
            elif seed % 2 == 0:
                turn = "<think>" + tool_call_text(expression)
            else:
                wrong = eval(expression) + 1  # noqa: S307 - the script's own two-operand sum
                turn = f"<think>{expression}={wrong}</think><answer>{wrong}</answer>"
            out.append(scripted_rollout(self.tokenizer, prompt, turn, request))
        return out

    def update_weights(self, model) -> None:
        pass


def test_a_grpo_step_with_tools_trains_on_the_models_tokens_and_logs_tool_metrics(tool_model, tmp_path,
                                                                                    monkeypatch):
    """The step's trajectories run the calculator (half of them: right, the other half wrong in the head), the tool
    answers reach the model's next turn, calc_accuracy scores the whole trajectory, and the row logs the tool use."""
    tokenizer = AutoTokenizer.from_pretrained(tool_model)
    sampler = CalcSampler(tokenizer)
    monkeypatch.setattr(loop_module, "make_sampler", lambda *args, **kwargs: (sampler, False))
    rows = make_calc_rows(8, seed=3)
    out = train_grpo(_config(max_steps=2, log_completions_steps=1), tool_model, rows, tmp_path / "grpo")
    metrics = read_metrics(tmp_path / "grpo")
    assert [m["step"] for m in metrics] == [1, 2] and out["step"] == 2
    for m in metrics:
        calls = m["tools/calculator/calls"]
        assert 0 < calls < 8 and m["tools/calls"] == calls and m["tools/errors"] == m["tools/malformed"] == 0
        assert m["tools/calls_mean"] == calls / 8 and m["tools/error_rate"] == 0.0
        assert m["tools/calculator/seconds"] >= 0.0 and m["tools/budget_cut_frac"] == 0.0
        assert m["tools/turns_mean"] == 1 + calls / 8 and m["tools/turns_max"] == 2.0
        assert m["rewards/calc_accuracy/mean"] == calls / 8 == m["completions/accuracy"]  # the calls, and only they
        assert m["completions/mean_model_length"] < m["completions/mean_length"]  # the tool turns are not the model's
        assert m["reward_std"] > 0 and torch.isfinite(torch.tensor(m["loss"]))
    assert len(sampler.continued) == sum(m["tools/calculator/calls"] for m in metrics)
    assert all(t.endswith(TOOL_RESPONSE_CLOSE) for t in sampler.continued)  # the tool turn, as the tiny template writes
    table = [json.loads(line) for line in (tmp_path / "grpo" / "completions.jsonl").read_text().splitlines()]
    called = [r for r in table if "<tool_call>" in r["completion"]]
    assert called and all(r["reward/calc_accuracy"] == 1.0 and TOOL_RESPONSE_OPEN in r["completion"] for r in called)


def test_a_grpo_step_with_tools_on_the_tiny_tool_model_itself(tool_model, tmp_path):
    """The transformers sampler on the untrained tool model: the step runs end to end and logs every tools/ key
    (its calls are whatever a random model writes; the counts are the step's own, reset every step)."""
    rows = make_calc_rows(8, seed=4)
    train_grpo(_config(max_steps=2, sampling={"max_completion_length": 24}), tool_model, rows, tmp_path / "grpo")
    metrics = read_metrics(tmp_path / "grpo")
    keys = {"tools/turns_mean", "tools/turns_max", "tools/calls_mean", "tools/error_rate", "tools/budget_cut_frac",
            "tools/max_turns_frac", "tools/seconds", "tools/calls", "tools/errors", "tools/malformed", "tools/unknown",
            "tools/calculator/calls", "tools/calculator/errors", "tools/calculator/timeouts",
            "tools/calculator/seconds", "completions/mean_model_length"}
    assert len(metrics) == 2 and all(keys <= set(m) for m in metrics)
    assert all(m["completions/max_length"] <= 24 and m["tools/turns_max"] <= 3 for m in metrics)


def test_without_tools_a_step_logs_no_tool_metrics(tool_model, tmp_path):
    config = _config(sampling={"tools": [], "max_turns": 4, "max_completion_length": 16})
    train_grpo(config, tool_model, make_calc_rows(8, seed=5), tmp_path / "grpo")
    [row] = read_metrics(tmp_path / "grpo")
    assert not [k for k in row if k.startswith("tools/")] and "completions/mean_model_length" not in row


def test_tool_metrics_merge_every_ranks_counts():
    a = TrajectoryStats(turns=[1, 2], tool_calls=[0, 1], tool_errors=[0, 1], budget_cut=[False, False],
                        max_turns_hit=[False, True], tool_seconds=0.5)
    b = TrajectoryStats(turns=[3], tool_calls=[2], tool_errors=[0], budget_cut=[True], max_turns_hit=[False],
                        tool_seconds=0.25)
    counts = {"tools/calls": 1.0, "tools/calculator/calls": 1.0, "tools/calculator/seconds": 0.5}
    merged = tool_metrics([(a, counts), (b, {**counts, "tools/calls": 2.0})])
    assert merged["tools/turns_mean"] == 2.0 and merged["tools/turns_max"] == 3.0 and merged["tools/calls_mean"] == 1.0
    assert merged["tools/error_rate"] == pytest.approx(1 / 3) and merged["tools/budget_cut_frac"] == pytest.approx(1 / 3)
    assert merged["tools/max_turns_frac"] == pytest.approx(1 / 3) and merged["tools/seconds"] == 0.75
    assert merged["tools/calls"] == 3.0 and merged["tools/calculator/calls"] == 2.0
    assert merged["tools/calculator/seconds"] == 1.0


def test_completion_lengths_count_the_tool_turns_and_the_model_length_does_not():
    plain = [Rollout([1], [5, 6, 7], None, False, "abc"), Rollout([1], [5], None, False, "a")]
    assert "completions/mean_model_length" not in completion_metrics(plain)
    multi = [Rollout([1], [5, 6, 7, 8], None, False, "x", tool_mask=[0, 1, 1, 0]),
             Rollout([1], [5, 6], None, False, "y", tool_mask=[0, 0])]
    m = completion_metrics(multi)
    assert m["completions/mean_length"] == 3.0 and m["completions/mean_model_length"] == 2.0


# --- SFT on traces with tool turns ---


def _encode_sft_row_before(tokenizer, row, max_length, completion_only_loss=True):
    """``encode_sft_row`` as it was before tool turns were masked (the reference a row without them must match)."""
    prompt_ids = encode_prompt(tokenizer, row["prompt"])
    completion_ids = tokenizer(row["completion"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    input_ids = (prompt_ids + completion_ids)[:max_length]
    prompt_labels = [IGNORE_INDEX] * len(prompt_ids) if completion_only_loss else list(prompt_ids)
    labels = (prompt_labels + completion_ids)[:max_length]
    return input_ids, labels


def test_sft_labels_are_minus_100_exactly_on_the_tool_turns():
    tokenizer = build_tiny_tokenizer(tool_tokens=True)
    rows = make_calc_cold_start(make_calc_rows(20, seed=1), tool_fraction=0.5, seed=1)
    with_tool = [r for r in rows if tool_response_spans(r["completion"])]
    assert len(with_tool) == 10
    for row in with_tool:
        for only in (True, False):
            ids, labels = encode_sft_row(tokenizer, row, 256, completion_only_loss=only)
            prompt_len = len(encode_prompt(tokenizer, row["prompt"]))
            masked = [i for i in range(prompt_len, len(ids)) if labels[i] == IGNORE_INDEX]
            (start, end), = tool_response_spans(row["completion"])
            tool_ids = tokenizer(row["completion"][start:end], add_special_tokens=False)["input_ids"]
            assert tokenizer.decode([ids[i] for i in masked]) == row["completion"][start:end]
            assert len(masked) == len(tool_ids) == masked[-1] - masked[0] + 1  # one run: the tool turn's tokens
            assert [ids[i] for i in masked] == tool_ids
            trained = [i for i in range(prompt_len, len(ids)) if labels[i] != IGNORE_INDEX]
            assert all(labels[i] == ids[i] for i in trained) and len(trained) + len(masked) == len(ids) - prompt_len
            assert ids == tokenizer(tokenizer.decode(ids[:prompt_len]) + row["completion"],
                                    add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            assert (labels[:prompt_len] == [IGNORE_INDEX] * prompt_len) == only
    ids, labels = encode_sft_row(tokenizer, with_tool[0], 40)  # truncation cuts ids and labels alike
    assert len(ids) == len(labels) == 40


def test_sft_masks_every_tool_turn_and_one_cut_open_at_the_end():
    tokenizer = build_tiny_tokenizer(tool_tokens=True)
    completion = "<think>a<tool_response>1</tool_response>b<tool_response>22</tool_response>c<tool_response>3"
    ids, labels = encode_sft_row(tokenizer, {"prompt": "p", "completion": completion}, 256)
    kept = tokenizer.decode([i for i, label in zip(ids, labels) if label != IGNORE_INDEX])
    assert kept == "<think>abc<eos>"  # the prompt p is not in the loss either


def test_a_row_without_tool_turns_encodes_as_before():
    chain = make_cold_start_rows(make_chain_rows(60, seed=2), direct_fraction=0.3, coarse_fraction=0.3, seed=2)
    general = make_general_cold_start(make_general_rows("helpful", 20, seed=2), preferred_fraction=0.5, seed=2)
    calc = make_calc_cold_start(make_calc_rows(20, seed=2), tool_fraction=0.0)
    plain = [{"prompt": "2+2=", "completion": "<think>2+2=4</think><answer>4</answer>"}, {"prompt": "x", "completion": ""}]
    rows = chain + general + calc + plain
    for tokenizer in (build_tiny_tokenizer(), build_tiny_tokenizer(tool_tokens=True)):
        for max_length, only in ((64, True), (64, False), (12, True)):
            for row in rows:
                assert encode_sft_row(tokenizer, row, max_length, only) == \
                    _encode_sft_row_before(tokenizer, row, max_length, only)


# --- prompts with the tools' schemas ---


def test_prompts_carry_the_tool_schemas_where_the_template_reads_them():
    tokenizer = build_tiny_tokenizer(tool_tokens=True)
    schemas = ToolSet.from_specs(["calculator"]).schemas()
    prompts = [[{"role": "user", "content": "1234+5678="}], "1234+5678="]
    assert encode_prompts(tokenizer, prompts, 16, tools=schemas).ids == encode_prompts(tokenizer, prompts, 16).ids
    tokenizer.chat_template = "{% for t in tools or [] %}{{ t['function']['name'] }};{% endfor %}" \
                              "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    text = tokenizer.decode(encode_prompt(tokenizer, prompts[0], tools=schemas))
    assert text == "calculator;1234+5678=" and tokenizer.decode(encode_prompt(tokenizer, prompts[0])) == "1234+5678="
    assert tokenizer.decode(encode_prompt(tokenizer, prompts[1], tools=schemas)) == "1234+5678="  # plain text: none


# --- configuration ---


@pytest.mark.parametrize("sampling, async_rollouts, expect", [
    ({"max_turns": 2}, False, r"sampling.max_turns \(2\) bounds the model turns of tool rollouts, but sampling.tools "
                              r"is empty"),
    ({"tools": ["calculator", "calculator"], "use_vllm": False}, False, r"names calculator more than once"),
    ({"tools": [" "], "use_vllm": False}, False, r"sampling.tools\[0\] is empty"),
    ({"tools": ["calculator"], "use_vllm": False, "max_turns": 0}, False, r"max_turns\n.*greater than or equal to 1"),
])
def test_tool_settings_that_cannot_run_are_refused(sampling, async_rollouts, expect):
    with pytest.raises(ValidationError, match=expect):
        GRPOConfig(sampling=sampling, async_rollouts=async_rollouts)


@pytest.mark.parametrize("sampling, async_rollouts", [({}, False), ({"use_vllm": True}, False),
                                                     ({"use_vllm": True, "vllm_mode": "server"}, False),
                                                     ({"use_vllm": False}, True), ({"use_vllm": True}, True)])
def test_tools_run_on_every_sampler(sampling, async_rollouts):
    """Trajectories are built over any backend's generate: vLLM colocated, a generation server and the asynchronous
    sampler process (the tools run there) are accepted."""
    config = GRPOConfig(sampling={**sampling, "tools": ["calculator"], "max_turns": 2}, async_rollouts=async_rollouts)
    assert config.sampling.tools == ["calculator"] and config.sampling.max_turns == 2


def test_tools_written_flat_move_into_sampling_and_the_default_has_none():
    config = GRPOConfig(tools=["calculator"], max_turns=2, use_vllm=False)  # TRL's flat layout
    assert config.sampling.tools == ["calculator"] and config.sampling.max_turns == 2
    assert GRPOConfig().sampling.tools == [] and GRPOConfig().sampling.max_turns == 4


def test_the_trainer_refuses_a_tool_that_does_not_load_before_any_model(tmp_path):
    config = _config(sampling={"tools": ["calculater"]})
    with pytest.raises(ValueError, match=r"sampling.tools\[0\]: tool 'calculater': not a built-in tool \(calculator, "
                                         r"python\)"):
        train_grpo(config, tmp_path / "no-such-model", make_calc_rows(8), tmp_path / "out")
    with pytest.raises(ValueError, match=r"sampling.tools\[0\]: tool 'no_such_pkg.tools:f': no module named"):
        train_grpo(_config(sampling={"tools": ["no_such_pkg.tools:f"]}), tmp_path / "m", make_calc_rows(8), tmp_path / "o")


def test_the_trainer_refuses_tools_with_a_tokenizer_that_splits_the_call_tag(tmp_path):
    plain = build_tiny_model(tmp_path / "plain", hidden_size=32, num_layers=2, num_heads=2)
    with pytest.raises(ValueError, match=r"'</tool_call>' as one token.*build_tiny_model\(\.\.\., tool_tokens=True\)"):
        train_grpo(_config(), plain, make_calc_rows(8), tmp_path / "out")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_a_pipeline_tool_that_does_not_load_names_its_yaml_line(tmp_path):
    path = _write(tmp_path, "grpo_train:\n  sampling:\n    use_vllm: false\n    tools:\n      - calculator\n"
                            "      - mypkg_missing.tools:lookup\n")
    with pytest.raises(ConfigError, match=r"config.yaml:6: grpo_train.sampling.tools.1: tool "
                                          r"'mypkg_missing.tools:lookup': no module named 'mypkg_missing'"):
        load_config(path)
    path = _write(tmp_path, "final_rl:\n  tools: [calculatr]\n  use_vllm: false\n")  # flat, as TRL writes it
    with pytest.raises(ConfigError, match=r"config.yaml:2: final_rl.sampling.tools.0: tool 'calculatr': not a "
                                          r"built-in tool"):
        load_config(path)


def test_the_shipped_tool_config_builds_a_tool_base_and_trains_on_calc_alone():
    config = load_config(ROOT / "configs" / "tiny-tools.yaml")
    assert config.model.tiny.architecture()["tool_tokens"] is True  # what prepare_data passes to build_tiny_model
    assert config.grpo_train.sampling.tools == config.final_rl.sampling.tools == ["calculator"]
    assert config.data.builtin_task is None and config.data.calc.pretrain_size > 0 and config.data.pretrain_size == 0
    assert load_config().model.tiny.tool_tokens is False  # the embedded default's base unchanged


def test_calc_alone_makes_the_pretraining_corpus_from_its_own_size():
    data = prepare_datasets(DataConfig(builtin_task=None, calc={"num_train": 20, "num_eval": 5, "digits": 3,
                                                                "cold_start_size": 10, "pretrain_size": 30}))
    assert len(data.pretrain) == 30 and {r["source"] for r in data.train} == {"calc"}
    base = {"model": {"tiny": {"pretrain": {"max_steps": 2}}}}
    with pytest.raises(ValidationError, match=r"model.tiny.pretrain needs a pretraining corpus.*data.calc.pretrain_size"):
        PipelineConfig.model_validate({**base, "data": {"builtin_task": None, "calc": {"num_train": 20}}})
    config = PipelineConfig.model_validate({**base, "data": {"builtin_task": None, "calc": {"pretrain_size": 30}},
                                            "evaluate": {"source_rewards": {"calc": "calc_accuracy"}}})
    assert config.data.calc.pretrain_size == 30


def test_a_share_of_the_pretraining_sums_call_the_calculator():
    calc = {"num_train": 20, "num_eval": 5, "digits": 3, "cold_start_size": 10, "pretrain_size": 40}
    plain = prepare_datasets(DataConfig(builtin_task=None, calc=calc))
    assert not any("<tool_call>" in r["completion"] for r in plain.pretrain)  # the default: worked in the head
    data = prepare_datasets(DataConfig(builtin_task=None, calc={**calc, "pretrain_tool_fraction": 0.25}))
    with_tool = [r for r in data.pretrain if "<tool_call>" in r["completion"]]
    assert len(with_tool) == 10 and [r["prompt"] for r in data.pretrain] == [r["prompt"] for r in plain.pretrain]
    assert all(TOOL_RESPONSE_OPEN in r["completion"] and TOOL_RESPONSE_CLOSE in r["completion"] for r in with_tool)
