"""Training, evaluation and rejection sampling score through one function, with one notion of "correct".

Same rows, same completions: the trainer's rewards, evaluation's verdicts and rejection sampling's pass rates
all equal ``score_completions`` called directly, and a spy shows each path calls it.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from grpo_core.config import EvalConfig, GRPOConfig, RejectionSamplingConfig
from grpo_core.data.synthetic import chain_accuracy
import grpo_core.evaluation.heldout as evaluation
from grpo_core.generation import Rollout
from grpo_core.generation.base import GenerationRequest
from grpo_core.generation.prompts import encode_prompt
from grpo_core.models.tiny import build_tiny_model
import grpo_core.recipe.rejection as rejection
from grpo_core.rewards import REWARD_FUNCS
from grpo_core.rewards.scoring import passes, score_completions
from grpo_core.trainer.distributed import DistContext
from grpo_core.trainer.mixture import Mixture
import grpo_core.trainer.rollouts as rollouts

torch.set_num_threads(1)

ROWS = [{"id": f"r{i}", "prompt": [{"role": "user", "content": p}], "answer": a, "task": "chain", "source": "t"}
        for i, (p, a) in enumerate([("1+2+3=", "6"), ("2*3*4=", "24"), ("9-1-1=", "7")])]
# per row: G = 3 completions, the first also the greedy one: worked, direct (empty think), wrong, unformatted.
TEXTS = [
    ["<think>1+2=3;3+3=6</think><answer>6</answer>", "<think></think><answer>6</answer>", "6"],
    ["<think></think><answer>25</answer>", "<think>2*3=6;6*4=24</think><answer>24</answer>", "x"],
    ["<think>9-1=8;8-1=7</think><answer>7</answer>", "<think>9-1=8</think><answer>8</answer>", "<answer>7</answer>"],
]
G = 3


class ScriptedBackend:
    """TEXTS[i][:n] for prompt i (greedy: TEXTS[i][0]), whatever the seeds."""

    def __init__(self, tok):
        self.tok = tok
        self.prompts = [encode_prompt(tok, r["prompt"]) for r in ROWS]

    def generate(self, prompt_ids, request):
        n = request.n
        out = []
        for p in prompt_ids:
            for text in TEXTS[self.prompts.index(p)][:n]:
                ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
                out.append(Rollout(p, ids, None, False, text))
        return out

    def update_weights(self, model):
        pass


def probe(completions, prompts, completion_ids, max_completion_length, answer, **columns):
    """chain_accuracy that records what it was called with."""
    CALLS.append({"completion_type": type(completions[0]).__name__, "prompt_type": type(prompts[0]).__name__,
                  "columns": sorted(columns), "max_completion_length": max_completion_length,
                  "ids": len(completion_ids) == len(completions)})
    return chain_accuracy(completions, answer=answer)


CALLS: list[dict] = []


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=32,
                                                          num_layers=2, num_heads=2))


@pytest.fixture
def spy(monkeypatch):
    """Every call of score_completions made by the three modules, as ``(module, num_rows, num_generations)``."""
    calls = []

    def wrap(module):
        def spying(reward_funcs, reward_names, rows, rollout_list, num_generations, max_completion_length,
                   routes=None):
            calls.append((module.__name__, len(rows), num_generations))
            return score_completions(reward_funcs, reward_names, rows, rollout_list, num_generations,
                                     max_completion_length, routes)
        return spying

    for module in (rollouts, evaluation, rejection):
        assert module.score_completions is score_completions  # the same function, imported, not a copy
        monkeypatch.setattr(module, "score_completions", wrap(module))
    CALLS.clear()
    return calls


def test_three_paths_one_function_identical_scores(tok, spy):
    backend = ScriptedBackend(tok)
    scripted = backend.generate(backend.prompts, GenerationRequest(n=G, max_tokens=16))
    direct = score_completions([probe], ["probe"], ROWS, scripted, G, 16)  # [9, 1]
    direct_ok = passes(direct[:, 0])
    assert direct_ok == [True, True, False, False, True, False, True, False, False]  # chain_accuracy: direct counts
    reference_call = CALLS.pop()

    # training: one step's groups over the three rows (the stream's order; scores compared row by row)
    config = GRPOConfig(num_generations=G, generation_batch_size=3 * G, max_completion_length=16, use_vllm=False)
    ctx = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    mixture = Mixture(config, ROWS, lambda _: ([probe], ["probe"]))
    groups = rollouts.generate_groups(backend, tok, mixture, 0, 3, 0, config, ctx, {})
    for g, row in enumerate(groups.rows):
        i = ROWS.index(row)
        assert torch.equal(groups.rewards_per_func[g * G:(g + 1) * G], direct[i * G:(i + 1) * G])

    # evaluation: greedy accuracy (the first completion of each row) and pass@1 over all G
    m = evaluation.evaluate(EvalConfig(num_samples=G, max_new_tokens=16, forced_reasoning=False), "unused", ROWS,
                            tokenizer=tok, backend=backend, return_rows=True, reward_func=probe)
    assert [r["correct"] for r in m["rows"]] == direct_ok[::G]
    assert [r["pass@1"] for r in m["rows"]] == [sum(direct_ok[i * G:(i + 1) * G]) / G for i in range(3)]

    # rejection sampling: per-prompt pass rates
    _, stats = rejection.rejection_sample(RejectionSamplingConfig(num_samples=G, keep_per_prompt=G, max_new_tokens=16),
                                          backend, tok, ROWS, reward_func=probe)
    assert [p["pass_rate"] for p in stats["per_prompt"]] == [sum(direct_ok[i * G:(i + 1) * G]) / G for i in range(3)]

    assert [module for module, _, _ in spy] == [  # evaluation: greedy verdicts, greedy format, samples
        "grpo_core.trainer.rollouts", *["grpo_core.evaluation.heldout"] * 3, "grpo_core.recipe.rejection"]
    # the reward saw the same argument types on every path: chat completions, every column, completion_ids
    assert len(CALLS) == 4 and all(call == reference_call for call in CALLS), (reference_call, CALLS)
    assert reference_call["completion_type"] == "list" and reference_call["columns"] == ["id", "source", "task"]


def test_evaluation_and_rejection_share_the_format_verdicts(tok, spy):
    """The format rate and the format filter are both the registered format reward through the same call."""
    backend = ScriptedBackend(tok)
    always = lambda completions, **kw: [1.0] * len(completions)  # noqa: E731
    all_rollouts = backend.generate(backend.prompts, GenerationRequest(n=G, max_tokens=16))
    fmt = passes(score_completions([REWARD_FUNCS["format"]], ["format"], ROWS, all_rollouts, G, 16)[:, 0])
    assert fmt == [True, False, False, False, True, False, True, True, False]
    m = evaluation.evaluate(EvalConfig(num_samples=0, max_new_tokens=16, forced_reasoning=False), "unused", ROWS,
                            tokenizer=tok, backend=backend)
    assert m["eval/format_rate"] == pytest.approx(sum(fmt[::G]) / 3)
    _, stats = rejection.rejection_sample(RejectionSamplingConfig(num_samples=G, keep_per_prompt=G, max_new_tokens=16),
                                          backend, tok, ROWS, reward_func=always)
    assert stats["rs/rejected/format"] == fmt.count(False)
    assert [p["kept"] for p in stats["per_prompt"]] == [sum(fmt[i * G:(i + 1) * G]) for i in range(3)]
