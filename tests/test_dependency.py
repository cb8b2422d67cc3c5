"""--dependency: Slurm's syntax, and the jobs it names judged by their states before submitting (pure here; the
end-to-end tests run the same against the real local cluster)."""

from __future__ import annotations

import pytest
from launcher_helpers import fixed_paths, spec_for

from launcher import app, dependency, sbatch, slurm
from launcher.errors import SlurmUnavailable
from launcher.slurm import JobState
from launcher.validate import validate

STATES = {"1": "RUNNING", "2": "COMPLETED", "3": "FAILED", "4": "PENDING", "5": "CANCELLED"}


def lookup(job_id: str) -> JobState | None:
    state = STATES.get(job_id)
    return None if state is None else JobState(job_id, state, "None", 0, 0, 0, "node1")


@pytest.mark.parametrize(
    "text",
    ["afterok:1", "afterany:1:2", "after:1+10", "afternotok:12_3", "singleton", "afterok:1,singleton",
     "afterok:1?afternotok:2", "aftercorr:7"],
)  # fmt: skip
def test_slurm_syntax_is_accepted(text: str) -> None:
    assert dependency.parse(text) is not None
    spec, problems = spec_for("--dependency", text, "--dataset", "none")
    assert problems + validate(spec) == []


@pytest.mark.parametrize(
    "text",
    ["afterok 1", "afterok:", "afterok:abc", "12", "afterok:1,", "afterok:1,afterany:2?after:3", "before:1",
     "afterok:1;touch x", "afterok:1\n#SBATCH --x"],
)  # fmt: skip
def test_anything_else_is_a_problem_naming_the_flag(text: str) -> None:
    spec, problems = spec_for("--dependency", text, "--dataset", "none")
    (problem,) = problems + validate(spec)
    assert problem.flag == "dependency" and "afterok:12345" in problem.fix


def test_parse_keeps_kinds_and_ids() -> None:
    assert dependency.parse("afterok:1:2_3,after:4+5") == (
        [dependency.Item("afterok", ("1", "2_3")), dependency.Item("after", ("4",))],
        False,
    )
    assert dependency.parse("singleton?afterany:9") == (
        [dependency.Item("singleton", ()), dependency.Item("afterany", ("9",))],
        True,
    )


@pytest.mark.parametrize(
    "text,expected",
    [
        ("afterok:1:2:4", []),  # running, completed, pending: can still hold
        ("afterany:3:5", []),
        ("afternotok:3", []),
        ("singleton", []),
        ("afterok:3", ["job 3 ended FAILED, so afterok can never be met"]),
        ("afterok:5", ["job 5 ended CANCELLED, so afterok can never be met"]),
        ("afternotok:2", ["job 2 ended COMPLETED, so afternotok can never be met"]),
        ("afterok:1,afterok:3", ["job 3 ended FAILED"]),  # ',': every item must hold
        ("afterok:1?afterok:3", []),  # '?': one is enough
        ("afterok:1:3?afterok:5", []),  # '?': each job id is an alternative of its own; job 1 still runs
        ("afterok:3:1?afternotok:2", []),
        ("afterok:3:5?afternotok:2", ["job 3 ended FAILED, so afterok can never be met; job 5 ended CANCELLED"]),
        ("afterok:3?singleton", []),  # singleton can still be met
        ("afterok:1:3,afterany:5", ["job 3 ended FAILED"]),  # ',': every job must
        ("afterok:3?afterok:99", ["Slurm does not know job 99"]),  # which Slurm counts as met: it starts at once
        ("afterok:3?afternotok:2", ["job 3 ended FAILED, so afterok can never be met; job 2 ended COMPLETED"]),
        ("afterok:99", ["Slurm does not know job 99; it would count it as done and start this run at once"]),
        ("afterok:1?afterok:99", ["Slurm does not know job 99"]),  # an unknown id is a typo even among others
    ],
)
def test_job_states(text: str, expected: list[str]) -> None:
    problems = dependency.state_problems(text, lookup)
    assert len(problems) == len(expected)
    for problem, words in zip(problems, expected, strict=True):
        assert problem.flag == "dependency" and words in problem.message


def test_script_waits_and_asks_slurm_to_cancel_an_impossible_wait() -> None:
    spec, _ = spec_for("--dependency", "afterok:1:2", "--dataset", "none")
    text = sbatch.render(spec, fixed_paths("t"))
    assert "#SBATCH --dependency=afterok:1:2\n#SBATCH --kill-on-invalid-dep=yes\n" in text
    spec, _ = spec_for("--dataset", "none")
    assert "--dependency" not in sbatch.render(spec, fixed_paths("t"))


def test_jobs_are_looked_up_whatever_else_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm, "job_state", lookup)
    _, problems = app.check(["--run_name", "t", "--dataset", "none", "--email", "nobody", "--dependency", "afterok:3"])
    assert [p.flag for p in problems] == ["email", "dependency"]  # every mistake at once
    assert "job 3 ended FAILED" in problems[1].message


@pytest.mark.parametrize("flags", [["--dependency", "afterok 3"], ["--dependency", "afterok:3", "--dry_run"]])
def test_no_lookup_for_a_dependency_that_does_not_parse_or_a_dry_run(
    flags: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(job_id: str) -> None:
        raise AssertionError(f"looked up {job_id}")

    monkeypatch.setattr(slurm, "job_state", refuse)
    _, problems = app.check(["--run_name", "t", "--dataset", "none", *flags])
    assert [p.flag for p in problems] == (["dependency"] if "--dry_run" not in flags else [])


def test_slurm_down_is_said_beside_the_other_problems(monkeypatch: pytest.MonkeyPatch) -> None:
    def down(job_id: str) -> None:
        raise SlurmUnavailable("scontrol cannot reach the Slurm controller")

    monkeypatch.setattr(slurm, "job_state", down)
    argv = ["--run_name", "t", "--dataset", "none", "--dependency", "afterok:3"]
    with pytest.raises(SlurmUnavailable):  # nothing else wrong: the error it always was
        app.check(argv)
    _, problems = app.check([*argv, "--email", "nobody"])
    assert [p.flag for p in problems] == ["email", "dependency"]
    assert "cannot reach the Slurm controller" in problems[1].message
