"""The pipeline's stage tasks and what they stand on: Prefect tasks that fetch inputs from the store, call
``grpo_core`` on local paths, and commit outputs.

Sub-packages by floor, bottom up; each imports only its own floor's package and the floors below, and ``grpo_core``
(``tests/test_layers.py`` checks it):

1. ``storage``: the object store (every fsspec call and the path layout), manifests and ``StageRef``, the run's
   lease, lineage and scratch folders, the fingerprint of a stage's input files;
2. ``config``: the pipeline config read from YAML, the stage table (``config/stages.py``), the trainer hand-off
   (``TrainingSpec``) and the memory plan;
3. ``runner``: what runs a stage: its context, fingerprint and commit (``runner/common.py``), the Prefect progress
   and alarms, the training child process, its launcher and the nodes that follow node 0;
4. ``stages``: one module per stage body, the folder to open to see what a stage does;
5. ``check``: ``r1 check``, a config run end to end in miniature.
"""
