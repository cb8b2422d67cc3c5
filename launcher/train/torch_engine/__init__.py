"""The torch engine: the portable one (DDP on CPU or GPU). Its trainer (`engine`), its model (`model`, `llama`),
its checkpoints (`checkpoint`) and how a run resumes from them (`resume`)."""
