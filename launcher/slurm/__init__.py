"""Everything that talks to Slurm: the client (`client`) and what its commands print (`parse`), the preflight phase
of validation (`preflight`, with `awaited_jobs` and `one_writer`), following a job to its end (`follow`), and why
it ended so (`triage`, which reads the log through `launcher.node.failures`).
"""
