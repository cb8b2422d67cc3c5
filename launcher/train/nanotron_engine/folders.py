"""The nanotron engine's feed from tokenized folders (nanotron main's Nanosets), over the files themselves.

Not main's own reader (run_train.py -> nanotron/data/tokenized_bytes.py): it passes datatrove arguments no released
datatrove accepts (datatrove #374: `eos_token_id`, `read_path`, `matched_files`, `file_sizes` to
`DatatroveFolderDataset`), and compiles a C++ helper at job start. The folders are read as the torch engine reads
them (`launcher.train.tokenized.FolderWindows`: each token file memory-mapped, windows of sequence_length + 1
tokens read as a batch asks for them; a mixture weighed by main's normalised weights) and dealt as the torch engine
deals them (`launcher.train.data.PackedWindows`: the windows shuffled per epoch with the data seed, dp rank r taking
windows r, r + dp, ...): both engines read the same tokens in the same order, and a micro-batch is a pure function
of (data seed, dp rank, its index).

Resuming: nanotron's checkpoint metadata says how many samples the stage consumed (all dp ranks together); this
rank's next micro-batch is number consumed / (dp x micro_batch_size), the one the uninterrupted run reads next.
Each micro-batch goes through main's own `DataCollatorForCLM` (inputs on the first pipeline rank, labels on the
last, TensorPointers elsewhere), as main's dataloaders do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch.distributed as dist

from launcher.errors import TrainError
from launcher.train.data import PackedWindows
from launcher.train.settings import TrainConfig
from launcher.train.tokenized import FolderWindows


def start_index(consumed: int, dp: int, micro_batch_size: int) -> int:
    """The micro-batch a dp rank reads next after `consumed` samples of the stage (every dp rank's together)."""
    per_step = dp * micro_batch_size
    if consumed % per_step:
        raise TrainError(
            f"the checkpoint says {consumed} samples were consumed, not a whole number of micro-batches of "
            f"{micro_batch_size} on each of {dp} data-parallel ranks: resume in the layout it was saved in"
        )
    return consumed // per_step


def feed(  # type: ignore[no-untyped-def]
    trainer,
    cfg: TrainConfig,
    consumed: int,
    input_pp_rank: int,
    output_pp_rank: int,
    announce: Callable[[int], None],
) -> Iterator[dict]:
    """This rank's micro-batches of `cfg`'s tokenized folders, forever (epoch after epoch), from the one after
    `consumed` samples; `announce(n)` as the first micro-batch of epoch n (counted from 1, n >= 2) is drawn."""
    from nanotron.data.clm_collator import DataCollatorForCLM

    context = trainer.parallel_context
    collate = DataCollatorForCLM(
        sequence_length=trainer.sequence_length,
        input_pp_rank=input_pp_rank,
        output_pp_rank=output_pp_rank,
        parallel_context=context,
    )
    dp, dp_rank = context.dp_pg.size(), dist.get_rank(context.dp_pg)
    size = trainer.micro_batch_size
    index = start_index(consumed, dp, size)
    if dist.get_rank(context.pp_pg) not in (input_pp_rank, output_pp_rank):
        return _pointers(collate, size)  # a middle pipeline rank reads no data: it is sent activations
    windows = FolderWindows(list(cfg.nanoset), cfg.sequence_length, cfg.nanoset_caps)
    if len(windows) // dp < size:
        raise TrainError(
            f"the tokenized data makes {len(windows)} windows of {cfg.sequence_length + 1} tokens, not one "
            f"micro-batch of {size} for each of the {dp} data-parallel ranks: tokenize more data, or use a shorter "
            "sequence length or a smaller micro batch"
        )
    batches = PackedWindows(windows, size, cfg.data_seed, dp_rank, dp)  # type: ignore[arg-type]  # indexed alike
    return _batches(batches, collate, index, announce)


def _batches(batches: PackedWindows, collate, index: int, announce: Callable[[int], None]) -> Iterator[dict]:  # type: ignore[no-untyped-def]
    epoch = batches.epoch(index - 1) if index else 0
    while True:
        rows = batches.micro_batch(index).numpy()
        now = batches.epoch(index)
        if now != epoch:
            announce(now + 1)
            epoch = now
        yield collate([{"input_ids": row} for row in rows])
        index += 1


def _pointers(collate, size: int) -> Iterator[dict]:  # type: ignore[no-untyped-def]
    while True:
        yield collate([{} for _ in range(size)])
