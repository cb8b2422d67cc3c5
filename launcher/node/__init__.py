"""The job's side on the nodes: its settings (`job`: the bundle's job.json), its supervisor (`supervisor`: what the
batch script execs), the node step every node runs (`step`: `python -m launcher.node.step`, started by srun), and the
helpers they run with the job's Python before and beside training (`nodecheck`, `watchdog`, `restart`), and what a
job's log says went wrong (`failures`: the launcher's triage reads it too).

Standard library and the ground floor only (import-linter holds it so): they run before anything heavy is imported,
in whatever Python the job has, with the project on PYTHONPATH.
"""
