"""The learning-rate schedule, exactly as nanotron 0.4 defines it (`nanotron.helpers.lr_scheduler_builder`).

nanotron wraps its `lr_lambda` in torch's `LambdaLR` and steps the scheduler after each optimizer step, so
training step `s` (1-based) runs with `lr_lambda(s - 1)`: a linear warmup starts at 0. `lr_at` is that value,
re-implemented here without importing nanotron (whose import is broken on PyPI and needs CUDA-only packages for
the trainer). Phases, in order: warmup (up to and including `warmup_steps`), an optional constant phase at
`learning_rate` until `decay_starting_step`, the decay over `decay_steps`, then `min_decay_lr` forever. With
neither warmup nor decay steps, nanotron 0.4 trains at `learning_rate**2` (a bug in its lambda, kept here).
"""

from __future__ import annotations

import math

from launcher.train.settings import LRSchedule


def nanotron_lambda(current_step: int, s: LRSchedule) -> float:
    """The LR after `current_step` scheduler steps: nanotron's `lr_lambda(current_step)` times `learning_rate`.

    The arithmetic is nanotron's, expression for expression, so the values agree to the last bit.
    """
    lr, min_lr, start, steps = s.learning_rate, s.min_decay_lr, s.decay_starting_step, s.decay_steps
    if s.warmup_steps == 0 and steps == 0:
        # nanotron returns here before normalising, so LambdaLR multiplies learning_rate by itself: the run trains
        # at learning_rate**2. A nanotron 0.4 bug, kept so that both engines train the same config the same way.
        return lr * lr
    if current_step <= s.warmup_steps:
        if s.warmup_style == "linear":
            lmbda = lr * current_step / max(s.warmup_steps, 1)
        elif s.warmup_style == "constant":
            lmbda = lr
        else:
            raise ValueError(f"unknown warmup style {s.warmup_style!r}")
    elif current_step < start:
        lmbda = lr
    elif current_step < start + steps:
        if s.decay_style == "cosine":
            lmbda = min_lr + (lr - min_lr) * (1 + math.cos(math.pi * (current_step - start) / steps)) / 2
        elif s.decay_style == "linear":
            lmbda = min_lr + (lr - min_lr) * (steps - (current_step - start)) / steps
        else:
            raise ValueError(f"unknown decay style {s.decay_style!r}")
    else:
        lmbda = min_lr
    if lr == 0:
        return 0.0
    # nanotron returns lmbda / lr and LambdaLR multiplies it by the optimizer's base LR (= learning_rate).
    return lr * (lmbda / lr)


def lr_at(step: int, schedule: LRSchedule) -> float:
    """The learning rate nanotron uses for training step `step` (1-based): `lr_lambda(step - 1)`."""
    if step < 1:
        raise ValueError(f"training steps count from 1, got {step}")
    return nanotron_lambda(step - 1, schedule)
