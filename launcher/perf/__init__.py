"""The performance model, pure: what a run costs and whether it fits. The peak memory of a GPU (`memory`), the
memory check and its fixes and `--layout auto` (`fit`), every accepted layout with its step time (`planner`),
the figures the summary and the manifest give (`figures`: parameters, batch, tokens, checkpoints) and a local
dataset's size in tokens (`datasize`).

It reads the resolved run (`launcher.config`) and nanotron's rules (`launcher.nanotron_config`); the job never
imports it.
"""
