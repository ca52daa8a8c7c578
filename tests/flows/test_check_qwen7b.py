"""``r1 check`` on configs/qwen2.5-7b-math.yaml with stand-ins (tests/standins.py): Qwen2.5-Math-7B's architecture
(untied embeddings, 4 key/value heads), MATH-lighteval and MATH-500 with answers to parse, the trace set, the
general and safety sources and the Skywork reward model."""

from __future__ import annotations

import pytest

from tests.flows.check_cases import assert_check_passes


@pytest.mark.extended
@pytest.mark.slow
def test_check_runs_the_7b_math_config_end_to_end(tmp_path):
    assert_check_passes("qwen2.5-7b-math.yaml", tmp_path, gpu=True)
