"""Multi-turn rollouts with tool calls: the model writes ``<tool_call>{json}</tool_call>``, the pipeline runs the call
(``tools.respond``), appends the result as a tool turn, and the model continues from everything so far.

``generate_trajectories`` returns one ``Rollout`` per completion, as a backend's ``generate`` does: ``prompt_ids`` the
original prompt; ``completion_ids`` the model's tokens and the tool turns' tokens in order; ``tool_mask`` 1 on the
tool turns' tokens; ``logprobs`` the sampler's own on the model's tokens and 0.0 on tool tokens (None when the
backend gave none); ``text`` the whole completion (``trajectory_text``): the model's turns decoded as the backends
decode, without a final EOS, the tool turns verbatim, special tokens included. ``</tool_call>`` must be one token of
the tokenizer: it is a stop token of every model turn (``GenerationRequest.stop_token_ids``), kept in the completion.

A trajectory ends when the model ends its turn without a tool call (EOS), when a turn asks for a tool but
``max_turns`` model turns are used (not truncated: the unanswered call is the model's own ending, scored as such),
when ``tools.respond`` finds no call in the turn, or when the token budget (``max_total_tokens`` completion tokens,
model's and tool's; default ``request.max_tokens * max_turns``) runs out: the trajectory is cut at the budget and
marked truncated, as is a model turn that reaches ``request.max_tokens``. A tool error (``ToolResult.error``) is a
tool turn like any other: the model reads the error and continues.

Seeds: the first turn is one batched ``generate`` of ``n`` completions per prompt with the request's seeds; each
later turn is one batched call over every trajectory that continues, one row each (n = 1), seeded with
``derive_seed(completion seed, turn)``. A row's tokens depend on its prefix and its seed only, so a trajectory does
not depend on how the prompts were batched. A turn's call asks for the most tokens any of its rows may still take
and cuts each row to its own budget afterwards: the backends' rows do not depend on ``max_tokens`` (HFBackend draws a
row's uniforms in order from its own generator, vLLM seeds each request's own generator).

The tool turn's text (``tool_turn_format``): where the tokenizer's chat template knows a tool role, what the template
itself renders between an assistant turn and the next generation prompt, around the result; for Qwen2.5 that is
``<|im_end|>\\n<|im_start|>user\\n<tool_response>\\n{result}\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n``.
Otherwise (the default tiny template, a template that refuses the probe) ``<tool_response>{result}</tool_response>``.
Read off the template, not a table per model family, so a model's own tool format is the one it trains on. The
text is tokenized on its own and appended in token space, so the trainer scores exactly the tokens the sampler
conditioned on.

Departures: DeepSeek-R1 has no tools. As the tool-use RL recipes do (Search-R1, Jin et al. 2025, "retrieved token
masking"; ReTool, Feng et al. 2025), tool tokens stay in the sequence the model attends to but are masked out of
the loss (``build_train_batch``'s ``loss_mask``), so |o_i|, the KL and the sampler correction count the model's
tokens only.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any, Protocol

from grpo_core.generation.base import GenerationBackend, GenerationRequest, Rollout
from grpo_core.seeds import derive_seed
from grpo_core.tools import TOOL_CALL_CLOSE, TOOL_RESPONSE_CLOSE, TOOL_RESPONSE_OPEN, ToolResult

_SENTINEL, _PROBE = "@@grpo_core:assistant@@", "@@grpo_core:tool result@@"


class Responder(Protocol):
    """Answers the last ``<tool_call>`` in a model turn's text: ``grpo_core.tools.ToolSet`` (or any object with its
    ``respond``). None: no call in the text; never raises (a malformed call, an unknown tool, a timeout come back as
    an error result)."""

    def respond(self, text: str) -> ToolResult | None: ...


@dataclass
class TrajectoryStats:
    """Per-trajectory counts of one or more ``generate_trajectories`` calls (pass one in; each call appends)."""

    turns: list[int] = field(default_factory=list)  # model turns
    tool_calls: list[int] = field(default_factory=list)
    tool_errors: list[int] = field(default_factory=list)
    budget_cut: list[bool] = field(default_factory=list)  # cut by the token budget
    max_turns_hit: list[bool] = field(default_factory=list)  # asked for a tool with no model turn left
    tool_seconds: float = 0.0

    def merge(self, other: "TrajectoryStats") -> None:
        """Add ``other``'s trajectories (counts made elsewhere: the asynchronous sampler's process)."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def metrics(self) -> dict[str, float]:
        """Means over trajectories (``tools/error_rate``: errors per call), for the trainer's log."""
        num, calls = max(1, len(self.turns)), sum(self.tool_calls)
        return {
            "tools/turns_mean": sum(self.turns) / num,
            "tools/turns_max": float(max(self.turns, default=0)),
            "tools/calls_mean": calls / num,
            "tools/error_rate": sum(self.tool_errors) / calls if calls else 0.0,
            "tools/budget_cut_frac": sum(self.budget_cut) / num,
            "tools/max_turns_frac": sum(self.max_turns_hit) / num,
            "tools/seconds": self.tool_seconds,
        }


def trajectory_counts(stats: TrajectoryStats, tools: Any) -> dict[str, Any]:
    """The counts of trajectories built in one process, JSON-able (sent from the asynchronous sampler's process and
    kept in a checkpoint with its rollouts): ``stats``' fields and ``tools.stats()`` (a ``ToolSet``)."""
    return {"trajectories": dataclasses.asdict(stats), "tools": tools.stats()}


def add_trajectory_counts(counts: dict[str, Any], stats: TrajectoryStats | None, tools: Any) -> None:
    """Add ``trajectory_counts`` made elsewhere to this process's ``stats`` and ``tools`` (a ``ToolSet``)."""
    if stats is not None:
        stats.merge(TrajectoryStats(**counts["trajectories"]))
    tools.add_stats(counts["tools"])


@dataclass
class _Trajectory:
    """One completion being built turn by turn."""

    prompt: list[int]
    seed: int
    ids: list[int] = field(default_factory=list)
    logps: list[float] | None = field(default_factory=list)
    tool_mask: list[int] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    truncated: bool = False
    ends_on_eos: bool = False
    max_turns_hit: bool = False
    done: bool = False

    def add(self, ids: list[int], logps: list[float] | None, tool: bool, budget: int) -> None:
        """Append a turn's tokens; past ``budget`` the trajectory is cut there, truncated and done."""
        room = budget - len(self.ids)
        if len(ids) > room:
            ids, logps = ids[:room], logps[:room] if logps is not None else None
            self.truncated = self.done = True
        self.ids += ids
        self.tool_mask += [int(tool)] * len(ids)
        if self.logps is None:  # a model turn came without log-probs: None for good
            return
        if tool:
            self.logps += [0.0] * len(ids)
        elif logps is None:
            self.logps = None
        else:
            self.logps += logps


def tool_call_close_id(tokenizer: Any) -> int:
    """The id of ``</tool_call>``, which must be one token (it stops a model turn as EOS does)."""
    ids = tokenizer(TOOL_CALL_CLOSE, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(
            f"multi-turn tool rollouts need {TOOL_CALL_CLOSE!r} as one token of the tokenizer (it ends a model turn "
            f"as EOS does), but this tokenizer splits it into {len(ids)} tokens {ids}. Use a tokenizer that has it "
            "(Qwen2.5's; the tiny model built with build_tiny_model(..., tool_tokens=True)), or add it: "
            "tokenizer.add_tokens(['<tool_call>', '</tool_call>', '<tool_response>', '</tool_response>']) then "
            "model.resize_token_embeddings(len(tokenizer)) before training")
    return int(ids[0])


def tool_turn_format(tokenizer: Any) -> tuple[str, str]:
    """``(before, after)``: a tool turn's text is ``before + result + after``.

    Where the chat template names a tool role: render [user, assistant SENTINEL, tool PROBE] with the generation
    prompt and take what the template writes after SENTINEL, around PROBE (the user message first because some
    templates, Qwen3's, refuse a conversation without one). Otherwise, or when the render fails or does not hold the
    result exactly once: ``<tool_response>`` and ``</tool_response>`` around it."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and ("'tool'" in template or '"tool"' in template):
        messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _SENTINEL},
                    {"role": "tool", "content": _PROBE}]
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception:  # noqa: BLE001 - a template that refuses the conversation (jinja's raise_exception)
            text = ""
        turn = text.partition(_SENTINEL)[2] if isinstance(text, str) else ""
        if turn.count(_PROBE) == 1 and _SENTINEL not in turn:
            before, _, after = turn.partition(_PROBE)
            return before, after
    return TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE


def trajectory_text(t: _Trajectory, tokenizer: Any) -> str:
    """The completion's text, turn by turn: a model turn decoded as the backends decode (special tokens skipped, the
    final EOS left out), a tool turn verbatim (special tokens kept: the ``<|im_end|>`` / ``<|im_start|>user`` Qwen2.5's
    template wraps a result in stay in the text), so tokenizing the text again turn by turn (SFT on a kept trajectory,
    ``trainer.sft.encode_completion``) gives back the tokens the model was sampled on."""
    ids = t.ids[:-1] if t.ends_on_eos else t.ids
    turns = itertools.groupby(zip(ids, t.tool_mask), key=lambda pair: pair[1])  # turns alternate: a run is a turn
    return "".join(tokenizer.decode([i for i, _ in turn], skip_special_tokens=not tool) for tool, turn in turns)


def generate_trajectories(
    backend: GenerationBackend,
    tokenizer: Any,
    prompt_ids: list[list[int]],
    request: GenerationRequest,
    tools: Responder,
    *,
    max_turns: int,
    max_total_tokens: int | None = None,
    stats: TrajectoryStats | None = None,
) -> list[Rollout]:
    """``len(prompt_ids) * request.n`` multi-turn rollouts (the n of a prompt contiguous), at most ``max_turns``
    model turns of at most ``request.max_tokens`` tokens each and ``max_total_tokens`` completion tokens in all;
    ``stats``: per-trajectory counts appended (``TrajectoryStats``)."""
    if max_turns < 1:
        raise ValueError(f"max_turns={max_turns}: a trajectory needs at least one model turn")
    budget = request.max_tokens * max_turns if max_total_tokens is None else max_total_tokens
    if budget < 1:
        raise ValueError(f"max_total_tokens={max_total_tokens}: the budget must allow at least one token")
    close = tool_call_close_id(tokenizer)
    before, after = tool_turn_format(tokenizer)
    request = request.seeded(len(prompt_ids))
    stops = request.stop_token_ids + ((close,) if close not in request.stop_token_ids else ())
    turn_request = dataclasses.replace(request, stop_token_ids=stops, max_tokens=min(request.max_tokens, budget))
    trajectories = [_Trajectory(list(prompt_ids[i // request.n]), seed) for i, seed in enumerate(request.seeds)]
    live = list(range(len(trajectories)))  # the trajectories this turn's call generates, in row order
    outputs = backend.generate(prompt_ids, turn_request)
    for turn in range(1, max_turns + 1):
        continuing = []
        for i, out in zip(live, outputs):
            t = trajectories[i]
            t.turns += 1
            t.add(out.completion_ids, out.logprobs, tool=False, budget=budget)
            if t.done:
                continue
            last = out.completion_ids[-1] if out.completion_ids else None
            if out.truncated or last != close:
                t.truncated, t.done = out.truncated, True
                t.ends_on_eos = not out.truncated and last is not None and last not in stops
                continue
            if turn == max_turns:
                t.max_turns_hit = t.done = True
                continue
            result = tools.respond(out.text)
            if result is None:  # the turn stopped on </tool_call> without a call in it: the model's own ending
                t.done = True
                continue
            t.tool_calls += 1
            t.tool_errors += int(result.error)
            if stats is not None:
                stats.tool_seconds += float(result.seconds)
            tool_ids = tokenizer(before + result.content + after, add_special_tokens=False)["input_ids"]
            t.add(list(tool_ids), None, tool=True, budget=budget)
            if len(t.ids) >= budget:  # no room left for the model to answer
                t.truncated = t.done = True
            if not t.done:
                continuing.append(i)
        if not continuing:
            break
        live = continuing
        turn_request = dataclasses.replace(
            turn_request, n=1, max_tokens=min(request.max_tokens, max(budget - len(trajectories[i].ids) for i in live)),
            seeds=[derive_seed(trajectories[i].seed, turn) for i in live],
        )
        outputs = backend.generate([trajectories[i].prompt + trajectories[i].ids for i in live], turn_request)
    rollouts = []
    for t in trajectories:
        rollouts.append(Rollout(t.prompt, t.ids, t.logps, t.truncated, trajectory_text(t, tokenizer),
                                tool_mask=t.tool_mask))
        if stats is not None:
            stats.turns.append(t.turns)
            stats.tool_calls.append(t.tool_calls)
            stats.tool_errors.append(t.tool_errors)
            stats.budget_cut.append(t.truncated and len(t.ids) >= budget)
            stats.max_turns_hit.append(t.max_turns_hit)
    return rollouts
