"""A Slurm launcher for nanotron training runs: flags -> validated bundle -> submitted, followed job."""
