"""The reference tokenizer: an estimate of what a real BPE tokenizer counts, exact on our prompts.

Why not `len(text.split())` (what it was): an unspaced script (Chinese, Japanese, Thai) or one
long word is a single whitespace run, so a 3,000-character Chinese prompt counted 1 token and a
10 MB body of one word counted 1, and every charge, budget and quantum built on the count could
be bypassed. A token here is one piece of the text, pieces being (in this order):
- one CJK ideograph, kana or hangul syllable each (real BPE vocabularies hold most frequent
  ideographs whole: about 1-1.5 tokens a character);
- a run of letters, cut every `LETTERS_PER_TOKEN` characters (an English word is one token, a
  long identifier or a base64 blob several);
- a run of digits, cut every 3 (as GPT-4's and Llama 3's pre-tokenizers cut numbers);
- each punctuation or symbol character, `_` included (code is dense in them).
Whitespace is free (BPE folds a leading space into the next word). fairbench's prompts are
4-letter vocabulary words separated by spaces, so they count exactly one token a word, as
before. The estimate's error against real tokenizers is measured by benchmarks/bench_gateway.py
(`--tokens`) and docs/gateway.md gives it; where the engine's own tokenizer is at hand the
gateway uses that instead (reference_scheduler/gateway/tokens.py).

Token *ids* (for prefix-cache block hashes) are the piece's index in `VOCAB` when it is a
vocabulary word, else a stable hash of the piece, so any text gets deterministic ids.
"""

from __future__ import annotations

import hashlib
import re

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
LETTERS_PER_TOKEN = 6
DIGITS_PER_TOKEN = 3
# CJK ideographs (with extension A and compatibility), kana, hangul, CJK punctuation, fullwidth.
_WIDE = "\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
_PIECES = re.compile(rf"([{_WIDE}])|([^\W\d_{_WIDE}]+)|(\d+)|[^\w\s]|_")


def _vocabulary(size: int = 4096) -> tuple[str, ...]:
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]  # 70
    words: list[str] = []
    for a in syllables:
        for b in syllables:
            words.append(a + b)
            if len(words) == size:
                return tuple(words)
    return tuple(words)  # pragma: no cover


VOCAB: tuple[str, ...] = _vocabulary()
_INDEX = {word: i for i, word in enumerate(VOCAB)}


def pieces(text: str) -> list[str]:
    """The text's tokens as strings (the module docstring says how it is cut)."""
    out: list[str] = []
    for match in _PIECES.finditer(text):
        piece = match.group(0)
        step = (
            LETTERS_PER_TOKEN
            if match.group(2) is not None
            else DIGITS_PER_TOKEN
            if match.group(3) is not None
            else 0
        )
        if step and len(piece) > step:
            out.extend(piece[i : i + step] for i in range(0, len(piece), step))
        else:
            out.append(piece)
    return out


def count_tokens(text: str) -> int:
    """len(pieces(text)) without building the pieces (a 10 MB body is counted in one pass)."""
    n = 0
    for match in _PIECES.finditer(text):
        size = match.end() - match.start()
        if match.group(2) is not None:
            n += -(-size // LETTERS_PER_TOKEN)
        elif match.group(3) is not None:
            n += -(-size // DIGITS_PER_TOKEN)
        else:
            n += 1
    return n


def token_ids(text: str) -> list[int]:
    ids = []
    for piece in pieces(text):
        index = _INDEX.get(piece)
        if index is None:
            digest = hashlib.blake2b(piece.encode("utf-8", "surrogatepass"), digest_size=8)
            index = len(VOCAB) + int.from_bytes(digest.digest(), "little") % (1 << 40)
        ids.append(index)
    return ids
