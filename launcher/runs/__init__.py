"""Runs, launched and followed: the launch pipeline (`launch`: flags -> facts -> resolved -> checked -> rendered ->
Slurm's verdict -> written -> submitted), a bundle submitted and followed to its end (`submission`), a grid of runs
(`sweep`) and a run again from its bundle (`rerun`)."""
