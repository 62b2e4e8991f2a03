"""Cache isolation between tenants: what a scenario asks of the prefix cache, checked.

Why a module of its own: two options decide whether tenants share cached prompt blocks, and
they act at different places. `workloads.X.prefix.across_tenants` is about the *text*: whether
every tenant of a workload draws the same shared prefixes (a common system prompt) or each has
groups of its own (fairbench.plan.materialize). `tenants[i].cache_salt` is about the *cache*:
vLLM's request field, which vLLM mixes into the hash of a prompt's first block
(vllm/v1/core/kv_cache_utils.py, `generate_block_hash_extra_keys`: the salt is an extra key
when `start_token_idx == 0`; every later block's hash chains on it), so two requests of
different salts never share a cached block, whatever their text, and requests of one salt share
exactly what they would unsalted. The simulator honours the salt the same way
(reference_scheduler.core.prefix_cache.salted); the live client sends it to vLLM and to the
reference server, which starts its chained block hashes from the salt.
"""

from __future__ import annotations

from fairbench.workload.models import Scenario

__all__ = ["SALTED_KINDS", "cache_problems", "salt_of"]

# targets that honour cache_salt: vLLM and the reference server read the field (vLLM's rule),
# the simulator hashes with it
SALTED_KINDS = ("vllm", "reference", "sim")


def salt_of(scn: Scenario, tenant: str) -> str | None:
    """The tenant's cache salt (None: unsalted)."""
    for t in scn.tenants:
        if t.id == tenant:
            return t.cache_salt
    return None


def cache_problems(scn: Scenario) -> list[str]:
    """One line per cache option that cannot be honoured, naming the field and the fix."""
    problems = []
    salted = [i for i, t in enumerate(scn.tenants) if t.cache_salt is not None]
    for i, tenant in enumerate(scn.tenants):
        if "cache_salt" in tenant.extra_body:
            problems.append(
                f"tenants[{i}].extra_body.cache_salt: give it as tenants[{i}].cache_salt, so "
                "the simulator honours it too"
            )
    if salted and scn.target.kind not in SALTED_KINDS:
        problems.append(
            f"tenants[{salted[0]}].cache_salt: target kind {scn.target.kind!r} does not read "
            f"cache_salt (it is vLLM's field; honoured by: {', '.join(SALTED_KINDS)}); remove "
            "it or use one of those targets"
        )
    if salted and scn.target.kind == "reference" and scn.target.upstreams:
        problems.append(
            f"tenants[{salted[0]}].cache_salt: with target.upstreams the reference target is a "
            "gateway, which passes the body to engines that may not read cache_salt; remove "
            "it or the upstreams"
        )
    for name, wl in scn.workloads.items():
        prefix = wl.prefix
        if prefix and not prefix.across_tenants and prefix.groups * len(scn.tenants) >= 2**31:
            problems.append(
                f"workloads.{name}.prefix.groups: {prefix.groups} groups for each of "
                f"{len(scn.tenants)} tenants is too many; use fewer groups"
            )
    return problems
