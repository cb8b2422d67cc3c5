"""`python -m launcher.jobs` (`slurm-launcher-jobs`): submitted runs and sweeps, later, from any shell: their status,
following them again, cancelling them, their GPU-hours, running one again, comparing two, exporting a checkpoint
(`command`: docs/running.md)."""

from launcher.jobs.command import bundle_of, main

__all__ = ["bundle_of", "main"]
