"""Sampling with tools outside the trainer (evaluation, rejection sampling) and the tool-use rates evaluation reports.

With ``sampling.tools`` (``EvalSampling``, ``RejectionSampling``: ``grpo_core.config.ToolSampling``) a completion is a
multi-turn trajectory (``generation/trajectory.py``): the model's turns and the tool turns that answer its calls, at
most ``sampling.max_turns`` model turns sharing ``max_completion_length`` tokens, as GRPO's rollouts do
(``trainer/rollouts.py``), so a model is evaluated and filtered the way it was trained. ``ToolSampler`` carries what
``heldout._generate`` needs for that besides the backend; ``tool_use_metrics`` are the rates beside accuracy:

- ``tools/call_rate``: share of completions with at least one tool call answered;
- ``tools/calls_per_response``: tool calls answered per completion;
- ``tools/error_rate``: error turns (malformed call, unknown tool, bad arguments, the tool failed) per call; NaN
  where no completion called a tool.

A call is counted when the pipeline answered it (``TrajectoryStats``): a call written in the last allowed turn is
the model's own ending, not run, and not counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from grpo_core.config import ToolSampling
from grpo_core.generation import GenerationBackend, GenerationRequest, Rollout
from grpo_core.generation.trajectory import TrajectoryStats, generate_trajectories, tool_call_close_id
from grpo_core.tools import ToolSet

TOOL_USE_KEYS = ("tools/call_rate", "tools/calls_per_response", "tools/error_rate")


@dataclass
class ToolSampler:
    """Multi-turn generation with ``tools``: ``generate`` is a backend's ``generate`` whose completions are
    trajectories, their counts appended to the ``stats`` given (one entry per completion, in order)."""

    tools: ToolSet
    tokenizer: Any
    max_turns: int

    @classmethod
    def of(cls, sampling: ToolSampling, tokenizer: Any) -> "ToolSampler | None":
        """The tools of ``sampling.tools`` loaded (a spec that does not load fails naming its field, before any
        sampling); None without tools (single-turn sampling, as before)."""
        if not sampling.tools:
            return None
        tools = ToolSet.from_specs(sampling.tools, field="sampling.tools")
        tool_call_close_id(tokenizer)  # </tool_call> must be one token: a clear error here, not mid-evaluation
        return cls(tools, tokenizer, sampling.max_turns)

    def schemas(self) -> list[dict[str, Any]]:
        """The tools' function schemas, for the chat prompts (``encode_prompts(tools=...)``)."""
        return self.tools.schemas()

    def generate(self, backend: GenerationBackend, prompt_ids: list[list[int]], request: GenerationRequest,
                 stats: TrajectoryStats | None = None) -> list[Rollout]:
        """``len(prompt_ids) * request.n`` trajectories of ``request.max_tokens`` tokens in all (model and tool
        turns), each model turn at most as long."""
        return generate_trajectories(backend, self.tokenizer, prompt_ids, request, self.tools,
                                     max_turns=self.max_turns, max_total_tokens=request.max_tokens, stats=stats)


def tool_use_metrics(calls: list[int], errors: list[int]) -> dict[str, float]:
    """``tools/call_rate``, ``tools/calls_per_response`` and ``tools/error_rate`` (module docstring) of completions
    with ``calls[i]`` tool calls and ``errors[i]`` error turns each; NaN rates over no completion."""
    total = sum(calls)
    return {
        "tools/call_rate": sum(c > 0 for c in calls) / len(calls) if calls else math.nan,
        "tools/calls_per_response": total / len(calls) if calls else math.nan,
        "tools/error_rate": sum(errors) / total if total else math.nan,
    }
