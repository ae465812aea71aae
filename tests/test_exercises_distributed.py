"""Notebook 12's exercises: the worked solutions pass, plausible wrong answers fail with a message
that names the problem, the stub is not attempted."""

from sparsity_lab.course.exercises.checking import FAILED, NOT_ATTEMPTED, PASSED
from sparsity_lab.course.exercises.distributed import check_masked_decay_on_shard, check_shard_rows, check_total_flips
from sparsity_lab.course.exercises.solutions import distributed as solution


def _stub(*args):
    raise NotImplementedError


def test_solutions_pass():
    assert check_shard_rows(solution.shard_rows, show=False).status == PASSED
    assert check_masked_decay_on_shard(solution.masked_decay_shard, show=False).status == PASSED
    assert check_total_flips(solution.total_flips, show=False).status == PASSED


def test_stubs_are_not_attempted():
    for check in (check_shard_rows, check_masked_decay_on_shard, check_total_flips):
        assert check(_stub, show=False).status == NOT_ATTEMPTED


def test_shard_rows_wrong_answers():
    floor = check_shard_rows(lambda rows, rank, world: (rank * (rows // world), (rank + 1) * (rows // world)),
                             show=False)
    assert floor.status == FAILED and "shard_rows(10, 0, 4)" in floor.message and "expected (0, 3)" in floor.message

    def array_split(rows, rank, world):  # numpy's split: the remainder spread over the first ranks
        sizes = [rows // world + (k < rows % world) for k in range(world)]
        return sum(sizes[:rank]), sum(sizes[:rank + 1])
    split = check_shard_rows(array_split, show=False)
    assert split.status == FAILED and "expected (6, 9)" in split.message


def test_masked_decay_wrong_answers():
    kept = check_masked_decay_on_shard(lambda g, w, m, d: g + d * m * w, show=False)
    assert kept.status == FAILED and "ranks' rows stacked" in kept.message
    scaled = check_masked_decay_on_shard(lambda g, w, m, d: g + 2 * d * (~m) * w, show=False)
    assert scaled.status == FAILED and "entries differ" in scaled.message


def test_total_flips_wrong_answers():
    averaged = check_total_flips(lambda o, n: sum(int((a ^ b).sum()) for a, b in zip(o, n)) // len(o), show=False)
    assert averaged.status == FAILED and "flips, expected" in averaged.message
    first_rank = check_total_flips(lambda o, n: int((o[0] ^ n[0]).sum()), show=False)
    assert first_rank.status == FAILED
