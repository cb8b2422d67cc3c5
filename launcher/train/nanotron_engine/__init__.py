"""The nanotron engine: nanotron's own DistributedTrainer (0.4's or main's) fed the run's data (`engine`), the
launcher's subclass of it (`trainer`), the checkpoint pointer written once and atomically (`pointer`), the mends of
nanotron's own bugs (`mends`), and the stand-ins that let nanotron import where a module is missing or broken
(`compat`: 0.4's circular import; `flash_attn_compat`; `triton_compat`)."""
