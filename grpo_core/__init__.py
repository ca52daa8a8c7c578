"""The algorithm, with no orchestration or storage: everything here runs from a Python prompt on local paths.

Sub-packages by floor, bottom up; each imports only its own floor's package and the floors below
(``tests/test_layers.py`` checks it, imports inside functions included):

1. ``config`` (every section's pydantic model, the phrase lists of the emergence features), ``seeds`` (derived
   seeds), ``models`` (the tiny base, miniatures of real architectures);
2. ``rewards``: verifiable rewards, reward models, judges, and how a completion is scored;
3. ``tools``: what a rollout may call (a calculator, Python in the code sandbox, a user's typed function), the
   tool-call format and the error turns a bad call gets;
4. ``data`` (rows in one schema, the built-in tasks, readability filters) and ``generation`` (the vLLM and
   transformers backends, prompt encoding and the prompt stream, the generation server, multi-turn trajectories);
5. ``evaluation`` (held-out accuracy, pass@k, benchmarks, emergence features) and ``plan`` (the memory plan);
6. ``trainer``: GRPO, SFT and reward-model training on one skeleton, with evaluation during RL and the
   reward-hacking monitor;
7. ``recipe``: the R1 recipe's steps as functions (prepare the data, pretrain the tiny base, cold-start traces,
   rejection sampling, the consolidation mix), what the pipeline's stage tasks call;
8. ``train``: ``python -m grpo_core.train CONFIG.yaml``, GRPO from a YAML file without the pipeline.
"""
