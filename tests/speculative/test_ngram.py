"""N-gram prompt lookup proposals on hand-built histories (no model)."""
import jax.numpy as jnp
import numpy as np

from jaxserve.speculative.ngram import ngram_propose


def test_latest_longest_match_is_continued_periodically():
    history = jnp.array([[1, 2, 3, 4, 1, 2, 3, 0, 0, 0],   # [1 2 3] seen at 0: continue 4 1 2 3 4
                         [5, 6, 7, 8, 9, 1, 2, 0, 0, 0],   # 2 never seen before: repeat it
                         [7, 7, 7, 7, 0, 0, 0, 0, 0, 0],   # period 1
                         [1, 2, 9, 2, 0, 0, 0, 0, 0, 0],   # only the 1-gram [2] matches, at 1
                         [3, 1, 4, 1, 3, 1, 4, 3, 1, 0]])  # [3 1] at 0 and 4: the latest (4) wins
    last = jnp.array([6, 6, 3, 3, 8])
    proposals, found = map(np.asarray, ngram_propose(history, last, 5, max_ngram=3, min_ngram=1))
    np.testing.assert_array_equal(found, [3, 0, 3, 1, 2])
    np.testing.assert_array_equal(proposals, [[4, 1, 2, 3, 4], [2, 2, 2, 2, 2], [7, 7, 7, 7, 7],
                                              [9, 2, 9, 2, 9], [4, 3, 1, 4, 3]])


def test_matches_never_read_past_the_present():
    history = jnp.array([[4, 4, 9, 9, 9, 9]])  # slots past `last` hold stale tokens
    proposals, found = map(np.asarray, ngram_propose(history, jnp.array([1]), 3, max_ngram=2, min_ngram=1))
    assert found[0] == 1 and (proposals == 4).all()
