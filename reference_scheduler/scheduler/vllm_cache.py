"""vLLM V1's automatic prefix caching, as the `engine: vllm` simulator keeps it
(`scheduler: {engine: vllm, prefix_caching: true}`).

Why it is not core/prefix_cache.py: that cache is a pool of its own beside the jobs' KV (an
offloaded store; docs/architecture.md, decision 8). vLLM's is the KV pool itself
(vllm/v1/core/block_pool.py and kv_cache_manager.py at vllm-project/vllm commit
001cabc1be16a59a70d720ed61a13b678c060a18): a full block, once allocated for a request, is
cached under its chained hash; a request's blocks are shared by every running request whose
prompt begins with the same blocks (a reference count); a freed block stays cached while it
sits in the free queue and is evicted only when an allocation pops it. So a hit saves the
prefill *and* the memory, and the cache competes with running requests for blocks. The rules
followed, one by one:

* The free queue (`FreeKVCacheBlockQueue`) is LRU: blocks never used sit at its head in id
  order; a freed request's blocks are appended at the tail, its last block first (so a chain's
  tail is evicted before its head). An allocation pops from the head, evicting the popped
  block's hash if it had one.
* A lookup (`get_computed_blocks`, for a request with no computed tokens: a new one or a
  preempted one resuming) takes the longest run of leading block hashes that are cached, at
  most `prompt tokens - 1` tokens (the last prompt token is always computed); blocks it takes
  that sat in the free queue leave it (`touch`), which `allocate_slots` counts against the free
  blocks before it allocates.
* Blocks are cached when allocated (`cache_blocks` inside `allocate_slots`): the full blocks of
  the tokens computed after this step. A block whose hash is already cached stays uncached
  (vLLM would keep a duplicate; the model keeps the request's cached blocks a leading run).

Not modelled: blocks filled by generated tokens are not cached (vLLM caches them; here only
prompt blocks have hashes, `Job.block_hashes`), hybrid and sliding-window KV groups, KV events.
The salt of a request (vLLM's `cache_salt`) is already in its hashes
(reference_scheduler.core.prefix_cache.salted).
"""

from __future__ import annotations

from collections import OrderedDict

from reference_scheduler.core.job import Job

__all__ = ["BlockPool"]

_PRIVATE = 1 << 70  # keys of uncached blocks in the free queue: outside every 64-bit hash


class BlockPool:
    """One vLLM instance's KV blocks with prefix caching: free count, free queue, cached
    hashes and their reference counts, and each running request's cached blocks."""

    def __init__(self, blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.fresh = blocks  # never-used blocks, the head of the free queue
        self.queue: OrderedDict[int, None] = OrderedDict()  # freed blocks, LRU first
        self.refs: dict[int, int] = {}  # cached hash -> running requests holding it
        self.held: dict[int, list[int]] = {}  # job seq -> its cached blocks' hashes, in order
        self._private = 0
        self.query_tokens = 0
        self.hit_tokens = 0
        self.evictions = 0

    @property
    def free(self) -> int:
        return self.fresh + len(self.queue)

    def lookup(self, job: Job) -> tuple[list[int], int]:
        """The cached leading blocks of the job's prompt (hashes) and how many of them sit in
        the free queue (touching them takes them out of it)."""
        hit: list[int] = []
        most = max(job.prompt_tokens - 1, 0) // self.block_size
        for h in job.block_hashes[:most]:
            if h not in self.refs:
                break
            hit.append(h)
        return hit, sum(1 for h in hit if self.refs[h] == 0)

    def take(self, job: Job, hit: list[int]) -> int:
        """Touch the hit blocks for `job` (they become its first blocks); the tokens they hold."""
        for h in hit:
            if self.refs[h] == 0:
                del self.queue[h]
            self.refs[h] += 1
        self.held[job.seq] = list(hit)
        tokens = len(hit) * self.block_size
        self.query_tokens += job.prompt_tokens
        self.hit_tokens += tokens
        return tokens

    def allocate(self, n: int) -> None:
        """Pop `n` blocks from the free queue's head (the caller checked `n <= free`)."""
        from_fresh = min(n, self.fresh)
        self.fresh -= from_fresh
        for _ in range(n - from_fresh):
            key, _ = self.queue.popitem(last=False)
            if key < _PRIVATE:  # a cached block: its hash goes with it
                del self.refs[key]
                self.evictions += 1

    def cache(self, job: Job, computed: int) -> None:
        """Cache the job's full prompt blocks among its first `computed` tokens."""
        held = self.held.setdefault(job.seq, [])
        full = min(computed // self.block_size, len(job.block_hashes))
        while len(held) < full:
            h = job.block_hashes[len(held)]
            if h in self.refs:
                return  # cached by another request meanwhile: this one's stays private
            self.refs[h] = 1
            held.append(h)

    def release(self, job: Job) -> int:
        """Free the job's blocks (it finished, was preempted or cancelled); how many returned
        to the free queue. Its last block goes first, its cached head last."""
        held = self.held.pop(job.seq, [])
        returned = 0
        for _ in range(job.blocks - len(held)):
            self._private += 1
            self.queue[_PRIVATE + self._private] = None
            returned += 1
        for h in reversed(held):
            self.refs[h] -= 1
            if self.refs[h] == 0:
                self.queue[h] = None
                returned += 1
        return returned

    def stats(self) -> dict[str, int]:
        return {
            "query_tokens": self.query_tokens,
            "hit_tokens": self.hit_tokens,
            "cached_blocks": len(self.refs),
            "evictions": self.evictions,
        }
