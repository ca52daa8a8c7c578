"""The tools a config's sections sample with (``sampling.tools``: the RL stages' rollouts, rejection_sample's samples,
evaluate's completions), checked when the config is loaded (``parse_config``): each spec must load
(``grpo_core.tools.tool_spec_problem``: a built-in name, or an import path ``package.module:function`` that imports
here), so a typo fails ``r1 run`` at its YAML line, not in grpo_train after the stages before it committed. A
built-in tool is checked by name: ``python``'s sandbox check runs where the rollouts run. The trainer, evaluation and
rejection sampling load the tools again before they sample (``grpo_core.trainer.loop.load_rollout_tools``,
``grpo_core.evaluation.tool_use.ToolSampler``).
"""

from __future__ import annotations

from typing import Any

from grpo_core.tools import tool_spec_problem
from tasks.config.stages import entries


def tool_problems(config: Any) -> list[tuple[tuple, str]]:
    """``(field location, message)`` for each ``sampling.tools`` entry of a section that cannot be loaded."""
    problems = []
    for stage in entries():
        tools = getattr(getattr(stage.section_of(config), "sampling", None), "tools", None) or []
        problems += [((stage.config_key, "sampling", "tools", i), problem)
                     for i, spec in enumerate(tools) if (problem := tool_spec_problem(spec))]
    return problems
