"""Exercises of notebooks 01 and 02: the worked solutions pass, plausible wrong answers fail with a
message that names the mistake, a stub is "not attempted"."""
import torch

from sparsity_lab.course.exercises import masks as ex
from sparsity_lab.course.exercises.checking import FAILED, NOT_ATTEMPTED, PASSED
from sparsity_lab.course.exercises.solutions import masks as sol
from sparsity_lab.masks.greedy import solve_greedy_prune

CHECKS = [(ex.check_nm_mask, sol.nm_mask), (ex.check_kept_fraction, sol.kept_fraction),
          (ex.check_unstructured_mask, sol.unstructured_mask),
          (ex.check_expected_unstructured_kept, sol.expected_unstructured_kept),
          (ex.check_transposable_patterns, sol.transposable_patterns),
          (ex.check_transposable_mask_search, sol.transposable_mask_search), (ex.check_greedy_keep, sol.greedy_keep)]


def _stub(*args):
    raise NotImplementedError


def _failed(result, *words):
    assert result.status == FAILED, result.message
    for word in words:
        assert word in result.message, result.message
    return result


def test_solutions_pass_and_stubs_are_not_attempted():
    for check, solution in CHECKS:
        assert check(solution, show=False).status == PASSED, check(solution, show=False).message
        assert check(_stub, show=False).status == NOT_ATTEMPTED


def _mask_from_order(w, n, m, descending_of):
    groups = descending_of(w).reshape(*w.shape[:-1], -1, m)
    order = torch.sort(groups, dim=-1, descending=True, stable=True).indices
    keep = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, order[..., :n], True)
    return keep.reshape(w.shape)


def test_nm_mask_wrong_answers_are_named():
    _failed(ex.check_nm_mask(lambda w, n, m: _mask_from_order(w, n, m, lambda x: x), show=False),
            "largest magnitudes |w|")                                   # forgot abs
    _failed(ex.check_nm_mask(lambda w, n, m: _mask_from_order(w, n, m, lambda x: x.abs()).float(), show=False),
            "bool mask")                                                # right entries, wrong dtype
    _failed(ex.check_nm_mask(lambda w, n, m: _mask_from_order(w, 2, 4, lambda x: x.abs()), show=False),
            "keeps 2 entries, expected exactly 1")                      # ignores n, m
    # ties to the highest index: flip, mask, flip back
    _failed(ex.check_nm_mask(lambda w, n, m: sol.nm_mask(w.flip(-1), n, m).flip(-1), show=False), "ties")


def test_kept_fraction_and_unstructured_wrong_answers_are_named():
    _failed(ex.check_kept_fraction(lambda w, mask: float(mask.float().mean()), show=False), "fraction of entries")
    _failed(ex.check_kept_fraction(lambda w, mask: float((w * mask).sum() / w.sum()), show=False), "magnitudes")
    _failed(ex.check_unstructured_mask(lambda w, d: sol.nm_mask(w, 2, 4) if d == 0.5 else sol.unstructured_mask(w, d),
                                       show=False), "largest magnitudes of the whole matrix")
    _failed(ex.check_unstructured_mask(lambda w, d: sol.unstructured_mask(w, 0.5), show=False), "keeps 30 entries")


def test_expected_unstructured_wrong_answers_are_named():
    _failed(ex.check_expected_unstructured_kept(lambda d: sol.expected_unstructured_kept(1 - d), show=False),
            "density 1 - d")
    _failed(ex.check_expected_unstructured_kept(lambda d: d, show=False), "expected 0.")


def test_transposable_wrong_answers_are_named():
    full = sol.transposable_patterns
    _failed(ex.check_transposable_patterns(lambda n, m: full(n, m)[1:], show=False), "missing")
    _failed(ex.check_transposable_patterns(lambda n, m: torch.cat([full(n, m), full(n, m)[:1]]), show=False),
            "more than once")
    # tiles cut without the permute: the tiles are not the 4x4 blocks of w
    def wrong_tiles(w):
        o, i = w.shape
        t = w.abs().reshape(-1, 16)
        p = full(2, 4).reshape(-1, 16)
        return p[(t.double() @ p.double().T).argmax(1)].reshape(o, i)
    _failed(ex.check_transposable_mask_search(wrong_tiles, show=False), "tile")
    _failed(ex.check_greedy_keep(solve_greedy_prune, show=False), "prune greedy")
    _failed(ex.check_greedy_keep(lambda w, n, m: torch.ones_like(w, dtype=torch.bool), show=False), "more than")


def test_checks_leave_the_notebooks_random_stream_alone():
    """A check draws fresh inputs from its own generator: the learner's torch.manual_seed(...) cells keep
    giving the same numbers after a check ran (torch.seed() would have reseeded the global generator)."""
    from sparsity_lab.course.exercises import mvue as ex_mvue
    from sparsity_lab.course.exercises import sste as ex_sste
    from sparsity_lab.course.exercises.solutions import mvue as sol_mvue
    from sparsity_lab.course.exercises.solutions import sste as sol_sste

    before = torch.get_rng_state()
    for check, solution in CHECKS + [(ex_sste.check_soft_threshold, sol_sste.soft_threshold),
                                     (ex_mvue.check_mvue_probabilities, sol_mvue.mvue_probabilities),
                                     (ex_mvue.check_mvue_sampler, sol_mvue.mvue24)]:
        check(solution, show=False)
    assert torch.equal(before, torch.get_rng_state())
