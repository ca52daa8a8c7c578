"""The stage bodies, one module per stage of the table (``tasks/config/stages.py``): what each stage reads, which
``grpo_core`` function it calls, what it commits."""
