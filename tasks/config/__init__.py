"""The pipeline's configuration: ``PipelineConfig`` and ``load_config`` (``pipeline.py``), built from the stage
table (``stages.py``); the sections only the pipeline has (``sections.py``); the YAML reader, relative paths and
length limits; what a training stage hands its trainer (``training_spec.py``), the memory plan (``plan.py``) and
what of a section a stage's fingerprint holds (``fingerprint_fields.py``)."""
