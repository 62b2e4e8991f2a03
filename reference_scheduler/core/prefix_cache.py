"""One global prefix cache, shared by every tier (vLLM's automatic prefix caching, simplified).

Blocks are identified by chained hashes (block k's hash covers blocks 0..k), and only full blocks
are cached, so a hit on block k implies hits on every block before it; a request's cached prefix
is the longest run of leading block hashes present. At least one prompt token is always computed
(the last one yields the first output token), as in vLLM. Hit accounting is vLLM's: queries and
hits, in tokens.

Eviction and hot interactive prefixes. A plain LRU lets a burst of best-effort prompts (long and
unique, e.g. documents to embed) flush the short, hot system prompts of the interactive tier, so
the tier that most needs a cache hit loses it to traffic that barely reuses anything. We keep a
segmented LRU (SLRU): blocks last used by a *protected* class (interactive by default) live in a
protected segment of at most `protected_fraction` of the capacity; everything else, and blocks
demoted from the protected segment's cold end, live in the probationary segment, which is always
evicted first. So best-effort churn can only evict other unprotected blocks, and an interactive
prefix leaves the cache only when interactive traffic itself stops touching it. A batch request
still reuses an interactive request's prefix (lookups see both segments).

Memory. The engine reserves KV for each running job in full, and the cache is its own pool of
`blocks` beside it — like an offloaded or distributed KV store (Mooncake), not vLLM's reuse of
free GPU blocks. An earlier version carved the pool out of the jobs' KV; with a realistic pool
size that starved admission and raised TTFT more than the hits saved, so the pool is separate. It
saves prefill compute, not reservation memory.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field


def salted(hashes: Sequence[int], salt: str | None) -> tuple[int, ...]:
    """Chained block hashes under a cache salt, with vLLM's semantics: vLLM mixes `cache_salt`
    into the first block's hash (an extra key where the block starts at token 0,
    vllm/v1/core/kv_cache_utils.py `generate_block_hash_extra_keys`) and every later hash
    chains on it. Re-keying each chained hash by the salt is equivalent for matching: requests
    of different salts share no block, requests of one salt share exactly the blocks they would
    share unsalted. No salt (None) leaves the hashes as they are."""
    if salt is None:
        return tuple(hashes)
    key = hashlib.blake2b(salt.encode("utf-8"), digest_size=16).digest()
    out = []
    for h in hashes:
        digest = hashlib.blake2b(
            (h & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "little"), digest_size=8, key=key
        ).digest()
        out.append(int.from_bytes(digest, "little", signed=True))
    return tuple(out)


class PrefixCacheSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    blocks: int = Field(ge=1, description="cache capacity in KV blocks")
    protected_classes: list[str] = Field(default_factory=lambda: ["interactive"])
    protected_fraction: float = Field(0.5, ge=0, le=1, allow_inf_nan=False)


class PrefixCache:
    def __init__(self, spec: PrefixCacheSpec, block_size: int) -> None:
        self.spec = spec
        self.block_size = block_size
        self.capacity = spec.blocks
        self.protected_cap = int(spec.blocks * spec.protected_fraction)
        self._protected_classes = frozenset(spec.protected_classes)
        self.protected: OrderedDict[int, None] = OrderedDict()  # LRU first
        self.probation: OrderedDict[int, None] = OrderedDict()
        self.query_tokens = 0
        self.hit_tokens = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self.protected) + len(self.probation)

    def __contains__(self, block: int) -> bool:
        return block in self.protected or block in self.probation

    def match(self, hashes: Sequence[int], prompt_tokens: int) -> int:
        """Prompt tokens served from the cache (leading full blocks present), counted as a query."""
        hit_blocks = 0
        for h in hashes:
            if h in self.protected or h in self.probation:
                hit_blocks += 1
            else:
                break
        cached = min(hit_blocks * self.block_size, max(prompt_tokens - 1, 0))
        self.query_tokens += prompt_tokens
        self.hit_tokens += cached
        return cached

    def insert(self, hashes: Sequence[int], slo_class: str) -> None:
        """Record that a job computed (or reused) these blocks: insert or refresh them."""
        protect = slo_class in self._protected_classes and self.protected_cap > 0
        for h in hashes:
            if protect:
                self.probation.pop(h, None)
                self.protected[h] = None
                self.protected.move_to_end(h)
            elif h in self.protected:
                self.protected.move_to_end(h)  # still hot for someone protected
            else:
                self.probation[h] = None
                self.probation.move_to_end(h)
        while len(self.protected) > self.protected_cap:
            cold, _ = self.protected.popitem(last=False)
            self.probation[cold] = None
            self.probation.move_to_end(cold, last=False)  # demoted blocks are the next to go
        while len(self) > self.capacity:
            if self.probation:
                self.probation.popitem(last=False)
            else:
                self.protected.popitem(last=False)
            self.evictions += 1

    def stats(self) -> dict[str, float]:
        return {
            "query_tokens": self.query_tokens,
            "hit_tokens": self.hit_tokens,
            "blocks": len(self),
            "protected_blocks": len(self.protected),
            "evictions": self.evictions,
        }
