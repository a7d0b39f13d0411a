"""A starting point for a narrow draft of a wide target: the target's token embedding, projected.

Axis names: V vocabulary, E target hidden size, K draft hidden size.

A draft of hidden size K << E with the target's vocabulary spends most of its parameters on the V x K
embedding (tied to its LM head). Trained from random it must learn V embeddings from a few hundred
thousand tokens; started from the target's embedding projected onto its top-K right singular vectors,
every token starts where the target puts it (inner products between embeddings, and so the logits of
a hidden state in that subspace, are the target's best rank-K approximation). The layers start random.

    python -m jaxserve.train.draft_init target=smollm2-135m-instruct draft=smollm2-135m-instruct-draft \
        out=runs/smollm2-draft-init

writes a jaxserve checkpoint (``train.init_from=`` of ``python -m jaxserve.train``) with the target's
``tokenizer.json`` and a ``tokenizer_config.json`` naming its EOS, BOS and chat template.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

import jax
import numpy as np

from jaxserve.config import ModelConfig, apply_overrides


@dataclasses.dataclass(frozen=True)
class DraftInitConfig:
    target: str = "smollm2-135m-instruct"
    draft: str = "smollm2-135m-instruct-draft"  # a preset of jaxserve.models.PRESETS
    out: str = "runs/smollm2-draft-init"
    seed: int = 0


def projected_embedding(embedding: np.ndarray, k: int) -> np.ndarray:
    """f32[V, K]: ``embedding`` f32[V, E] times its top-``k`` right singular vectors (uncentred), so that
    ``P @ P.T`` is the best rank-k approximation of ``embedding @ embedding.T``."""
    e = np.asarray(embedding, np.float64)
    if not 0 < k <= e.shape[1]:
        raise ValueError(f"draft hidden size must lie in [1, {e.shape[1]}] (the target's), got {k}")
    _, vecs = np.linalg.eigh(e.T @ e)  # ascending eigenvalues; E x E is small next to V x E
    return (e @ vecs[:, ::-1][:, :k]).astype(np.float32)


def init_draft(draft_config: ModelConfig, target_params: dict, target_config: ModelConfig, seed: int) -> dict:
    """Random draft params with the tied embedding replaced by the target's, projected to the draft's width."""
    from jaxserve.models import init_params

    if not (draft_config.tie_word_embeddings and target_config.tie_word_embeddings):
        raise ValueError("draft_init needs tied embeddings in both the draft and the target")
    if draft_config.vocab_size != target_config.vocab_size:
        raise ValueError(f"draft vocab_size {draft_config.vocab_size} != target's {target_config.vocab_size}")
    params = jax.tree.map(np.asarray, init_params(draft_config, jax.random.key(seed)))
    params["embed"]["embedding"] = projected_embedding(target_params["embed"]["embedding"], draft_config.hidden_size)
    return params


def main(argv: list[str]) -> None:
    from jaxserve.models import get_preset
    from jaxserve.models.checkpoint import save_model, write_manifest
    from jaxserve.models.loading import resolve_model

    cfg = apply_overrides(DraftInitConfig(), argv)
    target_config, target_params, tok = resolve_model(cfg.target)
    draft_config = dataclasses.replace(get_preset(cfg.draft), eos_token_id=target_config.eos_token_id,
                                       bos_token_id=target_config.bos_token_id)
    out = pathlib.Path(cfg.out)
    save_model(out, draft_config, init_draft(draft_config, target_params, target_config, cfg.seed))
    tok.save(out)
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": tok.eos_token, "bos_token": tok.bos_token, "add_bos_token": tok.add_bos_token,
         "chat_template": tok.chat_template}, indent=1))
    write_manifest(out)  # now covering the tokenizer files too
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
