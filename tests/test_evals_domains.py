"""--eval_heldout NAME=SOURCE[,NAME=SOURCE...]: held-out domains read (launcher/nanotron_config/nanoset.py), each
source checked as one source is, its problems naming its domain; names of their own, one tail at most, a bare source
alone (named "heldout"). The loss per domain against a by-hand computation: tests/test_evals_job.py."""

from __future__ import annotations

from pathlib import Path

from launcher_helpers import spec_for

from launcher.config import validate
from launcher.nanotron_config import nanoset


def problems_of(*flags: str, demo) -> dict[str, str]:
    """flag -> every problem of it, joined."""
    data = ("--dataset", str(demo.dataset), "--tokenizer", str(demo.tokenizer))
    spec, problems = spec_for("--nodes", "1", "--gpus_per_node", "2", "--save_interval", "10", *data, *flags)
    found: dict[str, str] = {}
    for p in problems + validate.validate(spec):
        found[p.flag] = found.get(p.flag, "") + f"{p.message} | {p.fix} / "
    return found


def test_domains_are_read_in_order_and_a_bare_source_is_named_heldout():
    assert nanoset.heldout_domains("web=/d/web.jsonl,code=split:validation") == [
        ("web", "/d/web.jsonl"), ("code", "split:validation")]  # fmt: skip
    assert nanoset.heldout_domains("/d/held.jsonl") == [("heldout", "/d/held.jsonl")]
    assert nanoset.heldout_domains("/d/a=b.jsonl") == [("heldout", "/d/a=b.jsonl")]  # a path is no NAME=
    assert nanoset.heldout_domains("web=tail:2M,code=/d/c.jsonl") == [("web", "tail:2M"), ("code", "/d/c.jsonl")]
    assert nanoset.heldout_tail("web=/d/w.jsonl,tail=tail:2k") == 2000  # the tail domain's N
    assert nanoset.heldout_tail("web=/d/w.jsonl") is None and nanoset.heldout_domains(None) == []


def test_each_domain_is_checked_and_named(tmp_path: Path, demo_data):
    good = tmp_path / "good.jsonl"
    good.write_text('{"text": "the happy dog"}\n')
    flag = ("--eval_tasks", "piqa", "--eval_heldout")
    assert "eval_heldout" not in problems_of(*flag, f"web={good},code={good}", demo=demo_data)
    said = problems_of(*flag, f"web={good},code=someone/dataset,web={tmp_path / 'none.jsonl'}", demo=demo_data)
    assert "the domain name 'web' appears twice" in said["eval_heldout"]
    assert "code: someone/dataset is not a local path" in problems_of(*flag, f"web={good},code=someone/dataset",
                                                                      demo=demo_data)["eval_heldout"]  # fmt: skip
    assert "a source without NAME= beside others" in problems_of(*flag, f"{good},code={good}",
                                                                 demo=demo_data)["eval_heldout"]  # fmt: skip
    assert "two tails" in problems_of(*flag, "a=tail:1k,b=tail:2k", demo=demo_data)["eval_heldout"]
