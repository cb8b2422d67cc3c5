"""The command line and its checks, pure: the flags (`flags`, parsed by `cli`), resolved with presets and
`--config` into a `RunSpec` (`resolve`, `spec`: each value read once), and every check that needs nothing but the
spec and local files (`validate` and its helpers).

Nothing here talks to Slurm or writes a file; the job never imports it (it reads nanotron's config through
`launcher.nanotron_config`). import-linter holds both (pyproject.toml).
"""
