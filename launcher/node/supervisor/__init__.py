"""The job's supervisor (issue 38): what the batch script (launcher/bundle/templates/sbatch.sh.j2) execs, the job
around its node step, as typed state, tables and pure decisions, with the effects (srun, scontrol, the lock, the
records, the `[launcher ...]` lines) behind one small interface. docs/supervisor.md: the state machine.

- `state`: the words (notices, verdicts, phases) and the attempt's state, one dataclass.
- `table`: how a step ended (notice x training's word x srun's status -> verdict), as data.
- `decide`: every decision as a pure function: a notice during each phase, after a step, after the restart
  decision, at the attempt's end.
- `effects`: the world (Slurm's commands, files, the log), and the node step as a real child process.

Standard library and `launcher.protocol` only, like every node helper (the node helpers' import contract).
"""
