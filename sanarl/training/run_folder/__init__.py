"""A run's folder: creating folders with the key that chose them in a refusal (`folders.py`), what a run needs before
its loop (`setup.py`: precision, optimizer, LR warm-up, a writable run directory), one run per folder
(`run_lock.py`), the run's own files written safely (`run_files.py`: config.toml, metrics.jsonl, resumes.jsonl),
atomic checksummed checkpoints on disk (`checkpoint_store.py`), when a checkpoint is due, writing it and resuming
from it (`run_checkpoints.py`), which checkpoint a run resumes from (`resume.py`) and the final export
(`exports.py`)."""
