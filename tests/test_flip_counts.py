"""FlipCounts: device counts settled on read; a sharded layer's count summed by an all-reduce that the
step does not wait for (waited for at the next add or read, in order)."""
import torch

from sparsity_lab.flip_counts import FlipCounts


class SlowSum:
    """A stand-in for an asynchronous all-reduce's Work: the sum lands in the tensor only on wait()."""

    def __init__(self, tensor: torch.Tensor, other_ranks: int) -> None:
        self.tensor, self.other_ranks, self.waited = tensor, other_ranks, False

    def wait(self) -> bool:
        if not self.waited:
            self.tensor += self.other_ranks
            self.waited = True
        return True


def test_a_count_is_read_on_the_host_only_when_asked():
    counts = FlipCounts()
    counts.add(torch.tensor(3))
    counts.add(torch.tensor(4))
    assert (counts.last, counts.total) == (4, 7)


def test_a_reduced_count_is_not_waited_for_when_added_but_before_it_is_used():
    counts, first, second = FlipCounts(), torch.tensor(3), torch.tensor(4)
    work1 = SlowSum(first, other_ranks=10)
    counts.add(first, reduction=work1)
    assert not work1.waited  # the step goes on: no wait in the layer's forward
    work2 = SlowSum(second, other_ranks=20)
    counts.add(second, reduction=work2)
    assert work1.waited and not work2.waited  # the previous one joins at the next add
    assert (counts.last, counts.total) == (24, 13 + 24)  # read: every sum waited for, in order
    assert work2.waited


def test_a_reduced_count_mixes_with_plain_ones_in_order_and_a_load_drops_it_after_waiting():
    counts, reduced = FlipCounts(mirror=torch.zeros(5, dtype=torch.int64)), torch.tensor(1)
    counts.add(torch.tensor(2))
    counts.add(reduced, reduction=SlowSum(reduced, other_ranks=1))
    assert (counts.last, counts.total) == (2, 4)
    assert counts.mirror[3:].tolist() == [2, 4]
    late = torch.tensor(5)
    work = SlowSum(late, other_ranks=0)
    counts.add(late, reduction=work)
    counts.load(last=7, total=70)  # a checkpoint's counts replace the pending one
    assert work.waited and (counts.last, counts.total) == (7, 70)
