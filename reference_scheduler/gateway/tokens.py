"""How the gateway counts a prompt's tokens before it admits it: the count every charge, the token
budget and the DWRR quantum start from.

Three sources, named by the config's `tokenizer:` (config.py), and `source` says which is in
force (the docs and /health show it):
- `upstream`: the engine's own tokenizer, by its `/tokenize` endpoint (vLLM and SGLang: POST
  `{"model", "prompt"}` or `{"model", "messages"}` -> `{"count": ...}`), so a chat template's
  markers are counted too. Answers are cached by prompt (an LRU of `cache_size`), so a repeated
  system prompt or a retried request costs no round trip. An upstream that does not answer (no
  endpoint, an error, slower than the connect timeout) gets the estimate for that request;
- a path to a `tokenizer.json`: counted locally with the `tokenizers` library (exact for the
  text; a chat template's few markers are not added, the engine's usage corrects them);
- `estimate`: reference_scheduler/core/tokenizer.py's estimator (measured error in
  docs/gateway.md).
Whatever the source, the dispatcher corrects every charge and the budget from the engine's
`usage` when the answer ends (dispatcher.settle).
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from reference_scheduler.core.tokenizer import count_tokens

log = logging.getLogger("reference_scheduler.gateway")

# (path, json body) -> the upstream's JSON answer, or None when it gave none usable.
Post = Callable[[str, dict[str, Any]], Awaitable[Any]]


class TokenCounter:
    def __init__(self, source: str = "estimate", cache_size: int = 4096) -> None:
        self.source = source
        self.cache_size = cache_size
        self._cache: OrderedDict[bytes, int] = OrderedDict()
        self._file: Any = None
        self.fallbacks = 0  # upstream counts that fell back to the estimate
        self.max_model_len: int | None = None  # the engine's context, as /tokenize reports it
        if source not in ("estimate", "upstream"):
            from tokenizers import Tokenizer

            self._file = Tokenizer.from_file(source)

    @property
    def kind(self) -> str:
        """`upstream`, `tokenizer.json` or `estimate`."""
        return "tokenizer.json" if self._file is not None else self.source

    def local(self, text: str) -> int:
        """The count without the network: the tokenizer.json if there is one, else the estimate."""
        if self._file is not None:
            return len(self._file.encode(text, add_special_tokens=False).ids)
        return count_tokens(text)

    async def count(
        self, text: str, model: str, messages: list[Any] | None, post: Post | None
    ) -> int:
        """The prompt's tokens; `post` asks an upstream (None: no upstream to ask now)."""
        if self.source != "upstream" or post is None:
            return self.local(text)
        key = hashlib.blake2b(
            repr((model, messages if messages is not None else text)).encode(
                "utf-8", "surrogatepass"
            ),
            digest_size=16,
        ).digest()
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        body: dict[str, Any] = {"model": model}
        if messages is not None:
            body["messages"] = messages
        else:
            body["prompt"] = text
        answer = await post("/tokenize", body)
        count = answer.get("count") if isinstance(answer, dict) else None
        if isinstance(answer, dict) and not isinstance(count, int):
            tokens = answer.get("tokens")
            count = len(tokens) if isinstance(tokens, list) else None
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            if self.fallbacks == 0:
                log.warning("upstream /tokenize gave no count; estimating prompts meanwhile")
            self.fallbacks += 1
            return self.local(text)
        context = answer.get("max_model_len") if isinstance(answer, dict) else None
        if isinstance(context, int) and not isinstance(context, bool) and context > 0:
            self.max_model_len = context
        self._cache[key] = count
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return count
