"""FlipCounts: device counts settled on read; sharded layers' counts summed over the ranks once a step."""
import torch

from sparsity_lab.flip_counts import FlipCounts


def test_a_count_is_read_on_the_host_only_when_asked():
    counts = FlipCounts()
    counts.add(torch.tensor(3))
    counts.add(torch.tensor(4))
    assert (counts.last, counts.total) == (4, 7)


def test_a_checkpoints_counts_replace_the_pending_ones_and_reach_the_mirror():
    counts = FlipCounts(mirror=torch.zeros(5, dtype=torch.int64))
    counts.add(torch.tensor(2))
    counts.load(last=7, total=70)
    assert (counts.last, counts.total) == (7, 70) and counts.mirror[3:].tolist() == [7, 70]
