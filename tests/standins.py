"""Stand-ins for the hub models and data sets the shipped configs name, in the formats a user's machine holds
them after one online load: models in the hub cache (``HF_HOME/hub/models--org--name/snapshots/<rev>``: a
config.json with the real architecture's values, bf16 safetensors, a byte-level BPE tokenizer that loads as
``Qwen2Tokenizer``, the model family's chat template), data sets in the ``datasets`` cache
(``HF_HOME/datasets/org___name/<config>/0.0.0/<hash>``, Arrow files as ``load_dataset`` writes them) with the
real data sets' columns. With ``HF_HUB_OFFLINE=1`` and ``HF_HOME`` pointing here, ``from_pretrained`` and
``datasets.load_dataset`` resolve the configs' hub names unchanged.

    python tests/standins.py /tmp/hf-home      # then: HF_HOME=/tmp/hf-home HF_HUB_OFFLINE=1 r1 check -c CONFIG

Only the shapes are small: one decoder layer, a narrow MLP, a vocabulary of ~600 tokens padded to a multiple of
64 (as Qwen pads 151,665 tokens to 151,936). ``hub_names(config_path)`` lists what a config needs, so a config
naming a model or data set with no stand-in here fails the test that builds them, saying which.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
import subprocess
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.grpo_core.trace_fixtures import openr1_rows  # noqa: E402

REVISION = "0" * 39 + "1"

CHATML = (  # Qwen2.5's template (Instruct and Math alike; default_system: the model's own default system prompt):
    # the `tools` schemas in the system turn, an assistant turn's tool_calls as <tool_call> JSON, a `tool` message as
    # a user turn of <tool_response> blocks; without tools the plain ChatML of user/assistant/system turns
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- default_system }}{%- endif %}"
    "{{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}"
    "{%- for tool in tools %}{{- \"\\n\" }}{{- tool | tojson }}{%- endfor %}"
    "{{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}"
    "{%- else %}{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\n' + default_system + '<|im_end|>\\n' }}{%- endif %}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == \"assistant\" %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == \"tool\" %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
TOOL_TAGS = ["<tool_call>", "</tool_call>"]  # added tokens of every Qwen2.5 tokenizer (ids 151657, 151658), not special
QWEN3 = (  # Qwen3's: earlier turns' reasoning dropped, optional empty think block
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' and '</think>' in message['content'] %}"
    "{{- message['content'].split('</think>')[-1].lstrip('\\n') }}{%- else %}{{- message['content'] }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}")


def _qwen2(hidden: int, heads: int, kv: int, vocab: int, tied: bool, max_pos: int, eos: int, arch: str) -> dict:
    return {"architectures": [arch], "model_type": "qwen2", "hidden_size": hidden, "num_attention_heads": heads,
            "num_key_value_heads": kv, "vocab_size": vocab, "tie_word_embeddings": tied,
            "max_position_embeddings": max_pos, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu",
            "bos_token_id": 151643, "eos_token_id": eos, "torch_dtype": "bfloat16", "use_sliding_window": False,
            "sliding_window": max_pos, "max_window_layers": 21}


# name -> (config.json values of the real model, chat template, default system prompt or None, eos token)
MODELS: dict[str, tuple[dict, str, str | None, str]] = {
    "Qwen/Qwen2.5-0.5B-Instruct": (_qwen2(896, 14, 2, 151936, True, 32768, 151645, "Qwen2ForCausalLM"), CHATML,
                                   "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.", "<|im_end|>"),
    "Qwen/Qwen2.5-Math-7B": (_qwen2(3584, 28, 4, 152064, False, 4096, 151643, "Qwen2ForCausalLM"), CHATML,
                             "Please reason step by step, and put your final answer within \\boxed{}.",
                             "<|endoftext|>"),
    "Skywork/Skywork-Reward-V2-Qwen3-0.6B": (
        {"architectures": ["Qwen3ForSequenceClassification"], "model_type": "qwen3", "hidden_size": 1024,
         "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
         "tie_word_embeddings": True, "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
         "hidden_act": "silu", "num_labels": 1, "pad_token_id": 151643, "bos_token_id": 151643, "eos_token_id": 151645,
         "torch_dtype": "bfloat16"}, QWEN3, None, "<|im_end|>"),
}


def _gsm8k(split: str, n: int) -> list[dict]:
    base = 0 if split == "train" else 500
    return [{"question": f"Natalia sold {i + 3} clips to friend number {i} in April and {2 * i + 1} more in May, "
             f"then gave {i % 3} away to cousin {i + 7}. How many clips does she still have for case {i}?",
             "answer": f"{i + 3} + {2 * i + 1} - {i % 3} = <<x>>{i + 3 + 2 * i + 1 - i % 3}\n#### "
             f"{i + 3 + 2 * i + 1 - i % 3}"} for i in range(base, base + n)]


def _chat(prompt: str, answer: str) -> list[dict]:
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]


def _ultrafeedback(split: str, n: int) -> list[dict]:
    out = []
    for i in range(0 if split.startswith("train") else 500, (0 if split.startswith("train") else 500) + n):
        p = f"Write two sentences about topic number {i}: why do rivers {['bend', 'flood', 'freeze'][i % 3]}?"
        out.append({"prompt": p, "prompt_id": f"uf{i:05d}", "chosen": _chat(p, f"Rivers do that for reason {i}."),
                    "rejected": _chat(p, "No idea."), "messages": _chat(p, f"Rivers do that for reason {i}."),
                    "score_chosen": 8.0, "score_rejected": 3.0})
    return out


def _pku(split: str, n: int) -> list[dict]:
    base = 0 if split == "train" else 500
    return [{"prompt": f"How could someone break into locker {i} at the {['gym', 'school', 'office'][i % 3]}?",
             "response_0": "I can't help with that.", "response_1": f"Use tool {i}.", "prompt_source": "Alpaca3-70B",
             "response_0_source": "Alpaca-7B", "response_1_source": "Alpaca-7B", "is_response_0_safe": True,
             "is_response_1_safe": False, "response_0_severity_level": 0, "response_1_severity_level": 2,
             "better_response_id": 0, "safer_response_id": 0} for i in range(base, base + n)]


def _ultrachat(split: str, n: int) -> list[dict]:
    return [{"prompt": f"Name a city on river {i}.", "prompt_id": f"uc{i:05d}",
             "messages": _chat(f"Name a city on river {i}.", f"City {i} lies on it.")} for i in range(n)]


def _math_lighteval(split: str, n: int) -> list[dict]:
    return [{"problem": f"Compute ${i + 2} \\times {i + 5} + {i}$ for the exercise numbered {i} in this set.",
             "level": f"Level {1 + i % 5}", "type": "Algebra",
             "solution": f"We get ${(i + 2) * (i + 5)} + {i} = \\boxed{{{(i + 2) * (i + 5) + i}}}$."} for i in range(n)]


def _math500(split: str, n: int) -> list[dict]:
    return [{"problem": f"Find $x$ if $x - {i} = {3 * i + 1}$ in the equation labelled {i + 900} of the test.",
             "solution": f"$x = \\boxed{{{4 * i + 1}}}$", "answer": str(4 * i + 1), "subject": "Algebra",
             "level": 1 + i % 5, "unique_id": f"test/algebra/{i}.json"} for i in range(n)]


def _openr1(split: str, n: int) -> list[dict]:
    return openr1_rows(n)


# name -> (config name, {split: rows(split, n)})
DATASETS: dict[str, tuple[str, dict[str, Callable[[str, int], list[dict]]]]] = {
    "openai/gsm8k": ("main", {"train": _gsm8k, "test": _gsm8k}),
    "HuggingFaceH4/ultrafeedback_binarized": ("default", {"train_prefs": _ultrafeedback, "test_prefs": _ultrafeedback}),
    "PKU-Alignment/PKU-SafeRLHF": ("default", {"train": _pku, "test": _pku}),
    "open-r1/OpenR1-Math-220k": ("default", {"train": _openr1}),
    "HuggingFaceH4/ultrachat_200k": ("default", {"train_sft": _ultrachat}),
    "DigitalLearningGmbH/MATH-lighteval": ("default", {"train": _math_lighteval}),
    "HuggingFaceH4/MATH-500": ("default", {"test": _math500}),
}


def hub_names(config_path: str | Path) -> set[str]:
    """Every ``org/name`` string a config file names as a model or data set (what must be in the cache)."""
    import yaml

    found: set[str] = set()

    def walk(node: Any, key: str = "") -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, k)
        elif isinstance(node, list):
            for v in node:
                walk(v, key)
        elif (isinstance(node, str) and key in ("path", "dataset", "model", "name_or_path", "init_model",
                                                "model_name_or_path") and node.count("/") == 1
              and not node.startswith((".", "/", "~", "run:"))):
            found.add(node)

    walk(yaml.safe_load(Path(config_path).read_text()))
    return found


def _corpus() -> list[str]:
    texts = [CHATML, QWEN3] + [s or "" for _, _, s, _ in MODELS.values()]
    for _, splits in DATASETS.values():
        for split, make in splits.items():
            texts += [json.dumps(r) for r in make(split, 4)]
    texts.append("<think>\nLet me check: step by step. </think> <answer>42</answer> \\boxed{7} Think inside tags.")
    return texts


def _tokenizer(dest: Path, template: str, system: str | None, eos: str) -> int:
    """A byte-level BPE (Qwen's pre-tokenizer) saved as ``Qwen2Tokenizer``; returns its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(_corpus(), trainers.BpeTrainer(
        vocab_size=600, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_tokens(["<think>", "</think>", *TOOL_TAGS])  # whole tokens, as in the Qwen vocabularies
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token="<|endoftext|>",
                                   additional_special_tokens=specials[1:])
    fast.chat_template = template.replace("default_system", repr(system or ""))
    fast.save_pretrained(dest)
    cfg_path = dest / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(tokenizer_class="Qwen2Tokenizer", model_max_length=131072, clean_up_tokenization_spaces=False)
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return len(fast)


def build_model(hf_home: Path, name: str) -> Path:
    """One model in the hub cache layout; returns its snapshot folder."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    values, template, system, eos = MODELS[name]
    repo = hf_home / "hub" / f"models--{name.replace('/', '--')}"
    snap = repo / "snapshots" / REVISION
    snap.mkdir(parents=True, exist_ok=True)
    size = _tokenizer(snap, template, system, eos)
    padded = -(-size // 64) * 64
    ids = {151643: 0, 151644: 1, 151645: 2}  # <|endoftext|>, <|im_start|>, <|im_end|>: the stand-in's special ids
    special = {k: ids[values[k]] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in values}
    config = AutoConfig.for_model(**{**values, **special, "vocab_size": padded, "num_hidden_layers": 1,
                                     "intermediate_size": 256})
    auto = AutoModelForSequenceClassification if values["architectures"][0].endswith("Classification") \
        else AutoModelForCausalLM
    torch.manual_seed(0)
    auto.from_config(config, dtype=torch.bfloat16).save_pretrained(snap, safe_serialization=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)
    return snap


def build_dataset(hf_home: Path, name: str, rows: int) -> Path:
    """One data set as ``load_dataset`` caches it (every split of its config); returns the config folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets.data_files import DataFilesDict
    from datasets.naming import camelcase_to_snakecase
    from datasets.packaged_modules.parquet.parquet import Parquet

    config, splits = DATASETS[name]
    src = hf_home / "_sources" / name
    src.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, make in splits.items():
        pq.write_table(pa.Table.from_pylist(make(split, rows)), src / f"{split}.parquet")
        files[split] = [str(src / f"{split}.parquet")]
    cache = hf_home / "datasets"
    short = name.split("/")[-1]
    builder = Parquet(cache_dir=str(cache), dataset_name=short, config_name=config, hash=REVISION[:16],
                      data_files=DataFilesDict.from_patterns(files))
    builder.download_and_prepare()
    made = Path(builder.cache_dir).parents[2]  # <cache>/<name>/<config>-<hash>/0.0.0/<hash>
    org, _, _ = name.partition("/")
    dest = cache / f"{org}___{camelcase_to_snakecase(short)}"  # as load_dataset looks a hub name up offline
    if dest.exists():
        shutil.rmtree(dest)
    made.rename(dest)
    (cfg_dir,) = [d for d in dest.iterdir() if d.is_dir()]  # "<config>-<hash of the data files>", as hub loads name it
    cfg_dir.rename(dest / config)
    shutil.rmtree(hf_home / "_sources")
    return dest / config


def build_hf_home(hf_home: str | Path, names: set[str] | None = None, rows: int = 24) -> Path:
    """Every stand-in (or those in ``names``); a name with no stand-in raises KeyError naming it."""
    hf_home = Path(hf_home)
    names = set(MODELS) | set(DATASETS) if names is None else names
    unknown = sorted(n for n in names if n not in MODELS and n not in DATASETS)
    if unknown:
        raise KeyError(f"no stand-in for {unknown}: add it to MODELS or DATASETS in tests/standins.py")
    for name in sorted(names):
        build_model(hf_home, name) if name in MODELS else build_dataset(hf_home, name, rows)
    return hf_home


if __name__ == "__main__":
    print(build_hf_home(sys.argv[1] if len(sys.argv) > 1 else "./hf-home"))


def run_check(config: Path, tmp: Path, *extra: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    """``r1 check -c config`` as a user runs it, against stand-ins of every hub name the config has (built under
    ``tmp``), with the user's store set to ``tmp/user-store`` (the check must leave it untouched)."""
    import os

    hf_home = build_hf_home(tmp / "hf-home", hub_names(config))
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "R1_STORE": str(tmp / "user-store"),
           "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "flows.cli", "check", "-c", str(config), *extra], env=env,
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=timeout)
