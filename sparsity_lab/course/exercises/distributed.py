"""Exercises for notebook 12 (2:4 across GPUs): which rows a rank stores, masked decay on a shard,
and flip counts summed over ranks."""
from __future__ import annotations

import torch

from .checking import CheckResult, ExerciseReport, run_check

_CASES = [(8, 2), (10, 4), (5, 4), (3, 4), (7, 1), (12, 3)]  # (rows, world): even, uneven, empty ranks


def _reference_rows(rows: int, rank: int, world: int) -> tuple[int, int]:
    """FSDP2's dim-0 sharding: torch.chunk into world pieces of ceil(rows / world) rows."""
    sizes = [len(c) for c in torch.chunk(torch.arange(rows), world)]
    start = sum(sizes[:rank])
    return start, start + (sizes[rank] if rank < len(sizes) else 0)


def check_shard_rows(shard_rows_fn, show: bool = True, hint: bool = False) -> CheckResult:
    """shard_rows(rows, rank, world) -> (start, stop): the rows of W (and of its mask) that rank stores."""
    report = ExerciseReport("shard_rows: the rows FSDP2 gives each rank", solution="distributed",
                            hint="FSDP2 cuts dim 0 like torch.chunk: pieces of ceil(rows / world) rows, "
                                 "the last ones shorter or empty")

    def body(r: ExerciseReport) -> None:
        for rows, world in _CASES:
            for rank in range(world):
                got = r.call(shard_rows_fn, rows, rank, world, what=f"shard_rows({rows}, {rank}, {world})")
                want = _reference_rows(rows, rank, world)
                if got is not None and not r.expect(tuple(int(v) for v in got) == want,
                                                    f"shard_rows({rows}, {rank}, {world}) = {tuple(got)}, "
                                                    f"expected {want}"):
                    return
    return run_check(report, body, show, hint)


def _decayed(grad, weight, mask, decay):
    return grad + decay * (~mask) * weight


def check_masked_decay_on_shard(decay_fn, show: bool = True, hint: bool = False) -> CheckResult:
    """masked_decay_shard(grad_rows, weight_rows, mask_rows, decay) -> the rank's decayed gradient rows;
    the ranks' results, stacked, must equal masked decay on the full gradient."""
    report = ExerciseReport("masked decay on a rank's rows", solution="distributed",
                            hint="g + decay * (1 - m) * W, elementwise, on the rank's rows only: no communication")

    def body(r: ExerciseReport) -> None:
        g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,)).item()))
        for rows, world in ((8, 2), (10, 4), (6, 3)):
            grad, weight = torch.randn(rows, 8, generator=g), torch.randn(rows, 8, generator=g)
            mask = torch.rand(rows, 8, generator=g) < 0.5
            parts = []
            for rank in range(world):
                start, stop = _reference_rows(rows, rank, world)
                got = r.call(decay_fn, grad[start:stop].clone(), weight[start:stop], mask[start:stop], 0.1,
                             what=f"masked_decay_shard(rank {rank} of {world})")
                if got is None or not r.expect(isinstance(got, torch.Tensor),
                                               f"rank {rank}: expected a tensor, got {type(got).__name__}"):
                    return
                parts.append(got)
            if not r.expect_tensor(torch.cat(parts), _decayed(grad, weight, mask, 0.1),
                                   f"the {world} ranks' rows stacked ({rows} rows)", atol=1e-6):
                return
    return run_check(report, body, show, hint)


def check_total_flips(total_flips_fn, show: bool = True, hint: bool = False) -> CheckResult:
    """total_flips(old_parts, new_parts) -> int: the layer's flips from each rank's old and new mask rows
    (what summing the ranks' counts with all_reduce gives); must equal the flips of the full masks."""
    report = ExerciseReport("total_flips: one flip count from the ranks' parts", solution="distributed",
                            hint="count old XOR new on every rank's rows, then add the ranks' counts")

    def body(r: ExerciseReport) -> None:
        for rows, world in ((8, 2), (10, 4), (5, 4)):
            old, new = torch.rand(rows, 8) < 0.5, torch.rand(rows, 8) < 0.5
            bounds = [_reference_rows(rows, k, world) for k in range(world)]
            got = r.call(total_flips_fn, [old[a:b] for a, b in bounds], [new[a:b] for a, b in bounds],
                         what=f"total_flips({world} ranks)")
            want = int((old ^ new).sum())
            if got is not None and not r.expect(int(got) == want,
                                                f"{rows} rows on {world} ranks: got {int(got)} flips, expected {want}"):
                return
    return run_check(report, body, show, hint)
