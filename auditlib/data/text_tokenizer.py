"""Tokenizers for text models: the demo ones, trained on the public demo text with the
``tokenizers`` library (nothing downloaded) and shipped in ``assets/tokenizers/``, and the
auditor's ``tokenizer.json``, read as JSON (a tokenizer file holds no code).

Why shipped: ``tokenizers``' WordPiece trainer is not deterministic (three trainings in three
processes gave three vocabularies; 16 tokens differed at the cut, and 1 734 of 8 192 ids), so
a demo encoder trained at each machine's first use gave each machine other token ids, other
batches and other results for the same seed. The byte-level BPE trains the same every time;
it is shipped too, so a ``tokenizers`` release cannot change it. ``python -m
auditlib.data.text_tokenizer`` trains them again (a new WordPiece is then another one).

A byte-level BPE serves the decoders (GPT-2's scheme: every byte has a token, so no text is
lost); a WordPiece with BERT's special tokens serves the encoders.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from auditlib.data.demo_text import demo_text
from auditlib.errors import AuditInputError
from auditlib.paths import assets_dir, data_dir, private

DEMO_VOCAB_SIZE = 8192
DECODER_SPECIALS = ("<|endoftext|>",)
ENCODER_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MAX_TOKENIZER_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, eq=False)
class TextTokenizer:
    """A tokenizer and the ids the audit needs from it."""

    tokenizer: Tokenizer
    kind: str  # "bpe" (decoders) or "wordpiece" (encoders)
    pad_id: int
    bos_id: int | None  # [CLS] for encoders; None for decoders (GPT-2 starts with no marker)
    eos_id: int | None  # [SEP] for encoders
    source: str

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """The text's tokens, without special tokens."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True).strip()


def _train(kind: str, vocab_size: int) -> Tokenizer:
    if kind == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(DECODER_SPECIALS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    else:
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, special_tokens=list(ENCODER_SPECIALS), show_progress=False
        )
    # One thread: the trained merges must not depend on how many cores the machine has.
    previous = os.environ.get("RAYON_NUM_THREADS")
    os.environ["RAYON_NUM_THREADS"] = "1"
    try:
        tok.train_from_iterator(demo_text().public, trainer=trainer)
    finally:
        if previous is None:
            os.environ.pop("RAYON_NUM_THREADS", None)
        else:
            os.environ["RAYON_NUM_THREADS"] = previous
    if kind == "wordpiece":
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.BertProcessing(("[SEP]", sep), ("[CLS]", cls))
    return tok


def _wrap(tok: Tokenizer, source: str) -> TextTokenizer:
    if tok.token_to_id("[PAD]") is not None:
        pad = tok.token_to_id("[PAD]")
        return TextTokenizer(
            tok, "wordpiece", pad, tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]"), source
        )
    eos = tok.token_to_id("<|endoftext|>")
    if eos is None:
        raise AuditInputError(
            f"{source}: expected a GPT-2 style tokenizer (with <|endoftext|>) or a BERT style "
            "one (with [PAD], [CLS] and [SEP])"
        )
    return TextTokenizer(tok, "bpe", eos, None, None, source)


@functools.lru_cache(maxsize=4)
def demo_tokenizer(kind: str, vocab_size: int = DEMO_VOCAB_SIZE) -> TextTokenizer:
    """The demo tokenizer of ``kind`` ("bpe" or "wordpiece"): the shipped one at the demo's
    size, the same on every machine; another size trained once on the public demo text and
    kept under the data folder (training takes seconds; a WordPiece differs from machine to
    machine)."""
    if kind not in ("bpe", "wordpiece"):
        raise AuditInputError(f"tokenizer kind {kind!r}; expected 'bpe' or 'wordpiece'")
    description = f"demo {kind} tokenizer ({vocab_size} tokens, trained on the public demo text)"
    shipped = shipped_tokenizer(kind, vocab_size)
    if shipped.exists():  # the data folder is not touched for it
        return _wrap(Tokenizer.from_file(str(shipped)), description)
    folder = data_dir() / "cache" / "text"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"demo-{kind}-{vocab_size}.json"
    if path.exists():
        tok = Tokenizer.from_file(str(path))
    else:
        tok = _train(kind, vocab_size)
        partial = path.with_suffix(f".{os.getpid()}.part")
        tok.save(str(partial))
        private(partial, 0o600)
        partial.replace(path)
    return _wrap(tok, description)


def shipped_tokenizer(kind: str, vocab_size: int = DEMO_VOCAB_SIZE) -> Path:
    """Where the shipped demo tokenizer of ``kind`` and size is (it may not exist)."""
    return assets_dir() / "tokenizers" / f"demo-{kind}-{vocab_size}.json"


def load_tokenizer(path: Path) -> TextTokenizer:
    """The auditor's ``tokenizer.json`` (the ``tokenizers`` format), checked."""
    if not path.is_file():
        raise AuditInputError(f"{path}: no tokenizer.json there; expected the tokenizers JSON file")
    if path.stat().st_size > MAX_TOKENIZER_BYTES:
        raise AuditInputError(
            f"{path.name}: {path.stat().st_size} bytes; expected at most {MAX_TOKENIZER_BYTES}"
        )
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # the library's parse errors name no common type
        raise AuditInputError(
            f"{path.name}: not a tokenizers JSON file ({str(exc)[:200]})"
        ) from None
    return _wrap(tok, f"the auditor's {path.name}")


def main() -> None:
    """Train the shipped demo tokenizers again (``assets/tokenizers/``)."""
    for kind in ("bpe", "wordpiece"):
        path = shipped_tokenizer(kind)
        _train(kind, DEMO_VOCAB_SIZE).save(str(path))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
