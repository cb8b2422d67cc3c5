"""The model out: a run's checkpoint (either engine, either nanotron dialect, any layout) as a Hugging Face
transformers Llama folder, on a CPU, streamed tensor by tensor (docs/export.md).

    checkpoints.py   which checkpoint: the step, its engine and dialect, complete or refused (standard library)
    weights.py       its tensors under transformers' names: shards merged, fused projections split, the rows
                     past the tokenizer's vocabulary removed, RoPE rows reordered (torch, safetensors)
    folder.py        the folder: config, generation config, safetensors shards and index, tokenizer, model card
                     (transformers, huggingface_hub, safetensors); written beside, then renamed
    command.py       `python -m launcher.jobs export`: a bundle's run, exported
    chained.py       the --export_hf job's export (`python -m launcher.export.chained BUNDLE RESULT`); its
                     evaluation is the job's (`launcher.train.evaluate`)
"""
