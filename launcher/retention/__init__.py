"""Checkpoint retention (--keep_last, --keep_every; docs/checkpoints.md), in one package: the flags' checks before the
queue (`checks`), the rules judged purely over the checkpoints folder (`rules`), the job's purge after each complete
checkpoint (`purge`, its supervisor's side), and `python -m launcher.jobs checkpoints` (`report`). The job's side
(`rules`, `purge`) stands on the standard library: an import contract per module holds it so (pyproject.toml)."""
