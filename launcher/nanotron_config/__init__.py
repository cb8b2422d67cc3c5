"""nanotron's config as the launcher writes it and the job reads it: the flag -> YAML table (`schema`), the two
dialects (`dialect`), a mixture's and the data stages' forms (`mixture`, `stages`), the model's shape (`shape`) and
nanotron's layout rules (`layout`), what a local data path is (`datasource`), the base YAML and the presets
(`presets`), and the GPU table the job's MFU divides by (`gpus`).

The training job's only door into launcher code besides the ground floor (`protocol`, `atomic`, `errors`,
`problems`): both sides read the same rules, so the launcher and the trainer cannot disagree. Nothing here knows
the command line, Slurm or the job's engines (import-linter holds it so, pyproject.toml).
"""
