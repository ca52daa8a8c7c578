"""Trace set by name with a field mapping (issue 13, must show 2): a local file in open-r1/OpenR1-Math-220k's
schema loads, verified generations are converted to the cold-start layout, filtered, k kept per problem, and
a tiny model trains on them."""

from __future__ import annotations

import json

import pytest
import torch

from grpo_core.config import DataConfig, ReadabilityConfig, SFTConfig, TraceSource
from grpo_core.data.rows import DataError
from grpo_core.models.tiny import build_tiny_model
from grpo_core.recipe.cold_start import load_trace_rows, to_cold_start_completion
from grpo_core.recipe.prepare import prepare_datasets
from grpo_core.trainer.sft import train_sft
from trace_fixtures import write_openr1

torch.set_num_threads(1)


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_openr1_file_keeps_verified_readable_traces(tmp_path, suffix):
    path = write_openr1(tmp_path / f"openr1.{suffix}", num_problems=8)
    rows, stats = load_trace_rows(TraceSource(dataset=str(path), keep_per_prompt=1))
    # 8 problems cycle through 4 patterns (trace_fixtures.PATTERNS), twice each
    assert stats["problems"] == 8 and stats["samples"] == 2 * (2 + 3 + 3 + 2)
    assert stats["kept"] == len(rows) == 2 * 3  # patterns 0, 1 and 3 keep one each; pattern 2 none
    assert stats["unverified"] == 2 * 2  # WRONG and the unverified truncated one
    assert stats["rejected/code_block"] == 2 and stats["rejected/truncated"] == 2
    assert stats["rejected/mixed_language"] == 2
    assert stats["over_limit"] == 2 and stats["duplicate"] == 2
    assert stats["samples"] == stats["kept"] + stats["unverified"] + stats["duplicate"] + stats["over_limit"] + sum(
        v for k, v in stats.items() if k.startswith("rejected/"))
    first = rows[0]
    assert first["prompt"] == [{"role": "user", "content": "What is 10 + 20?"}]
    assert first["completion"].startswith("<think>\nWe add 10 and 20.") and first["completion"].endswith("$\\boxed{30}$.")
    assert "\n</think>\n\nThe sum is" in first["completion"]
    assert all("```" not in r["completion"] and "我" not in r["completion"] for r in rows)


def test_keep_per_prompt_and_limit_and_field_map(tmp_path):
    path = write_openr1(tmp_path / "openr1.jsonl", num_problems=4)
    src = TraceSource(dataset=str(path), keep_per_prompt=2, limit=2, prompt_template="{prompt}\nPut the answer in \\boxed{{}}.",
                      field_map={"prompt": "problem", "generations": "generations", "correct": "correctness_math_verify"})
    rows, stats = load_trace_rows(src)
    assert stats["problems"] == 2 and stats["kept"] == 3 and stats["over_limit"] == 0  # problem 1 keeps CLEAN and SECOND
    assert rows[0]["prompt"][0]["content"].endswith("Put the answer in \\boxed{}.")
    # without a verdict column every generation counts as verified: WRONG is kept too
    unverified, _ = load_trace_rows(src.model_copy(update={"field_map": {"prompt": "problem", "generations": "generations"}}))
    assert len(unverified) == 4


def test_a_row_without_generations_names_the_row_and_column(tmp_path):
    path = write_openr1(tmp_path / "openr1.jsonl", num_problems=3)
    lines = path.read_text().splitlines()
    bad = json.loads(lines[1])
    bad["generations"] = []
    path.write_text("\n".join([lines[0], json.dumps(bad), lines[2]]) + "\n")
    with pytest.raises(DataError, match=r"openr1.jsonl line 2: field 'generations' \(column 'generations'\)"):
        load_trace_rows(TraceSource(dataset=str(path)))
    rows, stats = load_trace_rows(TraceSource(dataset=str(path)), on_error="skip")
    assert stats["rows_skipped"] == 1 and stats["problems"] == 3


def test_a_hub_style_dataset_folder_loads_by_name(tmp_path):
    """A name goes to ``datasets.load_dataset`` (the hub path); a local folder in the hub layout stands in."""
    folder = tmp_path / "OpenR1-Math-220k"
    write_openr1(folder / "data" / "train-00000-of-00001.parquet", num_problems=4)
    rows, stats = load_trace_rows(TraceSource(dataset=str(folder), split="train"))
    assert stats["problems"] == 4 and stats["kept"] == 3 == len(rows)


def test_conversion_to_the_cold_start_layout():
    assert to_cold_start_completion("<think>\n  a\nb \n</think>\n\nSo $\\boxed{1}$.") == "<think>\na\nb\n</think>\n\nSo $\\boxed{1}$."
    assert to_cold_start_completion("no think here") == "no think here"


def test_prepare_data_reads_a_trace_set_and_sft_trains_on_it(tmp_path):
    path = write_openr1(tmp_path / "openr1.jsonl", num_problems=16)
    config = DataConfig(num_train=40, num_eval=10, cold_start_size=0, decontaminate=False,
                        cold_start_sources=[{"kind": "traces", "dataset": str(path), "keep_per_prompt": 1,
                                             "readability": {"max_paragraph_chars": 500}}])
    data = prepare_datasets(config)
    stats = data.stats["sources"][f"cold_start:traces:{path}"]
    assert len(data.cold_start) == stats["kept"] == 12 and stats["rejected/code_block"] == 4
    model = build_tiny_model(tmp_path / "tiny", hidden_size=64, num_layers=2, num_heads=2, max_position_embeddings=512)
    cfg = SFTConfig(learning_rate=3e-3, max_steps=12, per_device_train_batch_size=4, save_steps=1000,
                    report_to=["jsonl"], lr_scheduler_type="constant", max_length=256)
    out = train_sft(cfg, model, data.cold_start, tmp_path / "sft")
    log = [json.loads(x) for x in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert out["train/steps"] == 12 and log[-1]["train/loss"] < 0.7 * log[0]["train/loss"]


def test_readability_can_be_relaxed_per_source(tmp_path):
    path = write_openr1(tmp_path / "openr1.jsonl", num_problems=4)
    lax = ReadabilityConfig(drop_code_blocks=False, max_other_script_share=None)
    rows, stats = load_trace_rows(TraceSource(dataset=str(path), keep_per_prompt=1, readability=lax))
    assert stats["rejected/code_block"] == 0 and stats["kept"] == 4  # pattern 1 keeps CODE, pattern 2 keeps MIXED
