"""Downstream evaluation of a run's checkpoints with lm-eval (--eval_tasks, docs/evals.md).

The launcher's side: `checks` (before the queue: the tasks, their YAMLs and data as the job's Python sees them, the
eval partition), `report` (`python -m launcher.jobs evals`: the table and the picture; what --show_logs, --rank_by
and `jobs diff` read). The job's side (run with the job's Python, never imported by the launcher): `tasks` (what
that Python's lm-eval makes of the tasks, standard library and its lm-eval only) and `job` (`python -m
launcher.evals.evaljob BUNDLE STEP`, from the bundle's eval.sbatch: export, lm-eval, the held-out loss, the results).
The supervisor submits the eval jobs: launcher/node/evals.py.
"""
