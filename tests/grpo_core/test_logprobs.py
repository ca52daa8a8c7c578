"""The chunked log-prob pass agrees with the naive full log-softmax (values, entropies, gradients)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from grpo_core.trainer.logprobs import compute_token_logps

torch.set_num_threads(1)
V = 97


def tiny_model(kind: str, tied: bool) -> torch.nn.Module:
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[kind]
    config = cls(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger logits than the 0.02-std init, so log-probs differ visibly across tokens
        model.get_output_embeddings().weight.mul_(20)
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    return model


def naive_logps(model, input_ids, attention_mask, T, temperature):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -T - 1 : -1] / temperature  # [B, T, V]
    logp_all = logits.log_softmax(-1)  # [B, T, V]
    logps = logp_all.gather(-1, input_ids[:, -T:, None]).squeeze(-1)  # [B, T]
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # [B, T]
    return logps, entropy


def batch(left_pad: bool):
    gen = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, V, (3, 12), generator=gen)  # [B, L]
    attention_mask = torch.ones_like(input_ids)
    if left_pad:  # prompts of different lengths, left-padded; completion = last 5 tokens
        attention_mask[0, :4] = 0
        attention_mask[2, :2] = 0
    return input_ids, attention_mask


@pytest.mark.parametrize("kind, tied", [("llama", True), ("llama", False), ("qwen2", True), ("qwen2", False)])
@pytest.mark.parametrize("chunk_size", [4, 15, 1000])  # 15 = B*T; 4 does not divide it
@pytest.mark.parametrize("checkpoint_logits", [True, None])  # None: small vocabulary, so logits kept
def test_values_entropy_and_gradients_match_naive(kind, tied, chunk_size, checkpoint_logits):
    model = tiny_model(kind, tied)
    input_ids, attention_mask = batch(left_pad=True)
    T, temperature = 5, 0.7
    weights = torch.randn(3, T, generator=torch.Generator().manual_seed(2))

    ref_logps, ref_entropy = naive_logps(model, input_ids, attention_mask, T, temperature)
    (ref_logps * weights).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    logps, entropy = compute_token_logps(
        model, input_ids, attention_mask, T, temperature=temperature, chunk_size=chunk_size, compute_entropy=True,
        checkpoint_logits=checkpoint_logits,
    )
    assert logps.shape == entropy.shape == (3, T) and logps.dtype == torch.float32
    torch.testing.assert_close(logps, ref_logps, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=0)
    assert ref_logps.std() > 0.5  # the check is not trivially about near-uniform distributions
    assert not entropy.requires_grad  # a metric, outside autograd
    (logps * weights).sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_no_grad_pass_and_entropy_off():
    model = tiny_model("qwen2", True)
    input_ids, attention_mask = batch(left_pad=False)
    with torch.no_grad():
        logps, entropy = compute_token_logps(model, input_ids, attention_mask, 7, chunk_size=3)
        ref_logps, _ = naive_logps(model, input_ids, attention_mask, 7, 1.0)
    assert entropy is None and not logps.requires_grad
    torch.testing.assert_close(logps, ref_logps, atol=1e-5, rtol=0)


def test_no_vocabulary_sized_tensor_is_saved_for_backward():
    """Checkpointed chunks: autograd keeps hidden rows, not [n, V] logits, between forward and backward."""
    model = tiny_model("llama", False)
    input_ids, attention_mask = batch(left_pad=False)
    saved_shapes = []

    def pack(t):
        saved_shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logps, _ = compute_token_logps(
            model, input_ids, attention_mask, 5, chunk_size=4, compute_entropy=True, checkpoint_logits=True
        )
    assert saved_shapes  # the transformer body did save activations through the hook
    assert not [s for s in saved_shapes if s and s[-1] == V and len(s) >= 2], saved_shapes
    logps.sum().backward()  # and backward still works through the recomputation
    assert model.get_output_embeddings().weight.grad.abs().sum() > 0


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("completion_len", [1, 6])
def test_shared_prompt_pass_matches_one_pass_per_row(kind, completion_len):
    """Completions of shared prompts (groups of uneven size, left-padded prompts, right-padded completions):
    one prompt pass gathered per row gives the per-row pass's log-probs, entropies and gradients."""
    from grpo_core.trainer.logprobs import compute_completion_logps

    model = tiny_model(kind, tied=True)
    gen = torch.Generator().manual_seed(3)
    prompts = torch.randint(0, V, (3, 7), generator=gen)  # [P, Lp]
    prompt_mask = torch.ones_like(prompts)
    prompt_mask[0, :3] = 0  # a shorter prompt, left-padded
    prompt_mask[2, :1] = 0
    index = torch.tensor([0, 0, 0, 1, 2, 2, 2, 2, 0])  # groups of 4, 1, 4 (one row out of order)
    T = completion_len
    completions = torch.randint(0, V, (len(index), T), generator=gen)  # [B, T]
    completion_mask = torch.ones_like(completions)
    if T > 1:
        completion_mask[1, 2:] = 0  # ended early: right padding
        completion_mask[5, 4:] = 0
    weights = torch.randn(len(index), T, generator=gen) * completion_mask

    input_ids = torch.cat([prompts[index], completions], 1)  # [B, Lp+T]
    attention_mask = torch.cat([prompt_mask[index], completion_mask], 1)
    ref_logps, ref_entropy = compute_token_logps(model, input_ids, attention_mask, T, temperature=0.7, compute_entropy=True)
    (ref_logps * weights).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    logps, entropy = compute_completion_logps(
        model, prompts, prompt_mask, index, completions, completion_mask, temperature=0.7, compute_entropy=True
    )
    (logps * weights).sum().backward()
    keep = completion_mask.bool()
    torch.testing.assert_close(logps[keep], ref_logps[keep], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy[keep], ref_entropy[keep], atol=1e-5, rtol=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)
