"""The suite's one loopback Ray cluster: a head and one more node on 127.0.0.1, one CPU each,
each node offering one unit of a custom resource so a test can pin work to either node.

`two_nodes(names)` is the cluster while the block runs (the driver is disconnected and the
cluster shut down after it); `ray_args(cluster, names)` are the `--ray` / `--ray-resource`
flags that send a command's actors or tasks to it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def two_nodes(names: tuple[str, str]) -> Iterator[Any]:
    """A two-node loopback cluster whose nodes offer one unit of `names[0]` and `names[1]`."""
    import ray
    from ray.cluster_utils import Cluster

    local = {"node_ip_address": "127.0.0.1", "num_cpus": 1}
    c = Cluster(
        initialize_head=True,
        head_node_args={**local, "resources": {names[0]: 1}, "include_dashboard": False},
    )
    c.add_node(**local, resources={names[1]: 1})
    try:
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()


def ray_args(cluster: Any, names: tuple[str, str]) -> list[str]:
    """The flags that run a command's Ray work on `cluster`, point k on node k % 2."""
    return ["--ray", cluster.address, "--ray-resource", names[0], "--ray-resource", names[1]]
