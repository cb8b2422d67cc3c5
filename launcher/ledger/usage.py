"""The GPU-hour ledger of runs (launcher.ledger.breakdown), from what Slurm and the job recorded.

Where the cluster keeps accounting, each attempt's start, end and GPUs come from `sacct --duplicates` (a requeue
keeps the job id, each attempt its record; AllocTRES's gres/gpu); elsewhere from the job's own records: the batch
script's start and end lines in the job's log and the GPUs the manifest asked for (`launcher.ledger.attempts`).
Either way the steps come from the job (metrics.jsonl; the checkpoint each attempt resumed from in its log): Slurm
knows no steps. The two sources agree within TOLERANCE (tests/test_accounting.py holds them to it).
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

from launcher import protocol as P
from launcher.bundle import manifest
from launcher.bundle.records import checkpoint_totals
from launcher.errors import LauncherError, SlurmUnavailable
from launcher.evals import report as evals_report
from launcher.ledger import attempts as records
from launcher.ledger import picture
from launcher.ledger.breakdown import COMPLETED, Attempt, Ledger, compute, hours, summary, trained_curve
from launcher.remote import record as remote_record
from launcher.slurm import client
from launcher.slurm.parse import TERMINAL, JobState, SacctRecord

LAG_S, LAG_POLL_S = 15.0, 1.0  # how long to wait for slurmdbd to record an end the controller already knows
SUBMIT_SLACK_S = 120  # sacct records of a job id submitted before its bundle was made are another job's
# The job's records stamp whole seconds, start after Slurm's allocation and end before it is released:
# per attempt, allocated GPU-seconds agree within this many seconds times its GPUs (or 2%, the larger): at load ~9
# a batch script started 3 s per GPU late once (CI's fresh-clone run, 26.05).
TOLERANCE_S, TOLERANCE_FRACTION = 5.0, 0.02


def _created(data: dict) -> float:
    try:
        return datetime.strptime(data["created"], "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except (KeyError, ValueError):
        return 0.0


def _settled(job_id: str, final: JobState | None, created: float) -> list[SacctRecord] | None:
    """sacct's records of the job (this bundle's: not an older job of the same id), once they agree with the
    controller that it ended; None without accounting or when slurmdbd still lags after LAG_S."""
    deadline = time.monotonic() + LAG_S
    while True:
        found = client.accounting_records(job_id)
        if found is None:
            return None
        recs = [r for r in found if r.submit is None or r.submit.timestamp() >= created - SUBMIT_SLACK_S]
        lagging = final is not None and final.terminal and (not recs or recs[-1].state not in TERMINAL)
        if not lagging:
            return recs
        if time.monotonic() > deadline:
            return None
        time.sleep(LAG_POLL_S)


def _from_sacct(recs: list[SacctRecord], seen: dict, final: JobState | None, now: float, gpus: int) -> list[Attempt]:
    """The attempts as sacct records them; `gpus` where AllocTRES names none (a site that does not account
    gres/gpu)."""
    out = []
    for n, r in enumerate([r for r in recs if r.start is not None], start=1):
        assert r.start is not None
        said = seen[n].cause if n in seen else None  # the batch script's own words win over Slurm's REQUEUED
        if r.end is None:
            end, ended = now, "running"
        else:
            end, ended = r.end.timestamp(), said or records.FINAL.get(r.state, "failure")
        if r is recs[-1] and r.state == "COMPLETED":
            ended = COMPLETED
        out.append(Attempt(n, r.start.timestamp(), end, r.gpus or gpus, ended))
    if out and final is not None and not final.terminal and out[-1].ended != "running":
        out[-1] = Attempt(out[-1].number, out[-1].start, now, out[-1].gpus, "running")
    return out


def final_state(run: manifest.Manifest) -> tuple[JobState | None, list[str]]:
    """Slurm's word on the run's job; where the controller cannot be reached, the run's own records' (the end the
    manifest recorded when the run was followed to it, else the job's log's), with what that leaves unconfirmed.
    (None, []) for a job Slurm no longer knows; (None, [...]) where nothing says whether it ended."""
    assert run.job_id is not None
    try:
        return client.job_state(run.job_id), []
    except SlurmUnavailable as e:
        unreachable = f"the Slurm controller cannot be reached ({str(e).splitlines()[0]})"
    notes = [f"{unreachable}: this ledger is the job's own records', and sacct was not asked"]
    ended = run.data.get("ended") or {}
    if ended.get("state"):
        state = JobState(
            run.job_id, str(ended["state"]), "", ended.get("exit_code"), None, ended.get("restarts") or 0, ""
        )
        return state, [*notes, f"the job's end ({state.state}) is the manifest's record, made when the run was "
                       "followed to its end: Slurm did not confirm it now"]  # fmt: skip
    seen = records.read_log(records.read_lines(run.log), run.job_id)
    last = seen[max(seen)] if seen else None
    if last is None or last.end is None:
        return None, [*notes, "the job's log says no end of its last attempt, and nothing recorded one: the "
                      "attempt is counted as running until now (it may have ended)"]  # fmt: skip
    word = "COMPLETED" if last.code == 0 else "FAILED"
    return JobState(run.job_id, word, "", last.code, None, max(len(seen) - 1, 0), ""), [
        *notes, f"the job's end ({word}) is read from its log (its last attempt ended with exit code {last.code}): "
        "Slurm did not confirm it"]  # fmt: skip


def ledgers(
    run: manifest.Manifest, final: JobState | None = None, ask_sacct: bool = True, asked: bool = False
) -> tuple[Ledger | None, Ledger | None]:
    """(from sacct, from the job's records) for a submitted bundle, its manifest in hand; either None where it
    cannot be had (no accounting; a bundle never submitted). `final`: the job's state if the caller has it (else
    asked, unless `asked`: the caller asked, and Slurm no longer knows the job); `ask_sacct`: false where Slurm
    cannot be reached (`final_state`)."""
    found = chains(run, final, ask_sacct, asked)
    save_interval = int(run.flags.get("save_interval") or 0)
    made = {source: compute(own, works, save_interval, source) for source, own, works in found}
    kept = checkpoint_totals(run.bundle_dir / P.CHECKPOINTS_RECORD)  # bytes written and freed (retention's record)
    uploads = remote_record.totals(run.bundle_dir / P.REMOTE_RECORD)  # to and from the bucket (the uploader's)
    for ledger_ in made.values():
        ledger_.checkpoints, ledger_.uploads = kept, uploads
    return made.get("sacct"), made.get("job records")


def chains(
    run: manifest.Manifest, final: JobState | None = None, ask_sacct: bool = True, asked: bool = False
) -> list[tuple[str, list[Attempt], dict]]:
    """The run's attempts and what training did in each, by source: ("sacct", ...) where the cluster keeps
    accounting, then ("job records", ...); none for a bundle never submitted (`ledgers`' arguments)."""
    job_id = run.job_id
    if not job_id:
        return []
    if final is None and ask_sacct and not asked:
        final = client.job_state(job_id)
    flags, now = run.flags, time.time()
    seen = records.read_log(records.read_lines(run.log), job_id)
    metrics = run.metrics
    per_node = int(flags.get("gpus_per_node") or 0)
    gpus = (int(flags.get("nodes") or 1) + int(flags.get("spare_nodes") or 0)) * per_node  # the spares' held too
    ended_state = final.state if final is not None and final.terminal else None
    found = []
    recs = _settled(job_id, final, _created(run.data)) if ask_sacct else None
    if recs:
        acct = records.split(_from_sacct(recs, seen, final, now, gpus), seen, per_node)
        if acct:
            found.append(("sacct", acct, records.works(seen, metrics, records.spans(acct))))
    own = records.split(records.attempts(seen, gpus, ended_state, now), seen, per_node)
    if own:
        found.append(("job records", own, records.works(seen, metrics, records.spans(own))))
    return found


def trained_hours(run: manifest.Manifest) -> list[list[tuple[int, float]]]:
    """The trained GPU-hours the run had spent as it reached each logged step (breakdown.trained_curve: requeues
    and restarts counted, steps done twice paid twice), from sacct where the cluster keeps accounting, else the
    job's records; [] before its first step."""
    final, unconfirmed = final_state(run) if run.job_id else (None, [])
    found = chains(run, final, ask_sacct=not unconfirmed, asked=True)
    return trained_curve(found[0][1], found[0][2]) if found else []


def ledger(run: manifest.Manifest, final: JobState | None = None, keep: bool = True) -> Ledger | None:
    """The run's ledger, from sacct where the cluster keeps accounting, else from the job's records (those alone
    where the controller cannot be reached); recorded in the manifest (`keep`) once the job has ended."""
    return confirmed_ledger(run, final, keep)[0]


def confirmed_ledger(
    run: manifest.Manifest, final: JobState | None = None, keep: bool = True
) -> tuple[Ledger | None, list[str]]:
    """`ledger`, and what of it Slurm could not confirm (the controller unreachable: the job's end read from its
    records). An unconfirmed ledger is not recorded in the manifest: a later look, with Slurm, may say otherwise."""
    unconfirmed: list[str] = []
    asked = final is None and run.job_id is not None
    if asked:
        final, unconfirmed = final_state(run)
    from_sacct, from_records = ledgers(run, final, ask_sacct=not unconfirmed, asked=asked)
    chosen = from_sacct or from_records
    if keep and chosen is not None and not unconfirmed:
        kept(run, chosen)
    return chosen, unconfirmed


def kept(run: manifest.Manifest, found: Ledger) -> None:
    """Record a ledger in the run's manifest once its job has ended (a read-only bundle keeps its manifest)."""
    if all(a.ended != "running" for a in found.attempts):
        try:
            manifest.record_ledger(run, found.record())
        except OSError:
            pass


def agree(a: Ledger, b: Ledger) -> list[str]:
    """Where two ledgers of one run disagree beyond TOLERANCE (per attempt: allocated GPU-seconds; and the same
    attempts, GPUs and steps thrown away); [] when they agree."""
    problems = []
    if [x.number for x in a.attempts] != [y.number for y in b.attempts]:
        return [f"attempts differ: {len(a.attempts)} vs {len(b.attempts)}"]
    for x, y in zip(a.attempts, b.attempts, strict=True):
        allowed = max(TOLERANCE_S * max(x.gpus, y.gpus), TOLERANCE_FRACTION * max(x.allocated, y.allocated))
        if abs(x.allocated - y.allocated) > allowed:
            problems.append(f"attempt {x.number}: {x.allocated:.0f} vs {y.allocated:.0f} GPU-s (allowed {allowed:.0f})")
        if (x.gpus, x.steps_thrown_away) != (y.gpus, y.steps_thrown_away):
            problems.append(f"attempt {x.number}: gpus/steps thrown {x.gpus}/{x.steps_thrown_away} vs "
                            f"{y.gpus}/{y.steps_thrown_away}")  # fmt: skip
    return problems


def bundles_since(configs_path: Path, since: float) -> list[Path]:
    """The submitted bundles under a configs path (`<configs_path>/<run>/<stamp>/manifest.json`) made since."""
    found = []
    for path in sorted(configs_path.glob(f"*/*/{P.MANIFEST}")):
        try:
            run = manifest.load(path)
        except (OSError, ValueError):
            continue
        if run.job_id and _created(run.data) >= since:
            found.append(run.bundle_dir)
    return found


def line(run: manifest.Manifest, final: JobState | None = None) -> str:
    """The run's ledger in one line, for the end summary and `jobs status` (recorded in the manifest once ended)."""
    try:
        found, unconfirmed = confirmed_ledger(run, final)
    except (OSError, ValueError, KeyError, LauncherError) as e:  # a damaged bundle, Slurm not answering
        return f"no ledger: {e}"
    if found is None:
        return "no ledger yet: the job has not started"
    evals = evals_report.ledger_line(run)  # --eval_tasks: the eval jobs' own, never training's
    return (summary(found) + (f" (not confirmed: {unconfirmed[0]})" if unconfirmed else "")
            + (f"; evals: {evals}" if evals else ""))  # fmt: skip


def several(bundles: list[tuple[str, Path]], png: Path | None, title: str) -> list[str]:
    """The ledgers of several runs (label, bundle): a line each, the total, and (`png`) their picture."""
    lines, drawn = [], []
    for label, bundle in bundles:
        try:
            found, unconfirmed = confirmed_ledger(manifest.load(bundle))
        except (OSError, ValueError, KeyError, LauncherError) as e:
            lines.append(f"  {label}: no ledger ({e})")
            continue
        if found is None:
            lines.append(f"  {label}: not started")
            continue
        drawn.append((label, found))
        lines.append(f"  {label}: {summary(found)}" + (f" (not confirmed: {unconfirmed[0]})" if unconfirmed else ""))
    total = sum(x.allocated for _, x in drawn)
    lost = sum(x.lost for _, x in drawn)
    lines.append(f"  total: {hours(total)} GPU-hours over {len(drawn)} run(s), {hours(lost)} lost")
    if png is not None and drawn and (drawing := picture.draw(drawn, png, title)):
        lines.append(f"  gpu-hours picture  {drawing}")
    return lines
