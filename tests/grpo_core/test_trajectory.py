"""Multi-turn tool rollouts (``grpo_core/generation/trajectory.py``) and what carries them: stop tokens in the
backends, the tiny tokenizer's tool tokens, the rollouts' ``tool_mask`` through the server and the async state, and
the loss masking of tool-turn tokens (``build_train_batch``'s ``loss_mask`` and ``sampled_mask``)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_core.config import GRPOConfig
from grpo_core.generation.base import GenerationRequest, Rollout
from grpo_core.generation.hf import HFBackend
from grpo_core.generation.serve import GenerateRequest
from grpo_core.generation.trajectory import (TrajectoryStats, generate_trajectories, tool_call_close_id,
                                             tool_turn_format)
from grpo_core.models.tiny import (CHAT_TEMPLATE, REASONING_TAGS, SPECIAL_TOKENS, TOOL_CHAT_TEMPLATE, TOOL_TAGS,
                                   build_tiny_model, build_tiny_tokenizer)
from grpo_core.seeds import derive_seed
from grpo_core.tools import (TOOL_CALL_CLOSE, TOOL_CALL_OPEN, TOOL_RESPONSE_CLOSE, TOOL_RESPONSE_OPEN, ToolResult,
                             ToolSet)
from grpo_core.trainer.distributed import DistContext
from grpo_core.trainer.loss import compute_policy_loss
from grpo_core.trainer.optim import build_optimizer
from grpo_core.trainer.update import build_train_batch, compute_batch_logps, optimise

torch.set_num_threads(1)
CPU = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=32, num_layers=2, num_heads=2,
                            tool_tokens=True)
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.fixture
def calls_tools(tiny):
    """The tiny model with ``</tool_call>`` favoured (a logit bias on the LM head, so the trainer's forward sees it
    too): most completions call a tool within a few tokens."""
    model, tokenizer = tiny
    bias = torch.zeros(model.config.vocab_size)
    bias[tokenizer.convert_tokens_to_ids(TOOL_CALL_CLOSE)] = 5.0
    handle = model.lm_head.register_forward_hook(lambda module, inputs, out: out + bias)
    yield model, tokenizer
    handle.remove()


class Answers:
    """A stand-in ``ToolSet``: every turn that ends on ``</tool_call>`` is a call answered ``content`` (or an error);
    ``None`` for a turn whose text contains ``silent``; records the texts it was given."""

    def __init__(self, content: str = "ok", error: bool = False, silent: str | None = None) -> None:
        self.content, self.error, self.silent, self.texts = content, error, silent, []

    def respond(self, text: str) -> ToolResult | None:
        self.texts.append(text)
        if self.silent is not None and self.silent in text:
            return None
        return ToolResult(self.content, self.error, "stand_in", 0.25)


class ScriptedBackend:
    """Model turn k of a trajectory (k = the tool turns already in its prompt) emits ``turns[k]``, stopping at the
    first EOS or stop token or at ``max_tokens``; a token's log-prob is -(k + 1) / 10. Records every call."""

    def __init__(self, tokenizer, turns: list[list[int]], logprobs: bool = True) -> None:
        self.tokenizer, self.turns, self.logprobs = tokenizer, turns, logprobs
        self.response_close = tokenizer.convert_tokens_to_ids(TOOL_RESPONSE_CLOSE)
        self.calls: list[tuple[list[list[int]], GenerationRequest]] = []

    def generate(self, prompt_ids, request):
        request = request.seeded(len(prompt_ids))
        self.calls.append(([list(p) for p in prompt_ids], request))
        eos, out = self.tokenizer.eos_token_id, []
        for i in range(len(prompt_ids) * request.n):
            prompt = list(prompt_ids[i // request.n])
            k = prompt.count(self.response_close)
            ids: list[int] = []
            for tok in self.turns[min(k, len(self.turns) - 1)]:
                ids.append(tok)
                if tok == eos or tok in request.stop_token_ids or len(ids) == request.max_tokens:
                    break
            stopped = ids[-1] == eos or ids[-1] in request.stop_token_ids
            text = self.tokenizer.decode(ids[:-1] if ids[-1] == eos else ids, skip_special_tokens=True)
            logps = [-(k + 1) / 10] * len(ids) if self.logprobs else None
            out.append(Rollout(prompt, ids, logps, truncated=not stopped, text=text))
        return out


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _prompts(tokenizer) -> list[list[int]]:
    return [[tokenizer.bos_token_id] + _ids(tokenizer, t) for t in ("7+8*3-5=", "2+2=", "9*9-1+4=")]


# --- the tiny tokenizer's tool tokens and template ---


def test_default_tiny_tokenizer_unchanged_tool_tokens_appended_after_it():
    default, tools = build_tiny_tokenizer(), build_tiny_tokenizer(tool_tokens=True)
    assert len(default) == 264 and len(tools) == 268
    assert default.chat_template == CHAT_TEMPLATE and tools.chat_template == TOOL_CHAT_TEMPLATE
    vocab = default.get_vocab()
    assert [vocab[t] for t in SPECIAL_TOKENS] == [0, 1, 2, 3] and [vocab[t] for t in REASONING_TAGS] == [260, 261, 262, 263]
    assert {k: v for k, v in tools.get_vocab().items() if k not in TOOL_TAGS} == vocab  # every default id kept
    assert tools.convert_tokens_to_ids(TOOL_TAGS) == [264, 265, 266, 267]
    assert TOOL_TAGS == [TOOL_CALL_OPEN, TOOL_CALL_CLOSE, TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE]  # grpo_core.tools'
    text = '2+3=<tool_call>{"name": "calculator"}</tool_call><tool_response>5</tool_response><answer>5</answer>'
    ids = _ids(tools, text)
    assert all(tools.convert_tokens_to_ids(t) in ids for t in TOOL_TAGS)
    assert tools.decode(ids, skip_special_tokens=True) == text  # the tags are added tokens, not special ones
    assert len(_ids(default, TOOL_CALL_CLOSE)) == len(TOOL_CALL_CLOSE)  # the default tokenizer spells it in bytes


def test_tool_template_renders_user_assistant_as_before_and_tool_turns_inline():
    default, tools = build_tiny_tokenizer(), build_tiny_tokenizer(tool_tokens=True)
    conversations = [
        [{"role": "user", "content": "7+8*3-5="}],
        [{"role": "user", "content": "7+8*3-5="}, {"role": "assistant", "content": "<think></think><answer>40</answer>"}],
        [{"role": "system", "content": "Solve."}, {"role": "user", "content": "1+1="},
         {"role": "assistant", "content": "2"}, {"role": "user", "content": "2+2="}],
    ]
    for messages in conversations:
        for prompt in (True, False):
            old = default.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
            assert tools.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt) == old
    assert default.apply_chat_template(conversations[1], tokenize=False) == \
        "<bos>7+8*3-5=<think></think><answer>40</answer><eos>"  # CHAT_TEMPLATE's output as test_tiny pins it
    messages = [{"role": "user", "content": "2+3="}, {"role": "assistant", "content": "<tool_call>c</tool_call>"},
                {"role": "tool", "content": "5"}, {"role": "assistant", "content": "<answer>5</answer>"}]
    assert tools.apply_chat_template(messages, tokenize=False) == \
        "<bos>2+3=<tool_call>c</tool_call><tool_response>5</tool_response><answer>5</answer><eos>"
    assert tools.apply_chat_template(messages[:3], tokenize=False, add_generation_prompt=True) == \
        "<bos>2+3=<tool_call>c</tool_call><tool_response>5</tool_response>"


def test_tiny_model_with_tool_tokens_has_their_embeddings(tiny):
    model, tokenizer = tiny
    assert model.config.vocab_size == len(tokenizer) == 268
    assert tool_call_close_id(tokenizer) == 265


# Qwen2.5-Instruct's chat template, its tools header and tool_calls branch left out.
QWEN25 = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or (message.role == \"assistant\") %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == \"tool\" %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_tool_turn_format_follows_the_chat_template():
    tokenizer = build_tiny_tokenizer(tool_tokens=True)
    assert tool_turn_format(tokenizer) == (TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE)  # rendered by TOOL_CHAT_TEMPLATE
    assert tool_turn_format(build_tiny_tokenizer()) == (TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE)  # no tool role
    tokenizer.chat_template = QWEN25
    assert tool_turn_format(tokenizer) == ("<|im_end|>\n<|im_start|>user\n<tool_response>\n",
                                           "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    tokenizer.chat_template = "{{ raise_exception('no tool role') }} {% if message['role'] == 'tool' %}{% endif %}"
    assert tool_turn_format(tokenizer) == (TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE)  # a template that refuses


def test_a_tokenizer_without_a_single_tool_call_token_is_refused():
    with pytest.raises(ValueError, match=r"'</tool_call>' as one token.*tool_tokens=True"):
        generate_trajectories(None, build_tiny_tokenizer(), [[1]], GenerationRequest(n=1, max_tokens=4), Answers(),
                              max_turns=2)


# --- the request and rollout fields, through the server and the async state ---


def test_stop_token_ids_round_trip_through_the_servers_json():
    request = GenerationRequest(n=2, max_tokens=5, seeds=[1, 2], stop_token_ids=(265, 7))
    body = json.loads(json.dumps({"prompt_ids": [[1, 2]], **request.to_dict()}))
    assert body["stop_token_ids"] == [265, 7]
    parsed = GenerateRequest(**body)
    assert GenerationRequest(**parsed.model_dump(exclude={"prompt_ids"})) == request
    assert GenerationRequest(**GenerateRequest(prompt_ids=[[1]]).model_dump(exclude={"prompt_ids"})).stop_token_ids == ()
    assert GenerationRequest(n=1, max_tokens=1).to_dict()["stop_token_ids"] == []


def test_generation_server_carries_stop_token_ids_and_tool_mask():
    from grpo_core.generation.server_client import ServerBackend
    from tests.grpo_core.test_vllm_server import FakeEngine, Served

    class Engine(FakeEngine):
        def generate(self, prompt_ids, request):
            self.request = request
            return [Rollout(list(p), [5, 265], [-0.5, -0.25], False, "x", tool_mask=[0, 1] if i else None)
                    for i, p in enumerate(prompt_ids)]

    engine = Engine()
    served = Served(engine)
    try:
        client = ServerBackend(served.url, timeout=30)
        out = client.generate([[1], [2]], GenerationRequest(n=1, max_tokens=3, seeds=[4, 5], stop_token_ids=(265,)))
        client.close()
    finally:
        served.stop()
    assert engine.request.stop_token_ids == (265,)
    assert [r.tool_mask for r in out] == [None, [0, 1]]


def test_async_state_keeps_tool_mask_and_reads_older_states():
    from grpo_core.trainer.async_rollouts import groups_from_state, groups_to_state
    from grpo_core.trainer.rollouts import ScoredGroups

    class Rows:  # the part of a Mixture groups_from_state reads
        def __init__(self) -> None:
            self.rows = [{"prompt": "p"}]

        def rows_at(self, position, count):
            return [0] * count

    rollouts = [Rollout([1], [5, 6, 7], [-0.1, 0.0, -0.2], False, "t", [-0.3, -0.1, -0.2], [0, 1, 0]),
                Rollout([1], [5], [-0.1], True, "u")]
    groups = ScoredGroups([0], [{"prompt": "p"}], rollouts, torch.tensor([[1.0], [0.0]]), [False])
    state = json.loads(json.dumps(groups_to_state(groups)))
    back = groups_from_state(state, Rows())
    assert back.rollouts == rollouts
    for saved in state["rollouts"]:  # states saved before tool_mask (6 fields) and before ref_logprobs (5)
        del saved[-1]
    assert [r.tool_mask for r in groups_from_state(state, Rows()).rollouts] == [None, None]
    for saved in state["rollouts"]:
        del saved[-1]
    assert [r.ref_logprobs for r in groups_from_state(state, Rows()).rollouts] == [None, None]


# --- (c) stop tokens in HFBackend ---


def test_hf_stop_token_ends_a_row_kept_in_ids_and_text_not_truncated(calls_tools):
    model, tokenizer = calls_tools
    close, eos = tokenizer.convert_tokens_to_ids(TOOL_CALL_CLOSE), tokenizer.eos_token_id
    backend = HFBackend(model, tokenizer)
    prompts, seeds = _prompts(tokenizer), list(range(12))
    request = GenerationRequest(n=4, max_tokens=12, seeds=seeds, stop_token_ids=(close,))
    out = backend.generate(prompts, request)
    ended = [r for r in out if r.completion_ids[-1] == close]
    assert len(ended) >= 6  # the bias makes most rows call
    for r in out:
        assert close not in r.completion_ids[:-1]  # nothing after the stop token
        if r.completion_ids[-1] in (close, eos):
            assert not r.truncated
        else:
            assert r.truncated and len(r.completion_ids) == 12
        assert r.text == tokenizer.decode([t for t in r.completion_ids if t != eos], skip_special_tokens=True)
    assert all(r.text.endswith(TOOL_CALL_CLOSE) for r in ended)
    # without the stop token the same rows run on past it: the same tokens up to there (seeded as before)
    free = backend.generate(prompts, GenerationRequest(n=4, max_tokens=12, seeds=seeds))
    for r, f in zip(out, free):
        assert f.completion_ids[: len(r.completion_ids)] == r.completion_ids
    assert any(len(f.completion_ids) > len(r.completion_ids) for r, f in zip(out, free) if r in ended)


# --- the trajectory loop on a scripted backend: turns, budget, errors ---


def test_turns_tool_turns_seeds_and_masks(tiny):
    _, tokenizer = tiny
    close, eos = tool_call_close_id(tokenizer), tokenizer.eos_token_id
    a, b, c = _ids(tokenizer, "abc")
    backend = ScriptedBackend(tokenizer, [[a, close], [b, b, close], [c, eos]])
    tools, stats = Answers("42"), TrajectoryStats()
    request = GenerationRequest(n=2, max_tokens=6, seeds=[11, 12, 13, 14])
    out = generate_trajectories(backend, tokenizer, [[1, 40], [1, 41]], request, tools, max_turns=4, stats=stats)
    tool = _ids(tokenizer, "<tool_response>42</tool_response>")
    assert len(tool) == 4
    for r, prompt in zip(out, [[1, 40], [1, 40], [1, 41], [1, 41]]):
        assert r.prompt_ids == prompt
        assert r.completion_ids == [a, close] + tool + [b, b, close] + tool + [c, eos]
        assert r.tool_mask == [0, 0] + [1] * 4 + [0, 0, 0] + [1] * 4 + [0, 0]
        assert r.logprobs == [-0.1] * 2 + [0.0] * 4 + [-0.2] * 3 + [0.0] * 4 + [-0.3] * 2
        assert not r.truncated
        assert r.text == "a</tool_call><tool_response>42</tool_response>bb</tool_call><tool_response>42</tool_response>c"
    assert tools.texts[:2] == ["a</tool_call>", "a</tool_call>"]  # each model turn's own text
    # one call per turn; later turns: every continuing trajectory its own row, seeded by (its seed, turn)
    assert [len(p) for p, _ in backend.calls] == [2, 4, 4]
    first, second, third = (r for _, r in backend.calls)
    assert first.n == 2 and first.seeds == [11, 12, 13, 14] and first.stop_token_ids == (close,)
    assert second.n == third.n == 1 and second.stop_token_ids == (close,)
    assert second.seeds == [derive_seed(s, 1) for s in (11, 12, 13, 14)]
    assert third.seeds == [derive_seed(s, 2) for s in (11, 12, 13, 14)]
    assert backend.calls[1][0][0] == [1, 40, a, close] + tool
    assert first.max_tokens == second.max_tokens == third.max_tokens == 6  # budget 24: room for full turns
    assert stats.turns == [3] * 4 and stats.tool_calls == [2] * 4 and stats.tool_errors == [0] * 4
    assert stats.metrics()["tools/calls_mean"] == 2.0 and stats.metrics()["tools/seconds"] == pytest.approx(2.0)


def test_max_turns_ends_on_an_unanswered_call_not_truncated(tiny):
    _, tokenizer = tiny
    close = tool_call_close_id(tokenizer)
    a = _ids(tokenizer, "a")[0]
    backend, stats = ScriptedBackend(tokenizer, [[a, close]]), TrajectoryStats()
    (r,) = generate_trajectories(backend, tokenizer, [[1]], GenerationRequest(n=1, max_tokens=4), Answers(),
                                 max_turns=2, stats=stats)
    tool = _ids(tokenizer, "<tool_response>ok</tool_response>")
    assert r.completion_ids == [a, close] + tool + [a, close] and not r.truncated
    assert r.text.endswith(TOOL_CALL_CLOSE)
    assert len(backend.calls) == 2 and stats.max_turns_hit == [True] and stats.tool_calls == [1]
    (one,) = generate_trajectories(backend, tokenizer, [[1]], GenerationRequest(n=1, max_tokens=4), Answers(),
                                   max_turns=1)
    assert one.completion_ids == [a, close] and one.tool_mask == [0, 0] and not one.truncated


def test_budget_cuts_a_model_turn_and_marks_it_truncated(tiny):
    _, tokenizer = tiny
    close, eos = tool_call_close_id(tokenizer), tokenizer.eos_token_id
    a, b = _ids(tokenizer, "ab")
    # trajectory 0 calls at once, trajectory 1 after 3 tokens: different room for their second turn
    backend = ScriptedBackend(tokenizer, [[a, close], [b] * 10 + [eos]])
    backend_turns = {0: [a, close], 1: [a, a, a, close]}
    first = backend.generate

    def generate(prompt_ids, request):
        out = first(prompt_ids, request)
        if len(backend.calls) == 1:  # the first turn: trajectory 1 writes more before its call
            out[1] = Rollout(out[1].prompt_ids, backend_turns[1], [-0.1] * 4, False, "aaa</tool_call>")
        return out

    backend.generate = generate
    stats = TrajectoryStats()
    out = generate_trajectories(backend, tokenizer, [[1]], GenerationRequest(n=2, max_tokens=8, seeds=[3, 4]),
                                Answers(), max_turns=3, max_total_tokens=12, stats=stats)
    tool = _ids(tokenizer, "<tool_response>ok</tool_response>")
    assert out[0].completion_ids == [a, close] + tool + [b] * 6 and out[0].truncated  # 2 + 4 + 6 = 12
    assert out[1].completion_ids == [a, a, a, close] + tool + [b] * 4 and out[1].truncated
    assert all(len(r.completion_ids) == 12 == len(r.tool_mask) == len(r.logprobs) for r in out)
    # one call for both rows, asking for the most room either has (6), each cut to its own afterwards
    assert backend.calls[1][1].max_tokens == 6 and len(backend.calls[1][0]) == 2
    assert stats.budget_cut == [True, True]


def test_budget_cuts_a_tool_turn_and_the_model_gets_no_more_turns(tiny):
    _, tokenizer = tiny
    close = tool_call_close_id(tokenizer)
    a = _ids(tokenizer, "a")[0]
    backend = ScriptedBackend(tokenizer, [[a, a, close]])
    (r,) = generate_trajectories(backend, tokenizer, [[1]], GenerationRequest(n=1, max_tokens=8), Answers("12345"),
                                 max_turns=4, max_total_tokens=6)
    assert r.completion_ids == [a, a, close] + _ids(tokenizer, "<tool_response>12") and r.truncated
    assert r.tool_mask == [0, 0, 0, 1, 1, 1] and r.logprobs[3:] == [0.0] * 3
    assert len(backend.calls) == 1
    # the default budget is max_tokens per model turn
    (r,) = generate_trajectories(backend, tokenizer, [[1]], GenerationRequest(n=1, max_tokens=3), Answers("1234"),
                                 max_turns=2)
    assert len(r.completion_ids) == 6 and r.truncated


# --- (f) a tool error is read by the model, which continues ---


def test_tool_error_continues_the_trajectory(tiny):
    _, tokenizer = tiny
    close, eos = tool_call_close_id(tokenizer), tokenizer.eos_token_id
    a, b = _ids(tokenizer, "ab")
    backend, stats = ScriptedBackend(tokenizer, [[a, close], [b, eos]]), TrajectoryStats()
    tools = Answers("error: malformed JSON in <tool_call>", error=True)
    (r,) = generate_trajectories(backend, tokenizer, [[1]], GenerationRequest(n=1, max_tokens=4), tools,
                                 max_turns=3, max_total_tokens=64, stats=stats)
    error_turn = _ids(tokenizer, "<tool_response>error: malformed JSON in <tool_call></tool_response>")
    assert backend.calls[1][0] == [[1, a, close] + error_turn]  # the model's next turn reads the error
    assert r.completion_ids == [a, close] + error_turn + [b, eos] and not r.truncated
    assert "error: malformed JSON" in r.text and r.text.endswith("b")
    assert stats.tool_errors == [1] and stats.metrics()["tools/error_rate"] == 1.0


def test_no_call_in_the_turn_ends_it_and_no_logprobs_stay_none(tiny):
    _, tokenizer = tiny
    close = tool_call_close_id(tokenizer)
    a = _ids(tokenizer, "a")[0]
    backend = ScriptedBackend(tokenizer, [[a, close]], logprobs=False)
    (r,) = generate_trajectories(backend, tokenizer, [[1]], GenerationRequest(n=1, max_tokens=4),
                                 Answers(silent="a"), max_turns=3)
    assert r.completion_ids == [a, close] and not r.truncated and r.logprobs is None
    backend = ScriptedBackend(tokenizer, [[a, close]], logprobs=False)
    (r,) = generate_trajectories(backend, tokenizer, [[1]], GenerationRequest(n=1, max_tokens=4), Answers(),
                                 max_turns=2)
    assert r.logprobs is None and r.tool_mask.count(1) == 4


# --- the real HFBackend: (b) log-probs, (d) seeds ---


@pytest.fixture
def hf_trajectories(calls_tools):
    model, tokenizer = calls_tools
    request = GenerationRequest(n=3, max_tokens=6, temperature=0.8, seeds=[100 + i for i in range(9)])
    stats = TrajectoryStats()
    out = generate_trajectories(HFBackend(model, tokenizer), tokenizer, _prompts(tokenizer), request, Answers("7"),
                                max_turns=3, stats=stats)
    assert sum(t >= 2 for t in stats.turns) >= 4, stats  # most trajectories ran several model turns
    return model, tokenizer, request, out


@pytest.mark.parametrize("padding_free", [False, True])
def test_model_token_logprobs_equal_the_trainers(hf_trajectories, padding_free):
    model, tokenizer, request, rollouts = hf_trajectories
    config = GRPOConfig(temperature=request.temperature, per_device_train_batch_size=4, padding_free=padding_free,
                        **({"loss_type": "bnpo"} if padding_free else {}))
    batch = build_train_batch(rollouts, torch.zeros(len(rollouts)), tokenizer.pad_token_id, mask_truncated=False)
    trainer = compute_batch_logps(model, batch, list(range(len(rollouts))), config, torch.device("cpu"))  # [N, Tc]
    for i, r in enumerate(rollouts):
        model_tokens = torch.tensor(r.tool_mask) == 0  # [T]
        sampler = torch.tensor(r.logprobs)[model_tokens]
        ours = trainer[i, : len(r.completion_ids)][model_tokens]
        torch.testing.assert_close(ours, sampler, atol=1e-5, rtol=0)
        assert torch.equal(batch.loss_mask[i, : len(r.completion_ids)], model_tokens.long())


def test_trajectories_do_not_depend_on_the_batch_split(hf_trajectories):
    model, tokenizer, request, full = hf_trajectories
    backend, n = HFBackend(model, tokenizer), request.n
    prompts = _prompts(tokenizer)
    for order in ([2, 0], [1]):
        seeds = [request.seeds[p * n + j] for p in order for j in range(n)]
        part = generate_trajectories(backend, tokenizer, [prompts[p] for p in order],
                                     GenerationRequest(n=n, max_tokens=6, temperature=0.8, seeds=seeds), Answers("7"),
                                     max_turns=3)
        expected = [full[p * n + j] for p in order for j in range(n)]
        for a, b in zip(part, expected):
            assert (a.completion_ids, a.tool_mask, a.truncated, a.text) == (b.completion_ids, b.tool_mask, b.truncated,
                                                                           b.text)
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
    # one trajectory alone, n = 1
    (alone,) = generate_trajectories(backend, tokenizer, [prompts[1]], GenerationRequest(
        n=1, max_tokens=6, temperature=0.8, seeds=[request.seeds[n + 2]]), Answers("7"), max_turns=3)
    assert alone.completion_ids == full[n + 2].completion_ids


# --- (a) tool tokens are out of the loss ---


def _tool_rollouts() -> list[Rollout]:
    """2 prompts x G=2; tool turns inside completions and, in row 3, at the very end (a budget cut in a tool turn)."""
    return [
        Rollout([1, 30, 31], [40, 41, 265, 266, 50, 267, 42, 2], [-1.0] * 8, False, "", tool_mask=[0, 0, 0, 1, 1, 1, 0, 0]),
        Rollout([1, 30, 31], [43, 2], [-1.2, -0.3], False, ""),
        Rollout([1, 32], [44, 265, 266, 51, 52, 267, 45, 46, 2], [-0.8] * 9, False, "",
                tool_mask=[0, 0, 1, 1, 1, 1, 0, 0, 0]),
        Rollout([1, 32], [47, 48, 265, 266, 53, 54], [-0.9] * 6, True, "", tool_mask=[0, 0, 0, 1, 1, 1]),
    ]


def test_loss_mask_is_the_models_tokens_and_sequence_length_counts_them():
    rollouts = _tool_rollouts()
    batch = build_train_batch(rollouts, torch.tensor([1.0, -1.0, 0.5, -0.5]), 0, mask_truncated=False)
    for i, r in enumerate(rollouts):
        k, tools = len(r.completion_ids), torch.tensor(r.tool_mask or [0] * len(r.completion_ids))
        assert batch.completion_mask[i, :k].tolist() == [1] * k  # fed, tool tokens included
        assert batch.loss_mask[i, :k].tolist() == (1 - tools).tolist()
        assert batch.sampled_mask[i, :k].tolist() == (1 - tools).tolist()
    assert build_train_batch(rollouts, torch.zeros(4), 0, mask_truncated=True).loss_mask[3].sum() == 0
    plain = build_train_batch([rollouts[1]], torch.zeros(1), 0, mask_truncated=False)
    assert plain.tool_mask is None and torch.equal(plain.sampled_mask, plain.completion_mask)

    # the loss: on-policy grpo, d loss / d logp_it = -A_i / (G |o_i|) on the model's tokens, 0 on tool tokens
    gen = torch.Generator().manual_seed(0)
    logps = (-torch.rand(batch.completion_ids.shape, generator=gen, dtype=torch.float64)).requires_grad_()  # [N, T]
    ref = -torch.rand(batch.completion_ids.shape, generator=gen, dtype=torch.float64)  # [N, T]
    loss, _ = compute_policy_loss(logps, None, ref, batch.advantages.double(), batch.loss_mask, beta=0.0)
    loss.backward()
    model_tokens = batch.loss_mask.sum(1, keepdim=True).double()  # [N, 1]
    expected = -batch.advantages.double()[:, None] / (4 * model_tokens) * batch.loss_mask  # [N, T]
    torch.testing.assert_close(logps.grad, expected, atol=1e-12, rtol=0)
    # and nothing at a tool position moves it: log-probs, old, reference (beta > 0), any loss_type
    tool_pos = batch.tool_mask.bool()  # [N, T]
    for loss_type in ("grpo", "dapo", "dr_grpo", "bnpo"):
        for level in ("token", "sequence"):
            kwargs = {"beta": 0.1, "loss_type": loss_type, "importance_sampling_level": level, "max_completion_length": 9}
            a, _ = compute_policy_loss(logps.detach(), logps.detach() + 0.1, ref, batch.advantages.double(),
                                       batch.loss_mask, **kwargs)
            b, _ = compute_policy_loss(logps.detach().masked_fill(tool_pos, -20.0), (logps.detach() + 0.1).masked_fill(
                tool_pos, 3.0), ref.masked_fill(tool_pos, -9.0), batch.advantages.double(), batch.loss_mask, **kwargs)
            assert a.item() == pytest.approx(b.item(), abs=1e-12), (loss_type, level)


@pytest.mark.parametrize("mode", ["token_truncate", "sequence_mask"])
def test_an_update_ignores_tool_tokens_logits_and_logprobs(tiny, mode):
    """optimise() on the tiny model: changing the last (tool) token of a row, and the sampler's and the reference's
    log-probs on every tool token (the trainer's own there, or the trajectory's 0.0 placeholder), leaves the update
    and its metrics exactly as they were."""
    model, _ = tiny
    config = GRPOConfig(beta=0.04, num_generations=2, generation_batch_size=4, per_device_train_batch_size=4,
                        max_completion_length=9, learning_rate=1e-2, vllm_importance_sampling_mode=mode)

    def run(rollouts: list[Rollout], placeholder: bool, tool_ref: float) -> tuple[dict, torch.nn.Module]:
        batch = build_train_batch(rollouts, torch.tensor([1.0, -1.0, 0.5, -0.5]), 0, mask_truncated=False)
        tool = batch.tool_mask.bool()  # [N, T]
        trainer = compute_batch_logps(model, batch, list(range(len(batch))), config, torch.device("cpu"))  # [N, T]
        sampler = trainer - 0.05 * torch.arange(trainer.shape[1]) / trainer.shape[1]  # [N, T] a sampler a bit off
        batch.sampling_logps = sampler.masked_fill(tool, 0.0) if placeholder else sampler.where(~tool, trainer)
        batch.ref_logps = (trainer + 0.1).masked_fill(tool, tool_ref)  # [N, T]
        trained = copy.deepcopy(model).train()
        optimizer = build_optimizer(trained, config)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        return optimise(trained, None, optimizer, scheduler, batch, config, CPU, sampling_correction=True), trained

    rollouts = _tool_rollouts()
    metrics, trained = run(rollouts, placeholder=False, tool_ref=-1.1)
    changed = copy.deepcopy(rollouts)
    changed[3].completion_ids[-1] = 99  # the last token: a tool token nothing after it reads
    other_metrics, other = run(changed, placeholder=True, tool_ref=5.0)
    for a, b in zip(trained.parameters(), other.parameters()):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=0)
    for key in ("loss", "kl", "entropy", "sampling/sampling_logp_difference/max",
                "sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/max"):
        assert metrics[key] == pytest.approx(other_metrics[key], abs=1e-6), key
    assert metrics["sampling/sampling_logp_difference/max"] <= 0.05  # the model's tokens' gap only


# --- the real ToolSet ---


def test_real_toolset_calculator_and_its_errors(tiny):
    """A scripted model calls ``calculator`` twice (a good call, then a bad expression), reads both answers and
    ends; grpo_core.tools.ToolSet answers, its error turn is read like any other."""
    _, tokenizer = tiny
    eos = tokenizer.eos_token_id
    turns = [_ids(tokenizer, '<think>4721+3864</think><tool_call>{"name": "calculator", "arguments": '
                             '{"expression": "4721+3864"}}</tool_call>'),
             _ids(tokenizer, '<tool_call>{"name": "calculator", "arguments": {"expression": "2**"}}</tool_call>'),
             _ids(tokenizer, "<answer>8585</answer>") + [eos]]
    backend, tools, stats = ScriptedBackend(tokenizer, turns), ToolSet.from_specs(["calculator"]), TrajectoryStats()
    (r,) = generate_trajectories(backend, tokenizer, [[1]], GenerationRequest(n=1, max_tokens=80), tools,
                                 max_turns=4, stats=stats)
    assert not r.truncated and r.completion_ids[-1] == eos
    assert "</tool_call><tool_response>8585</tool_response><tool_call>" in r.text
    assert "</tool_call><tool_response>error: " in r.text and r.text.endswith("<answer>8585</answer>")
    assert stats.turns == [3] and stats.tool_calls == [2] and stats.tool_errors == [1]
    assert tools.stats()["tools/calculator/calls"] == 2 and tools.stats()["tools/calculator/errors"] == 1
    # the tool turns, decoded, are exactly what the model did not write
    tool_text = tokenizer.decode([t for t, m in zip(r.completion_ids, r.tool_mask) if m])
    assert tool_text.startswith("<tool_response>8585</tool_response><tool_response>error: ")
    assert "<tool_call>" not in tool_text and "<answer>" not in tool_text
