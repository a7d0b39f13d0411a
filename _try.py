import sys; sys.path.insert(0, "tests/speculative")
import numpy as np, jax, time
import test_engine_spec as T; from test_engine_spec import CONFIG, LENS, GREEDY, greedy_oracle, spec_llm, tokens; _sharpened = T._sharpened
models_ = {"target": _sharpened(jax.random.key(0))}
rng = np.random.default_rng(0)
pr = [rng.integers(0, CONFIG.vocab_size, n).tolist() for n in LENS]
t=time.time()
oracle_ = greedy_oracle(models_["target"], pr)
llm = spec_llm(models_, draft=None, method="suffix")
got = tokens(llm.generate(pr, GREEDY, use_tqdm=False))
print(got == oracle_, time.time()-t)
print(llm.stats())
