"""The medusa_heads experiment's training labels: head k at position t learns token t+1+k."""
import numpy as np

from experiments.medusa_heads.training import corpus_labels, target_labels


def test_head_k_is_trained_on_token_t_plus_1_plus_k():
    t, k = 5, 3
    tokens = np.arange(100, 100 + t + k + 1)[None]  # token i is 100 + i
    np.testing.assert_array_equal(corpus_labels(tokens, t, k)[0], 100 + np.arange(t)[:, None] + 1 + np.arange(1, k + 1))
    logits = np.eye(32)[None, 1:t + k + 1]  # the "target" at position i predicts token i + 1
    np.testing.assert_array_equal(target_labels(logits, t, k)[0], np.arange(t)[:, None] + 1 + np.arange(1, k + 1))
