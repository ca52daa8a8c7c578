"""What runs a stage: the stage context, fingerprint, reuse and commit (``common.py``), training with store
checkpoints (``training.py``) in a child process (``worker.py``, launched by ``launch.py``; other nodes run
``follower.py``), and the reward-hacking monitor's alarms (``monitor.py``)."""
