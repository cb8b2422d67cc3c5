"""The LR schedule: hand-computed values for every phase, and nanotron 0.4's own lambda where it imports."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.train.schedule import lr_at
from launcher.train.settings import LRSchedule


def sched(**kw: object) -> LRSchedule:
    base = dict(
        learning_rate=1e-3,
        min_decay_lr=1e-4,
        warmup_steps=10,
        warmup_style="linear",
        decay_style="cosine",
        decay_steps=90,
        decay_starting_step=10,
    )
    return LRSchedule(**{**base, **kw})  # type: ignore[arg-type]


def test_linear_warmup_starts_at_zero_and_reaches_the_peak() -> None:
    s = sched()
    assert lr_at(1, s) == 0.0  # training step 1 runs with lambda(0)
    assert lr_at(2, s) == pytest.approx(1e-4)
    assert lr_at(6, s) == pytest.approx(5e-4)
    assert lr_at(11, s) == pytest.approx(1e-3)  # lambda(10): the last warmup value


def test_cosine_decay() -> None:
    s = sched()
    assert lr_at(12, s) == pytest.approx(1e-4 + 9e-4 * (1 + math.cos(math.pi / 90)) / 2)
    assert lr_at(56, s) == pytest.approx(1e-4 + 9e-4 * 0.5)  # lambda(55): halfway through the decay
    assert lr_at(100, s) == pytest.approx(1e-4 + 9e-4 * (1 + math.cos(math.pi * 89 / 90)) / 2)
    assert lr_at(101, s) == pytest.approx(1e-4)  # decay over: min_decay_lr
    assert lr_at(5000, s) == pytest.approx(1e-4)


def test_linear_decay() -> None:
    s = sched(decay_style="linear")
    assert lr_at(12, s) == pytest.approx(1e-4 + 9e-4 * 89 / 90)
    assert lr_at(56, s) == pytest.approx(5.5e-4)
    assert lr_at(101, s) == pytest.approx(1e-4)


def test_constant_warmup_and_constant_phase_before_decay() -> None:
    s = sched(warmup_style="constant", decay_starting_step=20, decay_steps=10, decay_style="linear")
    assert [lr_at(k, s) for k in (1, 5, 11)] == [1e-3] * 3  # constant warmup
    assert lr_at(15, s) == 1e-3 and lr_at(21, s) == pytest.approx(1e-3)  # constant until decay_starting_step
    assert lr_at(26, s) == pytest.approx(1e-4 + 9e-4 * 5 / 10)
    assert lr_at(31, s) == pytest.approx(1e-4)


def test_no_warmup_no_decay_is_constant_at_nanotrons_squared_lr() -> None:
    s = sched(warmup_steps=0, decay_steps=0, decay_starting_step=0)
    assert {lr_at(k, s) for k in range(1, 50)} == {1e-3 * 1e-3}  # nanotron 0.4's un-normalised early return


def test_steps_count_from_one() -> None:
    with pytest.raises(ValueError):
        lr_at(0, sched())


schedules = st.builds(
    LRSchedule,
    learning_rate=st.floats(1e-6, 1.0),
    min_decay_lr=st.floats(0.0, 1e-6),
    warmup_steps=st.integers(0, 30),
    warmup_style=st.sampled_from(["linear", "constant"]),
    decay_style=st.sampled_from(["linear", "cosine"]),
    decay_steps=st.integers(0, 60),
    decay_starting_step=st.integers(0, 40),
)


@settings(max_examples=150, deadline=None)
@given(s=schedules)
def test_matches_nanotron_lambdalr_bit_for_bit(s: LRSchedule) -> None:
    """nanotron's own lr_scheduler_builder, driven as its trainer drives it (step after each optimizer step)."""
    import torch  # dependencies of the project: a missing one fails here, never skips

    from launcher.train.nanotron_engine import compat as nanotron_compat

    nanotron_compat.apply()
    import nanotron.config as config
    import nanotron.helpers as helpers

    args = config.LRSchedulerArgs(
        learning_rate=s.learning_rate,
        lr_warmup_steps=s.warmup_steps,
        lr_warmup_style=s.warmup_style,
        lr_decay_style=s.decay_style,
        lr_decay_steps=s.decay_steps,
        lr_decay_starting_step=s.decay_starting_step,
        min_decay_lr=s.min_decay_lr,
    )
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=s.learning_rate)
    optimizer.get_base_optimizer = lambda: optimizer  # nanotron's optimizer wrappers expose the torch optimizer so
    scheduler = helpers.lr_scheduler_builder(optimizer, args, total_training_steps=100)
    for step in range(1, 101):
        assert lr_at(step, s) == optimizer.param_groups[0]["lr"], f"step {step}"
        optimizer.step()
        scheduler.step()


@pytest.mark.parametrize(
    ("train_steps", "warmup", "decay_start", "decay_steps", "style"),
    [(100, 10, 30, None, "cosine"), (100, 10, 30, None, "linear"), (100, 10, None, None, "cosine"),
     (100, 0, 30, None, "linear"), (100, 10, 30, 40, "cosine"), (60, 5, 80, None, "linear")],
)  # fmt: skip
def test_a_config_file_schedules_as_nanotron_parses_and_schedules_it(
    train_steps: int, warmup: int, decay_start: int | None, decay_steps: int | None, style: str
) -> None:
    """The whole way: the config dict through nanotron's own get_config_from_dict (whose Config.__post_init__ fills
    a null lr_decay_steps with train_steps - warmup) and its lr_scheduler_builder, against schedule.py's LR from
    the same dict through launcher.train.settings, at every step. (T=100, W=10, S=30 once differed at 69 steps.)"""
    import copy

    import torch
    import yaml
    from conftest import BASE_CONFIG

    from launcher.train.nanotron_engine import compat as nanotron_compat
    from launcher.train.settings import to_train_config

    nanotron_compat.apply()
    import nanotron.config as config
    import nanotron.helpers as helpers

    with open(BASE_CONFIG, encoding="utf-8") as f:
        tree = yaml.safe_load(f)
    tree["tokens"]["train_steps"] = train_steps
    tree["optimizer"]["learning_rate_scheduler"].update(
        learning_rate=3e-4, min_decay_lr=3e-5, lr_warmup_steps=warmup, lr_warmup_style="linear",
        lr_decay_style=style, lr_decay_starting_step=decay_start, lr_decay_steps=decay_steps,
    )  # fmt: skip
    ours = to_train_config(copy.deepcopy(tree)).lr
    parsed = config.get_config_from_dict(copy.deepcopy(tree))
    optimizer = torch.optim.SGD(
        [torch.nn.Parameter(torch.zeros(1))], lr=parsed.optimizer.learning_rate_scheduler.learning_rate
    )
    optimizer.get_base_optimizer = lambda: optimizer  # what nanotron's optimizer wrappers expose
    scheduler = helpers.lr_scheduler_builder(
        optimizer, parsed.optimizer.learning_rate_scheduler, total_training_steps=parsed.tokens.train_steps
    )
    for step in range(1, train_steps + 1):
        assert lr_at(step, ours) == optimizer.param_groups[0]["lr"], f"step {step}"
        optimizer.step()
        scheduler.step()
