"""The other sparse structures the lab compares with 2:4, each a drop-in for ``nn.Linear``.

    dyad          DYAD layers: a block-diagonal plus a permuted block-diagonal (Chandy et al. 2023)
    prune_regrow  b x b block-sparse weights, pruned and regrown during training (Dietrich et al. 2021)
"""
