"""Configuration of the speculative-decoding experiment (override with key=value arguments)."""
import dataclasses


@dataclasses.dataclass(frozen=True)
class SpecDecodingConfig:
    # "jaxserve/<zoo name>", a checkpoint or HF directory, or "preset:<name>" (random weights: smoke only)
    target: str = "jaxserve/tiny-code"
    draft: str = "jaxserve/tiny-code-draft"
    method: str = "draft_model"       # or "ngram" (prompt lookup; draft unused)
    gammas: tuple = (1, 2, 3, 4, 5, 6, 7, 8)
    batches: tuple = (1, 4, 16)
    temperatures: tuple = (0.0, 1.0)
    prompt_len: int = 64              # prompts: windows of the pycode val split (random ids for presets)
    max_tokens: int = 128
    ignore_eos: bool = True           # every row generates max_tokens, so both sides do the same work
    repeats: int = 3                  # timed calls per point (median); one more untimed compiles
    block_size: int = 16
    seed: int = 0
    smoke: bool = False               # label the figures as a smoke run, not results
    out_dir: str = "experiments/spec_decoding"


def get_config() -> SpecDecodingConfig:
    return SpecDecodingConfig()
