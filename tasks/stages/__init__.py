"""The stage bodies, one module per body (``tasks/config/stages.py`` names each entry's): what a stage reads, which
``grpo_core`` function it calls, what it commits. A body reads its stage's name, kind and section from its table entry,
so one body may serve several entries (``rl.py``: every RL stage); no body module imports another."""
