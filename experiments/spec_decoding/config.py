"""Configuration of the speculative-decoding experiment (override with key=value arguments).

Budget: the full grid (3 methods x γ 1..8 (Medusa: 1..num_heads) x batch 1/4/16 x T 0/1 on the
while-loop path, plus the engine rows) took 2994 s (50 min) on the idle 2-core Sapphire Rapids VM at
255024e (1938 s on the 2-core Zen 4 VM that replaced it, with bf16 matmuls, at 35edd8e; 1879 s there with bf16
matmuls and a float32 draft at b612e9b), with the prefill-only calls of the decode-phase speedup (2255 s without them at 7de7442; repeats=5, min_prompts=8: batch 1 and 4 run 8 and 2 prompt sets per point; 2876 s at
3d777d3, 2507 s with one prompt set per point at 6a9e588). Temperature is an array, not a static argument, so each
(method, γ, batch) compiles once for both temperatures.
"""
import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class SpecDecodingConfig:
    # "jaxserve/<zoo name>", a checkpoint or HF directory, or "preset:<name>" (random weights: smoke only)
    target: str = "jaxserve/tiny-code"
    draft: str = "jaxserve/tiny-code-draft"
    # trained Medusa heads (python -m experiments.medusa_heads writes them); null: heads initialised from
    # the target's LM head, untrained (smoke only)
    medusa_heads: Optional[str] = "runs/medusa_heads/tiny-code"
    # an EAGLE draft's directory (scripts/train_eagle.py writes one; "jaxserve/<zoo name>" for a bundled one), for
    # the engine method "eagle" (the engine path only)
    eagle: Optional[str] = None
    methods: tuple = ("draft_model", "ngram", "medusa")  # also "suffix" (SuffixDecoding: host suffix trees)
    gammas: tuple = (1, 2, 3, 4, 5, 6, 7, 8)   # Medusa rows stop at its number of heads
    batches: tuple = (1, 4, 16)
    temperatures: tuple = (0.0, 1.0)
    prompt_len: int = 64              # prompts: windows of the pycode val split (random ids for presets)
    # a repetitive prompt set: each prompt is a window of prompt_len / 2 tokens written twice (an edit or a
    # summary that quotes its input), where copying proposers (ngram, suffix) have something to copy
    repetitive_prompts: bool = False
    # "code": the windows above; "chat_repetitive" / "chat_free" (experiments/spec_decoding/prompt_sets.py): the
    # target's chat template over tasks whose answer quotes the input (code edits of pycode val snippets, text
    # edits of tests/data/real_text paragraphs) / over open questions; each prompt at most prompt_len tokens
    prompt_set: str = "code"
    min_prompts: int = 8              # each point covers >= this many prompts: ceil(min_prompts / batch) sets
                                      # of batch, each timed on its own (one prompt's α is not the draft's α)
    max_tokens: int = 64
    ignore_eos: bool = True           # every row generates max_tokens, so both sides do the same work (false:
                                      # rows end at EOS; greedy sides emit the same tokens, the same work)
    repeats: int = 5                  # timed calls per point, alternating with as many baseline calls (the
                                      # fastest of each is kept); one more untimed of each compiles
    block_size: int = 16
    # both models' Dense dot operands, float32 sums (null: the zoo's float32 throughout). "bfloat16" makes
    # both sides ~1.25x faster on a CPU with AVX512-BF16 and leaves their ratio where it was
    # (`git show f5419a8:benchmarks/RESULTS.md`, "bfloat16 matmuls")
    matmul_dtype: Optional[str] = None
    # the target's dtype (params and activations; null: as loaded, float32). "bfloat16" on CPU runs the target's
    # matmuls, tied LM head included, in jaxserve's bf16 kernels for up to 16 rows: a round verifying a few tokens
    # then costs ~1.4 decode steps, ~1.9 in float32 (XLA's float32 dot of 2-16 rows is far slower than its 1-row
    # gemv). The draft keeps its own dtype
    dtype: Optional[str] = None
    # the draft's, when not matmul_dtype's (null: the same). The zoo draft is faster in float32 next to a
    # bf16-matmul target (its one-row dots are tiny); only acceptance depends on it
    draft_matmul_dtype: Optional[str] = None
    # the target's MLPs widened to this intermediate size by zero weights (jaxserve.models.loading.widen_mlp):
    # the same tokens, so the draft keeps its acceptance, but more bytes a step: a stand-in for a target past
    # the CPU's caches (the zoo target nearly fits in them). null: the target as loaded
    target_widen_mlp: Optional[int] = None
    # the draft proposes only its vocabulary's N most frequent tokens, its LM head cut to them (FR-Spec;
    # SpeculativeConfig.draft_vocab_size; counts from token_counts.json beside the draft). null: all tokens
    draft_vocab_size: Optional[int] = None
    # the engine path (LLM.generate, one round per step) for these methods and γs, same batches/temperatures
    engine_methods: tuple = ("draft_model", "ngram", "medusa")
    engine_gammas: tuple = (3,)
    engine_max_tokens: int = 32
    # the engine's speculation policy per engine row (SpeculativeConfig): "none" (every decode step speculates),
    # "adaptive" (SpeculativeConfig.adaptive) or "by_batch:N" (disable_by_batch_size=N); each its own row
    engine_policies: tuple = ("none",)
    # suffix decoding's drafts reach at most this times the matched context's length (SuffixDecoding's α;
    # SpeculativeConfig.suffix_spec_factor; vLLM's suffix_decoding_max_spec_factor, default 1)
    suffix_spec_factor: float = 1.0
    seed: int = 0


CONFIG = SpecDecodingConfig()
# Each method on one path: the draft model on the while-loop path, n-gram lookup on the engine's (every program a
# method adds on a path is a compile of several seconds: 7 programs here, 3 of them the baselines').
SMOKE = ("target=preset:tiny-llama", "draft=preset:tiny-llama", "medusa_heads=null", "methods=[draft_model]",
         "gammas=[2]", "batches=[2]",
         "temperatures=[1.0]", "prompt_len=12", "min_prompts=4", "max_tokens=8", "repeats=1", "engine_gammas=[2]",
         "engine_methods=[ngram]", "engine_max_tokens=6")
