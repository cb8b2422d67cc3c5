"""Where a run's GPU-hours went: its attempts read from the job's log and records (`attempts`), the breakdown into
trained, lost and to what (`breakdown`, pure), the ledger of a run from sacct or the job's records (`usage`), the
picture of several runs (`picture`) and `jobs ledger` (`command`: docs/ledger.md)."""
