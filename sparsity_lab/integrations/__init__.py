"""Integrations with the tools people train and serve with.

    hf              from_pretrained / load_dense_checkpoint for Hugging Face models (needs transformers)
    trainer_callback SparsityCallback for transformers.Trainer (needs transformers)
    torchtitan      2:4 layers, converter and trainer for torchtitan 0.3 (needs torchtitan 0.3)
    torchtitan_record  the same trainer, recording losses, tokens/s, memory and 2:4 checks as JSON

The table of known architectures (which linears are the MLP) and GPT-2's Conv1D as a 2:4 layer
are what ``sparsify`` itself converts with: they live beside it, in ``sparsity_lab.architectures``
and ``sparsity_lab.conv1d``.

Importing this package imports neither transformers nor triton; ``hf`` and ``trainer_callback`` import
transformers, ``torchtitan`` imports torchtitan.
"""
