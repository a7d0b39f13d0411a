"""A draft's focused loss (jaxserve.train.loss_focus): the assistant-answer mask over consecutive windows, the
loss over the most frequent tokens against a NumPy reference, and the trainer's export of the counts the
serving engine restricts the draft's head to."""
import dataclasses
import json

import jax
import numpy as np
import pytest

from jaxserve.config import ModelConfig
from jaxserve.models import forward_full, init_params
from jaxserve.speculative.token_counts import load_counts, most_frequent
from jaxserve.tokenizer import load_tokenizer
from jaxserve.train import train
from jaxserve.train.data import packed_windows, windows
from jaxserve.train.loss_focus import answer_mask, assistant_marker, focused_nll, head_vocab, target_counts
from tests.train.conftest import with_train

CHAT_TOKENIZER = "jaxserve/zoo/smollm2-135m-instruct-draft"  # SmolLM2's tokenizer and chat template


def _chat_stream(tok):
    """Two chat exchanges and a plain text, as scripts/onpolicy_chat.py writes them, with the answer truth."""
    eos, stream, truth = tok.eos_token_id, [], []
    for question, answer in (("hi there", "hello friend, how are you today?"), ("x", "y z w")):
        prompt = tok.encode_chat([{"role": "user", "content": question}])
        reply = tok.encode(answer, add_special_tokens=False) + [eos]
        stream += prompt + reply
        truth += [False] * len(prompt) + [True] * len(reply)
    plain = tok.encode("plain text continues here", add_special_tokens=False) + [eos]
    return np.array(stream + plain), np.array(truth + [False] * len(plain))


@pytest.mark.parametrize("seq_len", [5, 7, 64])
def test_answer_mask_marks_exactly_the_answers_across_window_boundaries(seq_len):
    tok = load_tokenizer(CHAT_TOKENIZER)
    stream, truth = _chat_stream(tok)
    w = windows(stream, seq_len)
    mask = answer_mask(w, assistant_marker(tok), tok.eos_token_id)
    idx = np.arange(len(w))[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
    np.testing.assert_array_equal(mask, truth[idx])
    assert mask.any() and not mask.all()


def _pieces(stream, truth, eos):
    """The stream's exchanges, each ending at the EOS that closes its answer (or the plain text)."""
    ends = [i for i in range(len(stream)) if stream[i] == eos and (i + 1 == len(stream) or truth[i])]
    return [(stream[a:b + 1], truth[a:b + 1]) for a, b in zip([0] + [e + 1 for e in ends[:-1]], ends)]


def test_packed_windows_hold_whole_pieces_first_fit_and_their_answers_are_masked_per_window():
    tok = load_tokenizer(CHAT_TOKENIZER)
    eos = tok.eos_token_id
    pieces = _pieces(*_chat_stream(tok), eos)
    sizes = [len(p) for p, _ in pieces]
    width = max(sizes) + 3  # the longest piece alone in a window; the two others fit together
    w = packed_windows([p for p, _ in pieces], width - 1, eos)
    assert sizes == [41, 35, 5]  # (SmolLM2's chat template)
    (first, _), (second, _), (plain, _) = pieces
    # first fit: the 5-token piece skips the first window (3 free) for the second (9 free)
    np.testing.assert_array_equal(w, [list(first) + [eos] * 3, list(second) + list(plain) + [eos] * 4])
    mask = answer_mask(w, assistant_marker(tok), eos)  # not consecutive: each window on its own
    assert mask.sum() == sum(int(t.sum()) for _, t in pieces)  # every answer token, no prompt or pad token
    long = packed_windows([np.arange(10)], 3, 0)
    np.testing.assert_array_equal(long, [[0, 1, 2, 3]])  # a piece longer than a window is cut to it
    with pytest.raises(ValueError, match="at least one piece"):
        packed_windows([], 3, 0)


def _tiny_model(tied: bool) -> tuple[ModelConfig, dict]:
    config = ModelConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                         num_kv_heads=1, head_dim=8, max_position_embeddings=32, tie_word_embeddings=tied)
    return config, init_params(config, jax.random.key(0))


@pytest.mark.parametrize("tied", [True, False])
def test_focused_nll_matches_numpy_over_the_kept_targets_and_columns(tied):
    config, params = _tiny_model(tied)
    rng = np.random.default_rng(0)
    w = rng.integers(0, 40, (3, 9)).astype(np.int32)
    mask = rng.random((3, 9)) < 0.7
    counts = np.bincount(w[:, 1:].ravel(), minlength=40)
    head = head_vocab(counts, 12)
    ids = most_frequent(counts, 12)
    logits = np.asarray(forward_full(params, config, w[:, :-1]), np.float64)[..., ids]
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll, n = 0.0, 0
    for b in range(3):
        for t in range(8):
            target = w[b, t + 1]
            if mask[b, t + 1] and target in ids:
                nll, n = nll - logp[b, t, np.searchsorted(ids, target)], n + 1
    assert 0 < n < 24
    np.testing.assert_allclose(float(focused_nll(params, config, w, mask, head)), nll / n, rtol=1e-5)
    # no mask and no head: the plain cross-entropy over every target
    full = np.asarray(forward_full(params, config, w[:, :-1]), np.float64)
    full_logp = full - np.log(np.exp(full).sum(-1, keepdims=True))
    plain = -np.take_along_axis(full_logp, w[:, 1:, None], -1).mean()
    np.testing.assert_allclose(float(focused_nll(params, config, w, None, None)), plain, rtol=1e-5)


def test_training_on_a_restricted_head_exports_its_counts(tiny_run, tmp_path, monkeypatch):
    import jaxserve.train.zoo as zoo
    rc = with_train(tiny_run, head_vocab_size=48, out_dir=str(tmp_path / "run"))
    result = train(rc, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert losses[-1] < losses[0]
    counts = load_counts(result["out_dir"] / "final", rc.model.vocab_size)
    assert counts.sum() > 0 and np.count_nonzero(counts) > 48  # the restriction is a real cut
    assert result["final_eval"] is not None
    monkeypatch.setattr(zoo, "ZOO_DIR", tmp_path / "zoo")  # the zoo copy keeps them, for draft_vocab_size
    np.testing.assert_array_equal(load_counts(zoo.export_run(tmp_path / "run", "d"), rc.model.vocab_size), counts)


def test_loss_on_answers_needs_a_chat_tokenizer_and_raises_before_writing(tiny_run, tmp_path):
    rc = with_train(tiny_run, loss_on="answers", out_dir=str(tmp_path / "run"))
    with pytest.raises(ValueError, match="chat template"):
        train(rc, progress=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("kw, match", [({"loss_on": "prompts"}, "loss_on"), ({"head_vocab_size": -1}, "head_vocab")])
def test_bad_focus_settings_raise(tiny_run, kw, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(tiny_run.train, **kw)


def test_target_counts_count_only_masked_targets():
    w = np.array([[1, 2, 3, 2], [2, 2, 1, 0]])
    mask = np.array([[0, 1, 0, 1], [0, 1, 1, 1]], bool)
    np.testing.assert_array_equal(target_counts(w, mask, 4), [1, 1, 3, 0])
    np.testing.assert_array_equal(target_counts(w, None, 4), [1, 1, 3, 1])
