"""cold_start_sources in a YAML config: every kind parses, and an error names the entry's own line and field."""

from __future__ import annotations

import pytest

from grpo_core.config import DatasetSource, TeacherSource, TraceSource
from tasks.config.pipeline import ConfigError, load_config

GOOD = """\
data:
  cold_start_sources:
    - {path: traces.jsonl, field_map: {prompt: q, completion: c}}
    - kind: traces
      dataset: open-r1/OpenR1-Math-220k
      name: default
      readability: {max_paragraph_words: 300}
    - kind: teacher
      model: /models/teacher
      few_shot: [{prompt: "1+1=", completion: "<think>1+1=2</think><answer>2</answer>"}]
sft_consolidate:
  init_from: model
  init_model: /models/small
  general_sources: [{path: HuggingFaceH4/ultrachat_200k, split: train_sft, field_map: {messages: messages}}]
"""


def test_every_cold_start_kind_parses(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(GOOD)
    cfg = load_config(path)
    assert [type(s) for s in cfg.data.cold_start_sources] == [DatasetSource, TraceSource, TeacherSource]
    assert cfg.data.cold_start_sources[1].readability.max_paragraph_words == 300
    assert cfg.sft_consolidate.init_model == "/models/small" and cfg.sft_consolidate.reasoning_to_general == 3.0


@pytest.mark.parametrize("edit,expect", [
    (("      model: /models/teacher\n", "      model: /models/teacher\n      num_samples: 0\n"),
     r"c.yaml:10: data.cold_start_sources.2.sampling.num_generations: Input should be greater than or equal to 1"),
    (("    - kind: traces\n", "    - kind: tracez\n"), r"c.yaml:4: data.cold_start_sources.1: Input tag 'tracez'"),
    (("  init_model: /models/small\n", ""), r"init_from: model needs init_model"),
])
def test_errors_name_the_line_and_field(tmp_path, edit, expect):
    path = tmp_path / "c.yaml"
    path.write_text(GOOD.replace(*edit))
    with pytest.raises(ConfigError, match=expect):
        load_config(path)
