"""Everything that talks to Slurm: the client (`client`) and what its commands print (`parse`), the cluster's facts
asked once before resolution (`facts`), the cluster's checks before the queue (`checks`, with `awaited_jobs` and
`one_writer`), following a job to its end (`follow`), and why it ended so (`triage`, which reads the log through
`launcher.node.failures`).
"""
