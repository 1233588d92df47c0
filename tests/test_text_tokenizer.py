"""The demo tokenizers are the shipped ones on every machine: a tokenizer trained at a
machine's first use (a WordPiece's vocabulary differs from training to training) never
stands in for them, so a seed gives the same batch everywhere."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from auditlib.data import text_tokenizer
from auditlib.data.text_tokenizer import DEMO_VOCAB_SIZE, demo_tokenizer, shipped_tokenizer


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_the_demo_tokenizer_is_the_shipped_one_whatever_the_data_folder_holds(
    kind, tmp_path, monkeypatch
):
    shipped = shipped_tokenizer(kind)
    assert shipped.is_file()
    # A data folder with another tokenizer under the demo's name (as a first use trained).
    monkeypatch.setenv("AUDIT_DATA_DIR", str(tmp_path))
    other = json.loads(shipped.read_text())
    vocab = other["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[-2:]
    vocab[first], vocab[second] = vocab[second], vocab[first]  # two ids swapped
    cache = tmp_path / "cache" / "text"
    cache.mkdir(parents=True)
    (cache / f"demo-{kind}-{DEMO_VOCAB_SIZE}.json").write_text(json.dumps(other))
    demo_tokenizer.cache_clear()
    try:
        tok = demo_tokenizer(kind)
    finally:
        demo_tokenizer.cache_clear()
    assert tok.tokenizer.to_str() == Tokenizer.from_file(str(shipped)).to_str()
    assert tok.vocab_size == DEMO_VOCAB_SIZE
    ids = tok.encode("And the LORD said unto Moses")
    assert tok.decode(ids).lower() == "and the lord said unto moses"


def test_the_shipped_bpe_is_what_training_gives():
    """The byte-level BPE trains the same every time: shipped, it is still the public demo
    text's (the WordPiece's trainer is not deterministic, so it cannot be compared so)."""
    trained = text_tokenizer._train("bpe", DEMO_VOCAB_SIZE)
    shipped = Tokenizer.from_file(str(shipped_tokenizer("bpe")))
    assert trained.get_vocab() == shipped.get_vocab()
