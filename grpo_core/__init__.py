"""The algorithm, with no orchestration or storage: everything here runs from a Python prompt on local paths.

Sub-packages, bottom up: ``config`` (every section's pydantic model), ``rewards`` (verifiable rewards, reward
models, judges), ``data`` (rows, the prepare_data function, built-in tasks, cold-start sets), ``generation``
(vLLM / transformers backends, rejection sampling), ``trainer`` (GRPO, SFT, reward-model training), ``evaluation``
(held-out accuracy, benchmarks, emergence features), ``models`` (the tiny base, miniatures) and ``plan`` (memory).
"""
