"""Generator health: was the load actually offered as planned, and measured right? (MLPerf
LoadGen's VALID/INVALID.)

A run is INVALID, with the reason, when the generator's send lag p99 exceeds the threshold
(default 5 ms), when its receive error p99 exceeds its own (default 1 ms; judged where the
transport has kernel receive stamps), when a tenant's achieved send rate — or the rate the
server saw, where it reports its own receive times — falls below `min_rate_ratio` of its planned
rate, when the run was stopped before its schedule ended, or when no request succeeded (a run of
failures measures the target's set-up, not its scheduling). Latency from a late generator is
still recorded (from the intended time), but the offered load was not the plan's.

Send lag and the receive side are the two directions of the generator's own error. Receive times
are the kernel's stamps (fairbench.targets.http.stamped), so a loop that reads late does not
move a first token's stamp — unless later bytes reached the socket before the read, because the
kernel merges waiting segments and stamps them at the newest. Per request, the receive delay
(kernel stamp to the loop's read) is reported, and the receive error — 0 when the first token's
bytes were the newest of their read, else the span in which they may have arrived — is what the
verdict bounds: the figure that says how wrong a TTFT can be.

A late generator is nearly always a busy machine, so the lag reason says what the machine was
doing (`MachineLoad`: load average, cores, the CPU this run's processes got) and what to try.
The caller samples those figures around the run; this module only reads them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from fairbench.analysis import frame_memo
from fairbench.analysis.metrics import percentiles, receive_delay_ns, receive_error_ns, send_lag_ns
from fairbench.workload.models import Scenario


def _rate(times_ns: np.ndarray) -> float | None:
    if len(times_ns) < 2:
        return None
    span = float(times_ns.max() - times_ns.min())
    return (len(times_ns) - 1) / (span / 1e9) if span > 0 else None


def _server_rate_ratio(records: pd.DataFrame, rows: np.ndarray) -> float | None:
    """The rate the server saw (from its own receive times, where it reports them) over the
    planned rate of the same requests; None without such times."""
    if "server_received_ns" not in records.columns:
        return None
    seen = records["server_received_ns"].to_numpy(dtype=np.float64, na_value=np.nan)
    have = rows & ~np.isnan(seen)
    if have.sum() < 10:
        return None
    planned = _rate(records["t_intended_ns"].to_numpy(dtype=np.int64)[have])
    server = _rate(seen[have].astype(np.int64))
    return server / planned if planned and server is not None else None


@dataclass(frozen=True)
class MachineLoad:
    """What the machine was doing while the run went: sampled by the caller around it.

    `generator_cpu_s` is the CPU time of the process that ran the schedule; `children_cpu_s` that
    of the children it waited for (the embedded reference server, shard workers). Together over
    `wall_s` they tell a generator starved of CPU (load above the cores, little CPU got) from one
    that was itself the bottleneck (about a core's worth got)."""

    cpus: int
    load_1m: float | None  # None where the platform has no load average
    wall_s: float
    generator_cpu_s: float
    children_cpu_s: float

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def _ms(values: np.ndarray) -> dict[str, float | None]:
    out = {
        k: (None if v is None else round(v / 1e6, 4))
        for k, v in percentiles(values.astype(np.float64), (50, 99)).items()
    }
    out["max"] = round(float(values.max()) / 1e6, 4) if len(values) else None
    return out


def lag_advice(machine: MachineLoad | None) -> str:
    """The sentence after 'generator fell behind': the machine's state and what to try."""
    if machine is None:
        return (
            "no record of the machine's load for this run; try again with other work on the "
            "machine stopped"
        )
    wall = max(machine.wall_s, 1e-9)
    gen_share = machine.generator_cpu_s / wall
    load = "unknown" if machine.load_1m is None else f"{machine.load_1m:.2f}"
    total = machine.generator_cpu_s + machine.children_cpu_s
    state = (
        f"The machine: 1-min load average {load} on {machine.cpus} "
        f"{'core' if machine.cpus == 1 else 'cores'}; this run's processes got "
        f"{total:.1f} s of CPU in {machine.wall_s:.1f} s "
        f"(generator {machine.generator_cpu_s:.1f} s = {gen_share:.0%} of one core, "
        f"its server/workers {machine.children_cpu_s:.1f} s)"
    )
    tries = []
    if machine.load_1m is not None and machine.load_1m >= machine.cpus:
        tries.append(
            "the machine had more runnable work than cores, so the generator waited for a CPU: "
            "stop other work (builds, test suites, browsers) and run again"
        )
    if gen_share >= 0.8:
        tries.append(
            "the generator itself used most of a core: split the plan over processes with "
            "--workers N"
        )
    if not tries:
        tries.append("run again with less else running on the machine")
    tries.append("or serve the target from other cores or another machine (--target-url)")
    return f"{state}. Try: {'; '.join(tries)}"


def generator_health(
    records: pd.DataFrame,
    scn: Scenario,
    loop_lag_ns: np.ndarray | None = None,
    stopped: bool = False,
    virtual: bool = False,
    machine: MachineLoad | None = None,
) -> dict[str, Any]:
    lag_ms = _ms(send_lag_ns(records))
    threshold_ms = scn.health.max_send_lag_p99 * 1e3
    delay = receive_delay_ns(records)
    delay_ms = _ms(delay) if len(delay) else None
    error = receive_error_ns(records)
    error_ms = _ms(error) if len(error) else None
    error_threshold_ms = scn.health.max_receive_error_p99 * 1e3
    closed = scn.run.concurrency_cap
    reasons: list[str] = []
    if stopped:
        reasons.append("the run was stopped before its schedule ended")
    # In a closed-loop run the send lag is the wait for a free slot, by design: reported, and
    # the whole run is labelled closed-loop instead of judged by it.
    if closed is None and lag_ms["p99"] is not None and lag_ms["p99"] > threshold_ms:
        reasons.append(
            f"generator fell behind: send lag p99 {lag_ms['p99']:.2f} ms > {threshold_ms:g} ms. "
            + lag_advice(machine)
        )
    if (
        error_ms is not None
        and error_ms["p99"] is not None
        and error_ms["p99"] > error_threshold_ms
    ):
        late = f"{delay_ms['p99']:.2f}" if delay_ms and delay_ms["p99"] is not None else "?"
        reasons.append(
            f"generator read responses too late for their stamps: receive error p99 "
            f"{error_ms['p99']:.2f} ms > {error_threshold_ms:g} ms (receive delay p99 {late} ms: "
            "first tokens waited in the socket until later bytes joined them, and the kernel "
            "stamps merged bytes at the newest arrival, so TTFT and ITL read high). "
            + lag_advice(machine)
        )
    ok = int((records["status"] == "ok").sum()) if len(records) else 0
    if ok == 0:
        counts = records["status"].value_counts().to_dict() if len(records) else {}
        seen = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no records"
        reasons.append(
            f"no request succeeded ({seen}): the run measured failures, not the target's "
            "scheduling; check the target (its URL, API keys, model name) and the records' "
            "error_detail"
        )
    tenants: dict[str, Any] = {}
    sent_mask = records["t_sent_ns"].notna().to_numpy()
    intended = records["t_intended_ns"].to_numpy(dtype=np.int64)
    sent = records["t_sent_ns"].to_numpy(dtype=np.float64, na_value=np.nan)
    # each tenant's rows by its code (its names sorted, as sorted(set(column)) are), in Arrow
    # for a records frame: a str per record and a compare of them per tenant were 0.26 CPU s
    # of the 10-minute fleet (issue 35)
    codes, names = frame_memo.sorted_codes(records["tenant"])
    for k, tenant in enumerate(names):
        rows = codes == k
        planned_rate = _rate(intended[rows])
        achieved_rate = _rate(sent[rows & sent_mask].astype(np.int64))
        ratio = None
        if planned_rate and achieved_rate is not None:
            ratio = achieved_rate / planned_rate
        tenants[tenant] = {
            "planned": int(rows.sum()),
            "sent": int((rows & sent_mask).sum()),
            "planned_rate_per_s": planned_rate,
            "achieved_rate_per_s": achieved_rate,
            "rate_ratio": ratio,
        }
        if ratio is not None and ratio < scn.health.min_rate_ratio and not stopped and not closed:
            reasons.append(
                f"tenant {tenant}: achieved send rate {ratio:.3f} of planned "
                f"(< {scn.health.min_rate_ratio:g})"
            )
        seen = _server_rate_ratio(records, rows)
        if seen is not None:
            tenants[tenant]["server_seen_rate_ratio"] = seen
            if seen < scn.health.min_rate_ratio and not stopped and not closed:
                reasons.append(
                    f"tenant {tenant}: the server received {seen:.3f} of the planned rate "
                    f"(< {scn.health.min_rate_ratio:g}, by its own receive times): requests "
                    "reached it later than the generator's send stamps say (socket buffers, the "
                    "network, a server too busy to read them)"
                )
    loop = None
    if loop_lag_ns is not None and len(loop_lag_ns):
        loop = {
            k: (None if v is None else round(v / 1e6, 4))
            for k, v in percentiles(loop_lag_ns.astype(np.float64), (50, 99)).items()
        }
    return {
        "closed_loop": None
        if closed is None
        else {
            "concurrency_cap": closed,
            "note": "closed loop: send lag is the wait for one of the capped slots",
        },
        "virtual_time": virtual,
        "send_lag_ms": lag_ms,
        "send_lag_threshold_ms": threshold_ms,
        # None: not measured (virtual time, or no kernel receive stamps on this platform)
        "receive_delay_ms": delay_ms,
        "receive_error_ms": error_ms,
        "receive_error_threshold_ms": error_threshold_ms,
        "event_loop_lag_ms": loop,
        "machine": None if machine is None else machine.as_dict(),
        "tenants": tenants,
        "invalid_reasons": reasons,
        "valid": not reasons,
    }
