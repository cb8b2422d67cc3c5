"""The job's supervisor: what the batch script execs with the bundle's job.json, the job around its node step, as
typed state, tables and pure decisions, one orchestrator, and the effects behind one interface. docs/supervisor.md:
the state machine.

- `state`: the words (notices, verdicts, phases, what follows a step), the attempt's state, Slurm's word on the job.
- `table`: how a step ended (notice x training's word x srun's status -> verdict), as data.
- `decide`: every decision as a pure function: a notice during each phase, after a step, after the restart
  decision, at the attempt's end.
- `attempt`: the orchestrator, one attempt from the lock to the exit code.
- `effects`: the world (Slurm's commands, the node step, the log, the watchdog), behind `Effects`; `records`: the
  lock and the bundle's records.

Standard library and the node helpers only (the node helpers' import contract).
"""
