"""The medusa_heads experiment's training labels: head k at position t learns token t+1+k."""
import numpy as np

from experiments.medusa_heads.training import corpus_labels, target_labels


def test_head_k_is_trained_on_token_t_plus_1_plus_k():
    t, k = 5, 3
    tokens = np.arange(100, 100 + t + k + 1)[None]  # token i is 100 + i
    np.testing.assert_array_equal(corpus_labels(tokens, t, k)[0], 100 + np.arange(t)[:, None] + 1 + np.arange(1, k + 1))
    logits = np.eye(32)[None, 1:t + k + 1]  # the "target" at position i predicts token i + 1
    np.testing.assert_array_equal(target_labels(logits, t, k)[0], np.arange(t)[:, None] + 1 + np.arange(1, k + 1))


def test_training_on_precomputed_target_outputs_matches_recomputing_them():
    import jax

    from experiments.medusa_heads.training import heads_step, make_optimizer, target_outputs, train_step
    from jaxserve.models import get_preset, init_params
    from jaxserve.speculative.medusa import MedusaConfig, init_medusa_params

    tcfg = get_preset("tiny-llama")
    tparams = init_params(tcfg, jax.random.key(0))
    hcfg = MedusaConfig(tcfg.hidden_size, tcfg.vocab_size, num_heads=2)
    tokens = np.random.default_rng(0).integers(0, tcfg.vocab_size, (2, 11)).astype(np.int32)
    opt = make_optimizer(1e-2, steps=4, warmup=1)
    results = []
    for precompute in (False, True):
        heads = init_medusa_params(hcfg, tparams, tcfg)
        state = opt.init(heads)
        for _ in range(2):
            if precompute:
                hidden, labels, _ = target_outputs(tparams, tokens, target_config=tcfg, num_heads=2)
                heads, state, loss, _ = heads_step(heads, state, hidden, labels, heads_config=hcfg, optimizer=opt)
            else:
                heads, state, loss, _ = train_step(heads, state, tparams, tokens, target_config=tcfg,
                                                   heads_config=hcfg, optimizer=opt)
        results.append((jax.device_get(heads), float(loss)))
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), results[0][0], results[1][0])
