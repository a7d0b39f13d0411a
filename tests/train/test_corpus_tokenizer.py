import hashlib
import json
import lzma

import pytest

from jaxserve.tokenizer import load_tokenizer
from jaxserve.train.corpus import DEFAULT_CORPUS, iter_documents, load_documents, select_files, split_of


def test_selection_is_sorted_and_skips_tests(tiny_lib):
    files = select_files(tiny_lib, 10**9)
    assert files == sorted(files)
    assert not any("test" in p.parts for p in files)
    assert len(files) == 60


def test_selection_respects_byte_cap(tiny_lib):
    files = select_files(tiny_lib, 2000)
    assert 0 < sum((tiny_lib / f).stat().st_size for f in files) <= 2000


def test_split_is_by_file_and_deterministic(tiny_corpus, tiny_lib):
    train, val = load_documents(tiny_corpus, "train"), load_documents(tiny_corpus, "val")
    assert train and val and len(train) + len(val) == 60
    assert not set(train) & set(val)
    assert [split_of(f.as_posix()) for f in select_files(tiny_lib, 10**9)].count("val") == len(val)


def test_missing_corpus_and_bad_split_raise():
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        next(iter_documents("/nonexistent/does-not-exist.jsonl.xz"))
    with pytest.raises(ValueError, match="unknown corpus split 'dev'"):
        next(iter_documents(DEFAULT_CORPUS, "dev"))


def test_corrupt_document_is_detected(tmp_path):
    bad = tmp_path / "bad.jsonl.xz"
    with lzma.open(bad, "wt") as f:
        f.write(json.dumps({"path": "a.py", "split": "train", "sha256": "0" * 64, "text": "x = 1\n"}) + "\n")
    with pytest.raises(ValueError, match="a.py does not match its sha256"):
        load_documents(bad)


def test_committed_snapshot_matches_manifest():
    manifest = DEFAULT_CORPUS.with_name("pycode-v1.manifest.tsv").read_text().splitlines()[1:]
    first = json.loads(lzma.open(DEFAULT_CORPUS, "rt").readline())
    path, split, size, sha = manifest[0].split("\t")
    assert (first["path"], first["split"], first["sha256"]) == (path, split, sha)
    assert hashlib.sha256(first["text"].encode()).hexdigest() == sha and len(first["text"].encode()) == int(size)
    assert {line.split("\t")[1] for line in manifest} == {"train", "val"}


@pytest.mark.parametrize("text", ["def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1)\n",
                                  "x = 'héllo ✓ 世界'\t# tabs\r\n", ""])
def test_tokenizer_round_trips(tiny_tokenizer, text):
    tok = load_tokenizer(tiny_tokenizer)
    assert tok.decode(tok.encode(text)) == text


def test_tokenizer_eos_is_special(tiny_tokenizer):
    tok = load_tokenizer(tiny_tokenizer)
    assert tok.eos_token_id == 0
    assert tok.decode([0]) == "" and tok.decode([0], skip_special_tokens=False) == "<|endoftext|>"


def test_load_tokenizer_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        load_tokenizer(tmp_path)
