"""The node helpers: what the batch and node scripts run with the job's Python before and beside training, as
modules (`python -m launcher.node.nodecheck`, `python -m launcher.node.watchdog`; the templates name them),
and what a job's log says went wrong (`failures`: the launcher's triage reads it too).

Standard library and `launcher.protocol` only (import-linter holds it so): they run before anything heavy is
imported, in whatever Python the job has, with the project on PYTHONPATH.
"""
