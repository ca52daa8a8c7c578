"""The trainers: GRPO (``loop.train_grpo(config, model_path, train_rows, output_dir)``; its loss in ``loss.py``,
log-probs in ``logprobs.py``, rollouts, mixtures and the update beside them, evaluation during RL in
``during_rl.py`` and the reward-hacking monitor in ``monitor.py``), SFT (``sft.py``) and the Bradley-Terry reward
model (``reward_model.py``), all on one training skeleton (``skeleton.py``: optimiser, checkpoints, distributed setup,
FSDP, logging).

This file imports nothing: ``from grpo_core.trainer.loop import train_grpo`` loads what GRPO needs and no more."""
