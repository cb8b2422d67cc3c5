"""--dependency: Slurm's syntax, and the jobs it names judged by their states before submitting (pure here; the
end-to-end tests run the same against the real local cluster)."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from launcher_helpers import fixed_paths, spec_for

from launcher.bundle import render
from launcher.config import dependency_syntax
from launcher.config.validate import validate
from launcher.errors import SlurmUnavailable
from launcher.runs import launch
from launcher.slurm import awaited_jobs, client
from launcher.slurm.parse import JobState

STATES = {"1": "RUNNING", "2": "COMPLETED", "3": "FAILED", "4": "PENDING", "5": "CANCELLED", "6": "SPECIAL_EXIT"}
ARRAYS = {  # one record a task, as scontrol shows a whole array
    "7": ["COMPLETED", "FAILED", "COMPLETED"],
    "8": ["COMPLETED", "COMPLETED"],
    "9": ["FAILED", "RUNNING", "PENDING"],
    "7_1": ["FAILED"],
    "7_2": ["COMPLETED"],
}


def lookup(job_id: str) -> list[JobState]:
    states = ARRAYS.get(job_id, [STATES[job_id]] if job_id in STATES else [])
    return [JobState(job_id, state, "None", 0, 0, 0, "node1") for state in states]


# What Slurm 22.05's slurmctld accepts (update_job_dependency), tried on the local cluster with sbatch --test-only;
# tests/test_slurm_e2e.py asks the real cluster about every one of these lists again.
ACCEPTED = [
    "afterok:1", "afterany:1:2", "after:1+10", "afternotok:12_3", "singleton", "afterok:1,singleton",
    "afterok:1?afternotok:2", "aftercorr:7", "afterburstbuffer:7",
    "12", "12,13", "afterok:1,12", "singleton,12", "12,singleton", "afterok:1?12",  # a bare id: afterany
    "afterok:1_*", "afterok:1_3", "afterok:1_0", "after:1_*+5", "afterok:1:2_*",  # array tasks, whole arrays
    "AFTEROK:1", "AfterAny:1:2", "SINGLETON", "afterok:01", "after:1+05",
]  # fmt: skip
REFUSED = [
    "afterok 1", "afterok:", "afterok:abc", "afterok:1,", "before:1", "singleton:1", "afterok:1::2",
    "afterok:1;touch x", "afterok:1\n#SBATCH --x", "afterok:1 ", " afterok:1",
    "afterok:0", "after:1+0", "afterok:1+", "afterok:1__2", "12+5", "12:13",
    "12,afterok:1", "12?13", "afterok:1?12?13", "12?afterok:1",  # Slurm reads a bare id only where no kind follows
    "afterok:\u0661\u0662", "\u0661\u0662", "afterok:1_\u0663",  # Arabic-Indic digits
    "afterO\u212a:1", "\u017fingleton",  # KELVIN SIGN, LONG S: letters only Unicode case folding matches
]  # fmt: skip
# Slurm takes these, the launcher does not: mixed separators (man sbatch: "only one separator may be used"), task
# ranges, a sign before an id, an empty task id (Slurm reads task 0), and 0 or nothing, which Slurm reads as no
# dependency (leave the flag out for that). Slurm reads `+9999999` as job 9999999: an id no test cluster reaches (its
# job ids start in a window of 1,000 below 12,001), where a small one may be a real job that makes Slurm take it.
STRICTER = ["afterok:1,afterany:2?after:3", "afterok:1_[1-2]", "afterok:+9999999", "afterok:1_", "0", ""]


@pytest.mark.parametrize("text", ACCEPTED)
def test_slurm_syntax_is_accepted(text: str) -> None:
    assert dependency_syntax.parse(text) is not None
    spec, problems = spec_for("--dependency", text, "--dataset", "none")
    assert problems + validate(spec) == []


@pytest.mark.parametrize("text", REFUSED + STRICTER)
def test_anything_else_is_a_problem_naming_the_flag(text: str) -> None:
    parsed, (problem,) = dependency_syntax.read(text)
    assert parsed is None and problem.flag == "dependency" and "afterok:12345" in problem.fix
    spec, problems = spec_for("--dependency", text, "--dataset", "none")
    assert problems + validate(spec) == [problem]


@pytest.mark.parametrize(
    "text,words",
    [
        ("afterok:1,afterany:2?after:3", "one kind of separator"),
        ("afterok:1_[1-2]", "name the tasks, afterok:12345_1:12345_2"),
    ],
)
def test_near_misses_say_what_to_change(text: str, words: str) -> None:
    _, (problem,) = dependency_syntax.read(text)
    assert words in problem.message


@settings(max_examples=50, suppress_health_check=[HealthCheck.too_slow])  # ~50 ms an example from this regex
@given(st.from_regex(dependency_syntax.SYNTAX, fullmatch=True))
def test_whatever_is_accepted_is_ascii_and_parses_to_kinds_and_job_ids(text: str) -> None:
    assert re.fullmatch(r"[A-Za-z0-9:_*+?,]+", text)  # nothing a shell or an #SBATCH line would read otherwise
    parsed = dependency_syntax.parse(text)
    assert parsed is not None
    items, any_of = parsed.items, parsed.any_of
    assert any_of == ("?" in text) and not ("?" in text and "," in text)
    for item in items:
        assert item.kind in (*dependency_syntax.KINDS, "singleton") and (item.kind == "singleton") == (not item.job_ids)
        assert all(re.fullmatch(r"0*[1-9][0-9]*(_([0-9]+|\*))?", job_id) for job_id in item.job_ids)


def test_parse_keeps_kinds_and_ids() -> None:
    Item, Dependency = dependency_syntax.Item, dependency_syntax.Dependency
    parsed = dependency_syntax.parse("afterok:1:2_3,after:4+5")
    assert parsed == Dependency((Item("afterok", ("1", "2_3")), Item("after", ("4",))), False)
    assert parsed.job_ids == ["1", "2_3", "4"]
    parsed = dependency_syntax.parse("singleton?afterany:9")
    assert parsed == Dependency((Item("singleton", ()), Item("afterany", ("9",))), True)
    parsed = dependency_syntax.parse("AfterOK:1_*,7,SINGLETON")  # kinds as Slurm names them; a bare id: afterany
    assert parsed == Dependency((Item("afterok", ("1_*",)), Item("afterany", ("7",)), Item("singleton", ())), False)
    assert dependency_syntax.read(None) == (None, [])
    assert dependency_syntax.read("7") == (Dependency((Item("afterany", ("7",)),), False), [])


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
        ("aftercorr:3", ["job 3 ended FAILED, so aftercorr can never be met"]),  # the run is no array: as afterok
        ("aftercorr:5", ["job 5 ended CANCELLED, so aftercorr can never be met"]),
        ("aftercorr:2:1", []),
        ("after:3,afterany:5,afterburstbuffer:3", []),  # met by any end
        ("afterok:6", []),  # SPECIAL_EXIT: requeued and held, Slurm still waits for it
        ("afternotok:6", []),
        ("afterok:1,afterok:3", ["job 3 ended FAILED"]),  # ',': every item must hold
        ("afterok:1?afterok:3", []),  # '?': one is enough
        ("afterok:1:3?afterok:5", []),  # '?': each job id is an alternative of its own; job 1 still runs
        ("afterok:3:1?afternotok:2", []),
        ("afterok:3:5?afternotok:2", ["job 3 ended FAILED, so afterok can never be met; job 5 ended CANCELLED"]),
        ("afterok:3?singleton", []),  # singleton can still be met
        ("afterok:1:3,afterany:5", ["job 3 ended FAILED"]),  # ',': every job must
        ("afterok:3?afterok:99", ["Slurm does not know job 99"]),  # which Slurm counts as met: it starts at once
        ("afterok:99,afternotok:99", ["Slurm does not know job 99"]),  # said once
        # a whole array, by its id or id_*: Slurm judges it once every task ended
        ("afterok:7", ["job 7 (an array) ended FAILED in 1 of its 3 tasks, so afterok can never be met"]),
        ("afterok:7_*", ["job 7_* (an array) ended FAILED in 1 of its 3 tasks"]),
        ("aftercorr:7", ["job 7 (an array) ended FAILED in 1 of its 3 tasks, so aftercorr can never be met"]),
        ("afternotok:7", []),  # one task failed: met (the first record alone, COMPLETED, said never)
        ("afternotok:8_*", ["job 8_* (an array) ended COMPLETED in 2 of its 2 tasks, so afternotok can never be"]),
        ("afterok:8,afterok:9_*", []),  # 9 has tasks still to run
        ("afterok:7_1", ["job 7_1 ended FAILED"]),  # one task
        ("afterok:7_2", []),
        ("afterok:7_5", ["Slurm does not know job 7_5"]),
        ("afterok:3?afternotok:2", ["job 3 ended FAILED, so afterok can never be met; job 2 ended COMPLETED"]),
        # what Slurm would do with an unknown job depends on the kind and the release: the launcher refuses it
        ("afterok:99", ["Slurm does not know job 99; Slurm 23.02 and later refuse afterok on it at submission"]),
        ("afterok:99", ["at submission; 22.05 would count it as done and start this run at once"]),
        ("afterany:99", ["Slurm does not know job 99; it would count it as done and start this run at once"]),
        ("99", ["Slurm does not know job 99; it would count"]),  # a bare id is looked up too (afterany)
        ("3", []),  # afterany
        ("AFTEROK:3", ["job 3 ended FAILED, so afterok can never be met"]),
        ("afterok:3_*", ["job 3_* ended FAILED, so afterok can never be met"]),  # named as written
        ("afterok:1?afterok:99", ["Slurm does not know job 99"]),  # an unknown id is a typo even among others
    ],
)
def test_job_states(text: str, expected: list[str]) -> None:
    dependency = dependency_syntax.parse(text)
    assert dependency is not None
    problems = awaited_jobs.state_problems(dependency, lookup)
    assert len(problems) == len(expected)
    for problem, words in zip(problems, expected, strict=True):
        assert problem.flag == "dependency" and words in problem.message


def test_script_waits_and_asks_slurm_to_cancel_an_impossible_wait() -> None:
    spec, _ = spec_for("--dependency", "afterok:1:2", "--dataset", "none")
    text = render.sbatch_script(spec, fixed_paths("t"))
    assert "#SBATCH --dependency=afterok:1:2\n#SBATCH --kill-on-invalid-dep=yes\n" in text
    spec, _ = spec_for("--dataset", "none")
    assert "#SBATCH --dependency" not in render.sbatch_script(spec, fixed_paths("t"))


def test_jobs_are_looked_up_whatever_else_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client, "job_states", lookup)
    _, problems = launch.check(
        ["--run_name", "t", "--dataset", "none", "--email", "nobody", "--dependency", "afterok:3"]
    )
    assert [p.flag for p in problems] == ["email", "dependency"]  # every mistake at once
    assert "job 3 ended FAILED" in problems[1].message


@pytest.mark.parametrize("flags", [["--dependency", "afterok 3"], ["--dependency", "afterok:3", "--dry_run"]])
def test_no_lookup_for_a_dependency_that_does_not_parse_or_a_dry_run(
    flags: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(job_id: str) -> None:
        raise AssertionError(f"looked up {job_id}")

    monkeypatch.setattr(client, "job_states", refuse)
    _, problems = launch.check(["--run_name", "t", "--dataset", "none", *flags])
    assert [p.flag for p in problems] == (["dependency"] if "--dry_run" not in flags else [])


def test_slurm_down_is_said_beside_the_other_problems(monkeypatch: pytest.MonkeyPatch) -> None:
    def down(job_id: str) -> None:
        raise SlurmUnavailable("scontrol cannot reach the Slurm controller")

    monkeypatch.setattr(client, "job_states", down)
    argv = ["--run_name", "t", "--dataset", "none", "--dependency", "afterok:3"]
    with pytest.raises(SlurmUnavailable):  # nothing else wrong: the error it always was
        launch.check(argv)
    _, problems = launch.check([*argv, "--email", "nobody"])
    assert [p.flag for p in problems] == ["email", "dependency"]
    assert "cannot reach the Slurm controller" in problems[1].message
