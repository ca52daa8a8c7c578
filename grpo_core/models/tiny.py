"""A tiny randomly initialised causal LM and its tokenizer, built locally (no hub).

    python -c "from grpo_core.models.tiny import build_tiny_model; print(build_tiny_model('/tmp/tiny'))"

The embedded default of the pipeline trains this model through the whole R1 recipe on a laptop CPU.
It is a Llama (or Qwen2) config at hidden 128 x 4 layers x 4 heads (~0.9M parameters, a size that
learns the "chain" task in minutes on a laptop CPU), saved with
``save_pretrained`` so every stage loads it with ``AutoModelForCausalLM``/``AutoTokenizer`` like a real model.

Tokenizer: one token per byte (a byte-level BPE with no merges, built with ``tokenizers``), plus the
special tokens ``<pad> <bos> <eos> <unk>`` and the R1 tags ``<think> </think> <answer> </answer>`` as
single added tokens. Byte-level keeps any text round-tripping exactly, spaces and newlines included,
also when transformers picks ``Qwen2Tokenizer`` (NFC + ByteLevel) for ``model_type=qwen2``.
Departure from the prototype: its vocabulary had 28 characters; this one has 264 so real data sets
(GSM8K text) tokenize too. The unused byte tokens cost ~34k embedding parameters.

``grpo_core.recipe.pretrain.pretrain_tiny_model`` then optionally pretrains the built model on worked solutions of the built-in
task (one operation a step), the way a real base model has seen worked arithmetic before the R1 recipe starts:
the skill is in the base, the cold start sets the style, RL finds which style pays.

The chat template renders a conversation as plain task text: ``<bos>`` then the contents one after
another, an assistant turn followed by ``<eos>``; the generation prompt adds nothing, so the prompt
``7+8*3-5=`` stays 9 tokens and the model continues with ``<think>``.

``tool_tokens=True`` (multi-turn tool rollouts, ``grpo_core/generation/trajectory.py``): ``<tool_call>
</tool_call> <tool_response> </tool_response>`` become four more added tokens, non-special like the tags, with
ids after the 264 of the default vocabulary (so the default tokenizer and models are unchanged), and the chat
template ``TOOL_CHAT_TEMPLATE`` renders a tool message as ``<tool_response>{content}</tool_response>`` and leaves
an assistant turn that a tool message follows open (no ``<eos>``); user/assistant conversations render as with
``CHAT_TEMPLATE``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
REASONING_TAGS = ["<think>", "</think>", "<answer>", "</answer>"]
# as grpo_core.tools spells them (a floor above: tests/grpo_core/test_trajectory.py checks they agree)
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
)
# CHAT_TEMPLATE plus the tool role: a tool message wrapped in <tool_response>, an assistant turn before one left open
TOOL_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}<tool_response>{{ message['content'] }}</tool_response>"
    "{% else %}{{ message['content'] }}{% endif %}"
    "{% if message['role'] == 'assistant' and (loop.last or messages[loop.index0 + 1]['role'] != 'tool') %}"
    "{{ eos_token }}{% endif %}"
    "{% endfor %}"
)


def build_tiny_tokenizer(tool_tokens: bool = False) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer with one token per byte and the special/tag tokens as whole tokens; ``tool_tokens``:
    also the tool tags (ids 264-267) and ``TOOL_CHAT_TEMPLATE``."""
    byte_alphabet = pre_tokenizers.ByteLevel.alphabet()  # the 256 printable stand-ins for bytes
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in sorted(byte_alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    # use_regex=False: no word splitting is needed when every byte is its own token.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    # The tags are added (never split) but not special: decode(skip_special_tokens=True) must keep
    # them, because the rewards read them from the decoded completion.
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in REASONING_TAGS])
    if tool_tokens:  # after every default id: the default vocabulary (and a default model's weights) unchanged
        tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in TOOL_TAGS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = TOOL_CHAT_TEMPLATE if tool_tokens else CHAT_TEMPLATE
    return fast


def build_tiny_model(
    output_dir: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    max_position_embeddings: int = 256,
    architecture: Literal["llama", "qwen2"] = "llama",
    intermediate_size: int | None = None,
    tool_tokens: bool = False,
) -> Path:
    """Save a random-init causal LM + tokenizer to ``output_dir`` and return the path.

    Deterministic by ``seed``: the same arguments give the same weights.
    ``intermediate_size`` defaults to 3 x hidden (0.86M non-byte parameters at the defaults).
    ``tool_tokens``: the tokenizer with the tool tags (``build_tiny_tokenizer``), so the vocabulary (and the
    embedding) is 4 tokens larger.
    """
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(tool_tokens)
    tokenizer.model_max_length = max_position_embeddings
    config = AutoConfig.for_model(
        architecture,
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 3 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.02,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(output_dir, safe_serialization=True)
    tokenizer.save_pretrained(output_dir)
    _pin_tokenizer_class(output_dir)
    return output_dir


def _pin_tokenizer_class(output_dir: Path) -> None:
    """Make AutoTokenizer load the saved tokenizer.json as is, whatever the model_type says."""
    path = output_dir / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
