"""The reference tokenizer: a token is a maximal run of non-whitespace characters.

Chosen for being exact, documented and free: `len(text.split())`. Token *ids* (for prefix-cache
block hashes) are the word's index in `VOCAB` when it is a vocabulary word, else a stable hash of
the word, so any text a client sends gets deterministic ids.
"""

from __future__ import annotations

import hashlib

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


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


def count_tokens(text: str) -> int:
    return len(text.split())


def token_ids(text: str) -> list[int]:
    ids = []
    for word in text.split():
        index = _INDEX.get(word)
        if index is None:
            digest = hashlib.blake2b(word.encode("utf-8", "surrogatepass"), digest_size=8)
            index = len(VOCAB) + int.from_bytes(digest.digest(), "little") % (1 << 40)
        ids.append(index)
    return ids
