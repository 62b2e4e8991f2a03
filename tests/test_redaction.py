"""No secret of the scenario reaches any file of a run directory.

Every field that can hold a credential carries one here: the target's api_key, its headers
(every value: any header can be a credential), its extra_body and class_extra_body (auth fields
at any depth), its metrics_url (user-info and a token query parameter), and each tenant's
api_key, headers and extra_body. A real run (the reference server, the secrets on the wire) is
made, and every file it leaves is searched, Parquet contents included.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml

from fairbench.pipeline import run_scenario
from fairbench.run.rundir import REDACTED, RunOptions, redacted
from fairbench.workload.loading import parse_scenario
from tests.loopback import free_port

SECRETS = {
    "target.api_key": "sk-target-0001",
    "target.headers.Authorization": "Bearer hdr-target-0002",
    "target.headers.X-Custom": "custom-target-0003",
    "target.extra_body.auth.password": "pw-target-0004",
    "target.class_extra_body.interactive.access_token": "tok-class-0005",
    "target.metrics_url.userinfo": "urlpass-0006",
    "target.metrics_url.query": "urltoken-0007",
    "tenant.api_key": "sk-tenant-0008",
    "tenant.headers.X-Tenant-Secret": "hdr-tenant-0009",
    "tenant.extra_body.metadata.apiKey": "key-tenant-0010",
    "tenant.extra_body.user_token": "tok-tenant-0011",
}


def secret_scenario() -> dict[str, Any]:
    s = SECRETS
    port = free_port()
    return {
        "name": "secrets",
        "workloads": {"w": {"endpoint": "chat", "prompt_tokens": 8, "output_tokens": 2}},
        "tenants": [
            {
                "id": "a",
                "api_key": s["tenant.api_key"],
                "headers": {"X-Tenant-Secret": s["tenant.headers.X-Tenant-Secret"]},
                "extra_body": {
                    "metadata": {"apiKey": s["tenant.extra_body.metadata.apiKey"]},
                    "user_token": s["tenant.extra_body.user_token"],
                },
                "mix": "w",
                "arrival": {"process": "constant", "rate": "5/s"},
            }
        ],
        "run": {"duration": "1s", "grace": "5s", "timeout": "10s"},
        "target": {
            "kind": "reference",
            "api_key": s["target.api_key"],
            "headers": {
                "Authorization": s["target.headers.Authorization"],
                "X-Custom": s["target.headers.X-Custom"],
            },
            "extra_body": {"auth": {"password": s["target.extra_body.auth.password"]}},
            "class_extra_body": {
                "interactive": {
                    "access_token": s["target.class_extra_body.interactive.access_token"]
                }
            },
            "metrics_url": (
                f"http://scraper:{s['target.metrics_url.userinfo']}@127.0.0.1:{port}/metrics"
                f"?token={s['target.metrics_url.query']}&format=text"
            ),
            "scrape_interval": "0.2s",
        },
        "scheduler": {
            "policy": "fifo",
            "profile": {"constant_step_ms": 1.0, "kv_cache_tokens": 10000},
        },
    }


def test_redacted_covers_every_secret_bearing_field() -> None:
    data = redacted(parse_scenario(secret_scenario()))
    text = yaml.safe_dump(data)
    leaked = [name for name, value in SECRETS.items() if value in text]
    assert leaked == []
    target, tenant = data["target"], data["tenants"][0]
    assert target["headers"] == {"Authorization": REDACTED, "X-Custom": REDACTED}
    assert tenant["headers"] == {"X-Tenant-Secret": REDACTED}
    # what is not a credential stays, so the scenario still says what was run
    assert "&format=text" in target["metrics_url"] and "127.0.0.1" in target["metrics_url"]
    keep = redacted(
        parse_scenario(
            {**secret_scenario(), "target": {"kind": "sim", "extra_body": {"max_tokens": 5}}}
        )
    )
    assert keep["target"]["extra_body"] == {"max_tokens": 5}


def test_no_secret_reaches_any_file_of_a_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    outcome = run_scenario(
        parse_scenario(secret_scenario()), RunOptions(out=out, workers=1, progress=False)
    )
    assert outcome.summary["accounting"]["counts"]["ok"] == 5  # the secrets went on the wire
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {"scenario.yaml", "run.json", "summary.json", "records.parquet"} <= {
        p.name for p in files
    }
    for path in files:
        blob = path.read_bytes()
        if path.suffix == ".parquet":
            blob += str(pq.read_table(path).to_pylist()).encode()
        leaked = [name for name, value in SECRETS.items() if value.encode() in blob]
        assert leaked == [], f"{path.name} holds {leaked}"
