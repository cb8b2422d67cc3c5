"""Everything that talks to Slurm: the client (`client`) and what its commands print (`parse`), the preflight phase
of validation (`preflight`, with `dependencies`), submitting and following a job to its end (`submit`, `follow`).
"""
