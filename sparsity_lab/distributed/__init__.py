"""2:4 training across processes on PyTorch's own engine: DDP, FSDP2 (``fully_shard``) and
``torch.distributed.checkpoint``. See docs/distributed.md.

Order: ``sparsify`` on every rank (same seed), then ``data_parallel`` or ``fully_shard_sparse``,
then the optimizer and ``attach_optimizer``.
"""
from .batches import local_batch
from .sharded_layer import ShardedSparseLinear
from .wrap import check_ranks_agree, data_parallel, fully_shard_sparse, refuse_wrapped

__all__ = ["ShardedSparseLinear", "check_ranks_agree", "data_parallel", "fully_shard_sparse", "local_batch",
           "refuse_wrapped"]
