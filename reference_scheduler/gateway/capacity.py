"""Admission from the gateway's own count: each upstream's capacity, and the scrape's correction.

Why: an engine's /metrics is read once a second (`scrape_interval_s`), so saturation read from
it alone sees a burst only after the engine has queued it; every request of the burst went out
before the first scrape said "full", and the engine's FCFS queue, not the policy, then ordered
them. What the gateway has sent and not seen finish is known at every instant, so admission is
taken from that count, against the engine's capacity:

- sequences: the engine's `max_num_seqs` (vLLM's `--max-num-seqs`, SGLang's
  `max_running_requests`, TGI's `max_batch_size`);
- KV tokens: blocks × block size (vLLM's `vllm:cache_config_info`, SGLang's
  `max_total_num_tokens`, TGI's `max_batch_total_tokens`), against which the gateway counts
  each request's prompt + reserved output (`n` × the cap), up to `max_kv_usage` of it.

Where the capacity comes from, first found wins: the upstream's own `max_num_seqs` /
`kv_cache_tokens` in the gateway file; a cost profile named by `profile:` (a `fairbench
profile` output, a YAML path, or a shipped profile's name: its `max_num_seqs` and
`kv_cache_tokens`); the engine's description (vLLM's cache_config_info on the /metrics the
gateway scrapes anyway; SGLang's `/get_server_info`; TGI's `/info`, read once).

The scrape corrects the count: an engine that shows a queue (more than `max_waiting`) on two
scrapes in a row, although the count says it had room, runs fewer than its capacity says (other
clients share it, or its KV holds less than the profile thought), so the effective sequence
capacity drops to what it was running (in flight less its queue, at least 1). One scrape is not
enough: requests sent just before a scrape sit in vLLM's waiting queue until its next step. Each
scrape that shows no queue and KV below `max_kv_usage` gives back half of what was taken, so a
lasting change holds and a passing one heals in a few seconds. Pure state: no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# vLLM's description of its KV cache, a gauge whose labels carry the numbers.
CACHE_INFO = "vllm:cache_config_info"


@dataclass
class Capacity:
    """One upstream's capacity, and where each number came from (`source`)."""

    seqs: int | None = None  # the engine's max_num_seqs (None: not known)
    kv_tokens: int | None = None  # blocks x block size (None: not known)
    effective_seqs: int | None = None  # seqs, lowered by the scrape's correction
    queued_scrapes: int = 0  # consecutive scrapes that showed a queue
    lowered: int = 0  # times the correction lowered effective_seqs
    seqs_from: str = ""
    kv_from: str = ""

    @property
    def known(self) -> bool:
        """The gateway's own count is in charge: the engine's sequence capacity is known. The
        KV size alone (vLLM says it on every scrape) does not bound how many requests the
        engine takes, so with only that a stale scrape still counts as saturated."""
        return self.seqs is not None

    def set_seqs(self, seqs: int, source: str) -> None:
        if self.seqs is None:
            self.seqs = self.effective_seqs = seqs
            self.seqs_from = source

    def set_kv(self, tokens: int, source: str) -> None:
        if self.kv_tokens is None:
            self.kv_tokens = tokens
            self.kv_from = source

    def seq_limit(self, max_inflight: int) -> int:
        """Requests that may be in flight: the file's max_inflight, and the corrected capacity."""
        if self.effective_seqs is None:
            return max_inflight
        return min(max_inflight, self.effective_seqs)

    def kv_budget(self, max_kv_usage: float) -> int | None:
        """Tokens (prompt + reserved output) that may be in flight, or None (not known)."""
        if self.kv_tokens is None:
            return None
        return max(1, int(self.kv_tokens * max_kv_usage))

    def correct(self, waiting: float, max_waiting: int, kv_full: bool, inflight: int) -> None:
        """A scrape's correction (see the module docstring); `inflight` is the count now."""
        if self.seqs is None or self.effective_seqs is None:
            return
        if waiting > max_waiting:
            self.queued_scrapes += 1
            if self.queued_scrapes >= 2:
                running = max(1, inflight - math.ceil(waiting))
                if running < self.effective_seqs:
                    self.effective_seqs = running
                    self.lowered += 1
            return
        self.queued_scrapes = 0
        if not kv_full and self.effective_seqs < self.seqs:
            self.effective_seqs += math.ceil((self.seqs - self.effective_seqs) / 2)


def from_profile(spec: str) -> tuple[int | None, int | None]:
    """(max_num_seqs, kv_cache_tokens) of a cost profile: a shipped name or a YAML path, as
    the simulator reads it (so a profile's default max_num_seqs, 256, is the engine's too).
    Raises ValueError with a one-line reason."""
    from reference_scheduler.core.costmodel import ProfileError, load_profile

    try:
        profile = load_profile(spec, "profile")
    except (ProfileError, OSError) as error:
        raise ValueError(str(error).removeprefix("profile: ")) from None
    except Exception:  # unreadable YAML and the like: one answer
        raise ValueError(f"cannot read a cost profile at {spec!r}") from None
    return profile.max_num_seqs or None, profile.kv_cache_tokens or None


def _label_int(labels: str, name: str) -> int | None:
    key = f'{name}="'
    at = labels.find(key)
    if at < 0:
        return None
    end = labels.find('"', at + len(key))
    try:
        value = int(labels[at + len(key) : end])
    except ValueError:
        return None
    return value if value > 0 else None


def vllm_kv_tokens(line: str) -> int | None:
    """KV tokens from one `vllm:cache_config_info{...}` line: block_size x num_gpu_blocks."""
    labels = line.split("{", 1)[-1].rsplit("}", 1)[0]
    block, blocks = _label_int(labels, "block_size"), _label_int(labels, "num_gpu_blocks")
    if block is None or blocks is None:
        return None
    return block * blocks


def _positive(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if value > 0 and float(value).is_integer() else None


# The description endpoint each engine has, and the fields (sequences, KV tokens) it gives:
# SGLang's ServerArgs + scheduler init info, TGI's router `Info` (up to v2.2; the v3 router
# dropped both, and then nothing is learned). Names as fairbench/targets/profile/detect.py
# reads them.
DESCRIPTION: dict[str, tuple[str, str, str]] = {
    "sglang": ("/get_server_info", "max_running_requests", "max_total_num_tokens"),
    "tgi": ("/info", "max_batch_size", "max_batch_total_tokens"),
}


def learn_description(capacity: Capacity, engine: str, doc: Any) -> None:
    """Take what an SGLang or TGI description says, where the file said nothing."""
    if engine not in DESCRIPTION or not isinstance(doc, dict):
        return
    path, seqs_key, kv_key = DESCRIPTION[engine]
    seqs, kv = _positive(doc.get(seqs_key)), _positive(doc.get(kv_key))
    if seqs is not None:
        capacity.set_seqs(seqs, f"{path} {seqs_key}")
    if kv is not None:
        capacity.set_kv(kv, f"{path} {kv_key}")
