"""On-policy data for a draft of an instruct model: the target's own answers to chat prompts, and its
continuations of plain text, as one token stream for ``python -m jaxserve.train data.train_windows=...``.

    nice -n 19 python scripts/onpolicy_chat.py target=smollm2-135m-instruct out=runs/onpolicy/smollm2 \
        budget_s=1200

Prompts (shuffled with ``seed``): instructions ("Summarize", "Explain", "What does this code do?", ...) over
paragraphs of ``tests/data/real_text`` and files of the pycode-v1 training split, open questions, all through
the tokenizer's chat template; and ``plain_fraction`` raw windows of the same texts. Rows alternate greedy /
sampled at temperature 1 (``sampled_fraction`` of them), and stop at EOS or ``max_tokens``; the serving engine generates them (``generator=engine``,
bf16 by default), or the float32 ``target_only_generate`` loop (``generator=loop``). After every batch ``out.npy`` (i32[N]: each
prompt + continuation, EOS-separated), ``out_ends.npy`` (i64[P]: where each piece ends in it), ``out_windows.npy`` (that stream as training windows) and ``out.json``
(counts) are rewritten, so a run stopped at
``budget_s`` (or killed) leaves usable data. The same prompt split is held out by ``heldout`` for evaluation.

``mix=edits`` adds tasks whose answers copy their input (code edits over the pycode-v1 *training* split, text
edits over the target's own earlier answers: never the evaluation inputs of experiments/spec_decoding) and
questions about ``TOPICS``; ``pack=true`` writes the windows as whole prompt + answer pieces. The data of the
retrained draft (benchmarks/RESULTS.md, "A retrained SmolLM2 draft": two such runs, seeds 2 and 3, ~25 min):

    python scripts/onpolicy_chat.py out=runs/onpolicy/smollm2_edits mix=edits pack=true seq_len=512 \
        max_prompt_tokens=160 max_tokens=192 plain_fraction=0.1 sampled_fraction=0.25 budget_s=2100 seed=2
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
import textwrap
import time

import numpy as np

from jaxserve.config import apply_overrides

REAL_TEXT = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data" / "real_text"
INSTRUCTIONS = ("Summarize the following text in two sentences:", "Explain this in simple words:",
                "Rewrite this text more clearly:", "What are the key points of this text?",
                "Translate this into plain English for a beginner:", "List three questions this text raises:")
CODE_INSTRUCTIONS = ("What does this code do?", "Explain this Python code step by step:",
                     "Write a docstring for this code:", "Suggest an improvement to this code:",
                     "Find a possible bug in this code:")
QUESTIONS = (
    "What is the capital of France?", "How do I reverse a list in Python?", "Why is the sky blue?",
    "Write a short poem about the sea.", "What is machine learning?", "Give me three tips for better sleep.",
    "How does a hash table work?", "What is the difference between a list and a tuple in Python?",
    "Explain recursion with an example.", "Write a Python function that checks if a number is prime.",
    "What causes the seasons on Earth?", "How do vaccines work?", "Tell me a fun fact about octopuses.",
    "What is the Pythagorean theorem?", "How can I improve my writing?", "What is an API?",
    "Write a haiku about autumn.", "Explain what a binary search is.", "What is photosynthesis?",
    "How do I read a file line by line in Python?", "What are the benefits of exercise?",
    "Describe the water cycle.", "What is the difference between weather and climate?",
    "Write a SQL query that counts rows in a table named users.", "What is a black hole?",
    "Give me a recipe for pancakes.", "How does the internet work?", "What is open source software?",
    "Explain the difference between HTTP and HTTPS.", "What is a neural network?",
    "Write a short story about a robot who learns to paint.", "How do I sort a dictionary by value in Python?",
    "What should I pack for a weekend hiking trip?", "Explain inflation to a child.",
    "What is the GPL license?", "How does git rebase differ from git merge?", "What is gravity?",
    "Write an email asking my manager for a day off.", "What are prime numbers?", "How do plants grow?",
)
# mix="edits": tasks whose answers copy their input, worded unlike experiments/spec_decoding/prompt_sets.py's
# (whose code comes from the val split and whose text from tests/data/real_text: here the code is the train
# split's and the text the target's own earlier answers, so no evaluation input is trained on)
CODE_EDITS = ("Add comments to this Python code and return all of it:",
              "Give the variables in this code more descriptive names. Return the complete code:",
              "Add Python type annotations to this code and show the full result:",
              "Clean up the formatting of this code and return the whole code:",
              "Add a docstring to each function in this code and return the full code:",
              "Rewrite this code using f-strings where possible and return all of it:")
TEXT_EDITS = ("Fix the grammar of this text and return it in full:",
              "Copy the first sentence of this text, then summarize the rest:",
              "Rewrite this text word for word, then add a title:",
              "Return this text unchanged, then list its main ideas:")
TOPICS = (
    "the Roman Empire", "volcanoes", "the stock market", "photosynthesis", "black holes", "the immune system",
    "electric cars", "climate change", "the printing press", "honey bees", "quantum computers", "the human heart",
    "coffee", "the Great Wall of China", "rainbows", "earthquakes", "the French Revolution", "solar panels",
    "chess", "the Olympic Games", "dinosaurs", "the moon landing", "antibiotics", "jazz music", "the ocean tides",
    "democracy", "the water cycle", "penguins", "smartphones", "the Renaissance", "glaciers", "compilers",
    "databases", "encryption", "the Amazon rainforest", "wind turbines", "the Silk Road", "vitamins", "comets",
    "sourdough bread", "the periodic table", "tornadoes", "public libraries", "electricity", "bridges", "sleep",
    "meditation", "the Internet", "operating systems", "recycling", "the Pyramids of Giza", "octopuses", "deserts",
    "coral reefs", "mountain climbing", "the violin", "football", "inflation", "vaccines", "the blockchain",
    "machine translation", "the Industrial Revolution", "gardening", "bicycles", "trains", "the Eiffel Tower",
    "spiders", "magnets", "sound waves", "the speed of light", "DNA", "the Milky Way", "Mars", "sharks", "tea",
    "origami", "the Cold War", "the telephone", "version control", "unit testing", "recursion", "sorting algorithms",
    "neural networks", "cloud computing", "the Python language", "spreadsheets", "nutrition", "marathons",
    "elephants", "the Sahara", "clouds", "lightning", "hurricanes", "the Nile", "Shakespeare", "poetry", "museums",
)
TOPIC_TEMPLATES = ("What is {}?", "Explain {} to a beginner.", "Write a short paragraph about {}.",
                   "Give three facts about {}.", "What is the history of {}?", "Why does {} matter?")


@dataclasses.dataclass(frozen=True)
class ChatDataConfig:
    target: str = "smollm2-135m-instruct"
    out: str = "runs/onpolicy/smollm2"
    batch_size: int = 64
    max_tokens: int = 96  # generated tokens per prompt (fewer where EOS comes first)
    max_prompt_tokens: int = 96
    plain_fraction: float = 0.3
    budget_s: float = 1200.0  # stop after the batch that crosses this many seconds
    heldout: int = 64  # the last ``heldout`` shuffled prompts are never generated (evaluation prompts)
    seq_len: int = 256  # ``out_windows.npy``: the stream cut into windows i32[W, seq_len + 1] for training
    seed: int = 0
    # engine: the serving engine (``LLM``, ``batch_size`` slots, weights in ``dtype``: what a draft is served beside;
    # SmolLM2 bf16 makes ~900 tok/s at batch 64 on the 2-core VM) | loop: ``target_only_generate`` (float32, one
    # jitted while_loop; ~55 tok/s there)
    generator: str = "engine"
    dtype: str = "bfloat16"
    # v1: the prompts the bundled draft was trained on | edits: v1's chat prompts, plus code edits over the train
    # split, questions about TOPICS, and text edits over the target's own answers, added as they are generated
    mix: str = "v1"
    sampled_fraction: float = 0.5  # rows sampled at T = 1; the others greedy
    # out_windows.npy: false: the stream cut every seq_len tokens (v1); true: whole prompt + answer pieces packed
    # into windows (jaxserve.train.data.packed_windows), so every answer sees its prompt (a copying draft's data)
    pack: bool = False


def _paragraphs() -> list[str]:
    paras = []
    for path in sorted(REAL_TEXT.glob("*.txt")):
        blocks = [" ".join(b.split()) for b in path.read_text().split("\n\n")]
        paras += [b for b in blocks if 200 <= len(b)]
    return paras


def _code_snippets(rng: np.random.Generator, num: int) -> list[str]:
    from jaxserve.train.corpus import iter_documents

    docs = [d for d in iter_documents(None, "train") if len(d) > 400]
    picks = rng.choice(len(docs), num)
    out = []
    for i in picks:
        lines = docs[i].splitlines()
        start = int(rng.integers(0, max(1, len(lines) - 12)))
        out.append("\n".join(lines[start:start + 12]))
    return out


def _chat(tokenizer, text: str) -> list[int]:
    return tokenizer.encode_chat([{"role": "user", "content": text}])


def _clip_text(tokenizer, text: str, max_tokens: int) -> str:
    return tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)[:max_tokens])


def fit_chat(tokenizer, max_len: int, template: str, text: str) -> list[int]:
    """``template.format(text)`` as a chat prompt of at most ``max_len`` tokens, ``text`` clipped to fit (the
    template and the chat markup kept whole, so the prompt still ends with the assistant's turn)."""
    body = max_len
    while len(ids := _chat(tokenizer, template.format(_clip_text(tokenizer, text, body)))) > max_len:
        body -= max(4, len(ids) - max_len)
    return ids


def text_edit_prompt(tokenizer, cfg: ChatDataConfig, index: int, answer: str) -> list[int]:
    """A TEXT_EDITS instruction over ``answer`` (the target's own text), at most max_prompt_tokens."""
    return fit_chat(tokenizer, cfg.max_prompt_tokens, TEXT_EDITS[index % len(TEXT_EDITS)] + "\n\n{}", answer)


def build_prompts(tokenizer, cfg: ChatDataConfig) -> list[tuple[str, list[int]]]:
    """``(kind, token ids)`` pairs, shuffled: kind is "chat" or "plain"; each at most max_prompt_tokens."""
    if cfg.mix not in ("v1", "edits"):
        raise ValueError(f"mix must be 'v1' or 'edits', got {cfg.mix!r}")
    rng = np.random.default_rng(cfg.seed)
    paras, code = _paragraphs(), _code_snippets(rng, 600)

    def chat(text: str) -> list[int]:
        return _chat(tokenizer, text)

    def clip_text(text: str) -> str:
        return _clip_text(tokenizer, text, cfg.max_prompt_tokens - 45)

    chats = [chat(f"{INSTRUCTIONS[i % len(INSTRUCTIONS)]}\n\n{clip_text(p)}") for i, p in enumerate(paras)]
    chats += [chat(f"{CODE_INSTRUCTIONS[i % len(CODE_INSTRUCTIONS)]}\n\n{clip_text(c)}") for i, c in enumerate(code)]
    chats += [chat(q) for q in QUESTIONS] * 4  # sampled rows give different answers to a repeated question
    if cfg.mix == "edits":
        edits = _code_snippets(rng, 1200)
        chats += [fit_chat(tokenizer, cfg.max_prompt_tokens, CODE_EDITS[i % len(CODE_EDITS)] + "\n\n```python\n{}\n```",
                           textwrap.dedent(c)) for i, c in enumerate(edits)]
        chats += [chat(t.format(topic)) for topic in TOPICS for t in TOPIC_TEMPLATES]
    plain_n = int(len(chats) * cfg.plain_fraction / (1 - cfg.plain_fraction))
    sources = paras + code
    plains = []
    for i in rng.choice(len(sources), plain_n):
        ids = tokenizer.encode(sources[i], add_special_tokens=False)
        start = int(rng.integers(0, max(1, len(ids) - 48)))
        plains.append(ids[start:start + int(rng.integers(24, 64))])
    prompts = [("chat", p[:cfg.max_prompt_tokens]) for p in chats] + [("plain", p) for p in plains if p]
    return [prompts[i] for i in rng.permutation(len(prompts))]


def loop_generator(config, params, cfg: ChatDataConfig):
    """batch -> continuations, by ``target_only_generate`` (float32, padded batch, one while_loop)."""
    from jaxserve.speculative.generate import target_only_generate

    def generate(batch, temps, seeds, eos):
        lens = np.array([len(p) for _, p in batch], np.int32)
        ids = np.zeros((len(batch), int(lens.max())), np.int32)
        for r, (_, p) in enumerate(batch):
            ids[r, :len(p)] = p
        tokens, count, _ = target_only_generate(params, config, ids, lens, max_tokens=cfg.max_tokens,
                                                temperature=temps, seeds=seeds, eos_token_id=eos)
        tokens, count = np.asarray(tokens), np.asarray(count)
        return [tokens[r, :count[r]].tolist() for r in range(len(batch))]
    return generate


def engine_generator(cfg: ChatDataConfig):
    """batch -> continuations, by the serving engine (continuous batching, ``cfg.dtype`` weights)."""
    from jaxserve import LLM, SamplingParams
    llm = LLM(cfg.target, dtype=cfg.dtype, max_num_seqs=cfg.batch_size, enable_prefix_caching=False)

    def generate(batch, temps, seeds, eos):
        params = [SamplingParams(max_tokens=cfg.max_tokens, temperature=float(t), seed=int(s))
                  for t, s in zip(temps, seeds)]
        outs = llm.generate([p for _, p in batch], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]
    return generate


def _sampled_rows(fraction: float):
    """n -> bool[n]: which rows of a batch sample (T = 1), spread evenly (0.5: every odd row, as v1 did)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"sampled_fraction must be in [0, 1], got {fraction!r}")
    return lambda n: np.floor((np.arange(n) + 1) * fraction) > np.floor(np.arange(n) * fraction)


def main(argv: list[str]) -> None:
    from jaxserve.models.loading import resolve_model
    from jaxserve.train.data import packed_windows, windows

    cfg = apply_overrides(ChatDataConfig(), argv)
    if cfg.generator not in ("engine", "loop"):
        raise ValueError(f"generator must be 'engine' or 'loop', got {cfg.generator!r}")
    config, params, tokenizer = resolve_model(cfg.target)
    generate = engine_generator(cfg) if cfg.generator == "engine" else loop_generator(config, params, cfg)
    prompts = build_prompts(tokenizer, cfg)
    train, held = prompts[:-cfg.heldout], prompts[-cfg.heldout:]
    out = pathlib.Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    (out.parent / f"{out.name}_heldout.json").write_text(json.dumps([{"kind": k, "ids": p} for k, p in held]))
    eos, t0 = tokenizer.eos_token_id, time.perf_counter()
    pieces, stats = [], {"prompts": 0, "generated": 0, "chat": 0, "plain": 0, "edit": 0, "greedy": 0, "sampled": 0}
    rows_sampled, rng = _sampled_rows(cfg.sampled_fraction), np.random.default_rng(cfg.seed + 1)
    lo = 0
    while lo < len(train):  # (len re-read each batch: mix=edits inserts prompts as answers come)
        batch = train[lo:lo + cfg.batch_size]
        temp = rows_sampled(len(batch)).astype(np.float32)
        gens = generate(batch, temp, cfg.seed * 1_000_003 + lo + np.arange(len(batch)), eos)
        for r, ((kind, p), gen) in enumerate(zip(batch, gens)):
            pieces.append(np.asarray(p + gen + ([] if gen and gen[-1] == eos else [eos]), np.int32))
            stats[kind] += 1
            stats["greedy" if temp[r] == 0 else "sampled"] += 1
            if cfg.mix == "edits" and kind == "chat" and temp[r] == 0 and len(gen) >= 48 and r % 4 == 0:
                # within the next few batches, so a run stopped at budget_s has them
                answer = tokenizer.decode([t for t in gen if t != eos])
                at = lo + len(batch) + int(rng.integers(0, 4 * cfg.batch_size))
                train.insert(min(at, len(train)), ("edit", text_edit_prompt(tokenizer, cfg, len(train), answer)))
        stats["prompts"] += len(batch)
        stats["generated"] += sum(len(g) for g in gens)
        stats["elapsed_s"] = round(time.perf_counter() - t0, 1)
        stats["stream_tokens"] = int(sum(len(x) for x in pieces))
        np.save(out.with_suffix(".npy"), np.concatenate(pieces))
        np.save(out.parent / f"{out.name}_ends.npy", np.cumsum([len(x) for x in pieces]))  # where each piece ends
        np.save(out.parent / f"{out.name}_windows.npy", packed_windows(pieces, cfg.seq_len, eos) if cfg.pack
                else windows(np.concatenate(pieces), cfg.seq_len))
        out.with_suffix(".json").write_text(json.dumps({**stats, "config": dataclasses.asdict(cfg)}, indent=1))
        print(json.dumps(stats), flush=True)
        if stats["elapsed_s"] > cfg.budget_s:
            break
        lo += len(batch)


if __name__ == "__main__":
    main(sys.argv[1:])
