"""The run's configuration, pure: flags, presets and `--config`, resolved into a spec; nanotron's schema; every
check that needs nothing but the spec and local files; figures about the run (parameters, batch, checkpoints).

Nothing here talks to Slurm or writes a file. The training job imports only `layout`, `schema`, `datasource` and
`problems` from here (checked by import-linter, see pyproject.toml).
"""
