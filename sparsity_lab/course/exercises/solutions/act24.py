"""Worked solutions to the exercises of notebook 13 (2:4 activation sparsity)."""
import torch


def act24(h):
    a = torch.relu(h) ** 2                                  # squared ReLU first: choose among its values
    groups = a.reshape(*a.shape[:-1], -1, 4)
    # a stable descending sort puts equal values in index order: ranks 0, 1 are the lowest-index winners
    order = torch.sort(groups, dim=-1, descending=True, stable=True).indices
    keep = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, order[..., :2], True)
    return (groups * keep).reshape(a.shape)


def natural_sparsity(a):
    nonzero = (a != 0).reshape(-1, 4)
    zero_fraction = 1.0 - nonzero.float().mean().item()
    at_most_2 = (nonzero.sum(-1) <= 2).float().mean().item()  # such a group loses nothing to 2:4
    return zero_fraction, at_most_2


def grad_h(h, grad_a24):
    kept = act24(h) != 0                                    # the forward's kept, non-zero entries
    # where a kept value is 0, relu(h) = 0 and so is its gradient: the non-zero mask is enough
    return grad_a24 * kept * 2 * torch.relu(h)


def ffn_speedup(sparse_products, product_speedup, total_products=6):
    new_time = (total_products - sparse_products) + sparse_products / product_speedup
    return total_products / new_time
