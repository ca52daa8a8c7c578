"""The store and its bookkeeping: object I/O and layout (``store.py``), what a committed output records
(``manifest.py``), one writer per run (``lease.py``, ``owner.py``) and its fence on every commit (``fence.py``,
``commit.py``), the run's current outputs (``lineage.py``), scratch folders (``scratch.py``), the time bound of an
operation (``deadline.py``) and the content of a stage's input files (``data_inputs.py``; the hashes of files and
folders, read once per change: ``file_hashes.py``)."""
