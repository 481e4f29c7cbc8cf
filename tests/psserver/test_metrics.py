"""ShardMetrics as a real shard's observer: what each event records, and that departed workers vanish."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest

from psproto import codec
from psproto.layout import Layout
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.rules import PayloadKind, RuleSpec
from psserver.core.shard import PushHeader, Shard, ShardConfig
from psserver.core.workers import PushOutcome, WorkerRecord
from psserver.metrics import STALENESS_BUCKETS, ShardMetrics

LAYOUT = Layout.from_named_shapes([("w", (2, 3)), ("b", (2,))])
GRADIENT = int(PayloadKind.GRADIENT)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "observability.md"


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def time_source() -> FakeTime:
    return FakeTime()


@pytest.fixture
def metrics(time_source: FakeTime) -> ShardMetrics:
    return ShardMetrics(shard_index=3, info={"rule": "asgd"}, wall_clock=time_source)


@pytest.fixture
def shard(metrics: ShardMetrics, time_source: FakeTime) -> Shard:
    # The metrics carry shard label "3"; the shard itself is the only one of its model.
    config = ShardConfig(RuleSpec.parse("asgd", {"lr": "0.5"}), lease_seconds=10.0)
    shard = Shard(config, clock_source=time_source, observer=metrics)
    fast = shard.join("fast", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    shard.join("slow", "cuda:0", False, LAYOUT, LAYOUT.hash)
    assembler = shard.begin_upload(fast, LAYOUT.hash)
    for chunk in codec.encode(torch.zeros(shard.params.numel())):
        shard.decode_chunk(assembler, chunk)
    shard.finish_upload(assembler)
    return shard


def push(shard: Shard, worker_id: int, push_id: int, base_clock: int) -> PushOutcome:
    assert shard.layout is not None
    return shard.push(
        PushHeader(worker_id, push_id, base_clock, GRADIENT, shard.layout.hash, {}),
        codec.encode(torch.ones(shard.params.numel())),
    )


def value(metrics: ShardMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"shard": "3", **labels})


def worker_label_values(registry: CollectorRegistry) -> set[str]:
    return {s.labels["worker"] for family in registry.collect() for s in family.samples if "worker" in s.labels}


def test_pushes_record_staleness_per_worker_and_the_clock(shard: Shard, metrics: ShardMetrics) -> None:
    push(shard, 1, 1, 0)  # fast: τ 0
    push(shard, 1, 2, 1)  # fast: τ 0
    push(shard, 2, 1, 0)  # slow: computed on clock 0, applied at clock 2: τ 2
    assert value(metrics, "hetps_push_staleness_count", worker="fast") == 2
    assert value(metrics, "hetps_push_staleness_sum", worker="fast") == 0
    assert value(metrics, "hetps_push_staleness_sum", worker="slow") == 2
    assert value(metrics, "hetps_push_staleness_bucket", worker="slow", le="1.0") == 0
    assert value(metrics, "hetps_push_staleness_bucket", worker="slow", le="2.0") == 1
    assert value(metrics, "hetps_pushes_total", worker="fast") == 2
    assert value(metrics, "hetps_push_scale_sum", worker="slow") == 1.0  # ASGD applies every push unscaled
    assert value(metrics, "hetps_clock") == shard.clock == 3
    assert value(metrics, "hetps_updates_applied_total") == shard.applied_pushes == 3
    assert value(metrics, "hetps_apply_duration_seconds_count") == 3
    # Every byte of the pushes was counted: 8 fp32 elements each, the whole of this shard's share.
    assert value(metrics, "hetps_received_bytes_total", worker="fast") == 2 * 4 * shard.params.numel()
    assert value(metrics, "hetps_shard_info", rule="asgd") == 1


def test_staleness_buckets_are_the_documented_powers_of_two() -> None:
    assert STALENESS_BUCKETS == (0, 1, 2, 4, 8, 16, 32, 64, 128)
    exposition = generate_latest(ShardMetrics().registry).decode()
    assert "hetps_push_staleness" in exposition


def test_gap_and_scale_come_from_the_rules_telemetry(shard: Shard, metrics: ShardMetrics) -> None:
    worker = shard.workers[1]
    outcome = PushOutcome(clock=1, staleness=4, telemetry={"staleness": 4.0, "scale": 0.25, "gap": 0.6})
    metrics.update_applied(0.001, 1)
    metrics.push_applied(worker, outcome)
    nan = PushOutcome(clock=2, staleness=0, telemetry={"scale": float("nan")})
    metrics.update_applied(0.001, 2)
    metrics.push_applied(worker, nan)  # a non-finite value would poison the sum forever
    assert value(metrics, "hetps_push_gap_sum", worker="fast") == pytest.approx(0.6)
    assert value(metrics, "hetps_push_gap_bucket", worker="fast", le="0.5") == 0
    assert value(metrics, "hetps_push_gap_bucket", worker="fast", le="1.0") == 1
    assert value(metrics, "hetps_push_scale_sum", worker="fast") == 0.25
    assert value(metrics, "hetps_push_scale_count", worker="fast") == 1
    # A rule that reports no gap leaves no gap series behind.
    assert value(metrics, "hetps_push_gap_count", worker="slow") is None


def test_dylus_assigned_local_steps_per_worker_and_dns_momentum_updates(
    metrics: ShardMetrics, time_source: FakeTime
) -> None:
    # A real shard running diloco-dn with DyLU: the fast worker pushes every 4 s, the slow one every 16 s.
    config = ShardConfig(RuleSpec.parse("diloco-dn", {"window": "8", "dylu": "true", "period": "2"}))
    shard = Shard(config, clock_source=time_source, observer=metrics)
    fast = shard.join("fast", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    slow = shard.join("slow", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    assembler = shard.begin_upload(fast, LAYOUT.hash)
    for chunk in codec.encode(torch.zeros(shard.params.numel())):
        shard.decode_chunk(assembler, chunk)
    shard.finish_upload(assembler)
    assert value(metrics, "hetps_worker_local_steps", worker="fast") is None  # nothing assigned yet
    assert value(metrics, "hetps_momentum_steps_total") == 0
    start = time_source.now
    for push_id, (worker_id, at) in enumerate([(fast, 0.0), (slow, 0.0), (fast, 4.0), (slow, 16.0)], start=1):
        time_source.now = start + at
        shard.pull(worker_id, 0)
        shard.push(
            PushHeader(worker_id, push_id, shard.clock, int(PayloadKind.DELTA), LAYOUT.hash, {}),
            codec.encode(torch.full((shard.params.numel(),), 0.01)),
        )
    assert value(metrics, "hetps_worker_local_steps", worker="fast") == 8
    assert value(metrics, "hetps_worker_local_steps", worker="slow") == 2  # floor(0.5 / 2 × 8)
    assert value(metrics, "hetps_momentum_steps_total") == 2  # pushes 2 and 4 closed a period of 2
    shard.leave(slow)
    assert value(metrics, "hetps_worker_local_steps", worker="slow") is None


def test_held_pulls_are_timed(metrics: ShardMetrics) -> None:
    worker = WorkerRecord(1, "a", "cpu", False)
    metrics.pull_held(worker, 0.3)
    metrics.pull_held(worker, 0.01)
    assert value(metrics, "hetps_pull_hold_seconds_count") == 2
    assert value(metrics, "hetps_pull_hold_seconds_sum") == pytest.approx(0.31)


def test_snapshots_dropped_for_memory_are_counted(metrics: ShardMetrics, time_source: FakeTime) -> None:
    assert value(metrics, "hetps_snapshots_dropped_total") == 0  # exported from the start
    per_version = LAYOUT.total_length * 4
    config = ShardConfig(RuleSpec.parse("gap-aware", {"lr": "0.5"}), snapshot_memory_bytes=per_version)
    shard = Shard(config, clock_source=time_source, observer=metrics)
    ids = [shard.join(name, "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id for name in ("fast", "slow")]
    assembler = shard.begin_upload(ids[0], LAYOUT.hash)
    for chunk in codec.encode(torch.zeros(shard.params.numel())):
        shard.decode_chunk(assembler, chunk)
    shard.finish_upload(assembler)
    shard.pull(ids[0], 0)
    shard.pull(ids[1], 0)  # both hold clock 0
    push(shard, ids[0], 1, 0)
    shard.pull(ids[0], 0)  # clock 1 fits only by dropping clock 0, which "slow" still needs
    assert shard.snapshots.dropped_for_memory == 1
    assert value(metrics, "hetps_snapshots_dropped_total") == 1
    assert push(shard, ids[1], 1, 0).telemetry.get("snapshot_missing") == 1.0


def test_pulls_duplicates_and_heartbeats(shard: Shard, metrics: ShardMetrics) -> None:
    result = shard.pull(2, 0)
    push(shard, 2, 7, 0)
    assert push(shard, 2, 7, 0).duplicate
    shard.heartbeat(2, {"compute_seconds": 0.02, "samples_per_second": 3200.0, "unrelated": 1.0})
    assert value(metrics, "hetps_pulls_total", worker="slow") == 1
    assert value(metrics, "hetps_sent_bytes_total", worker="slow") == sum(len(c.data) for c in result.chunks)
    assert value(metrics, "hetps_duplicate_pushes_total", worker="slow") == 1
    assert value(metrics, "hetps_pushes_total", worker="slow") == 1
    assert value(metrics, "hetps_worker_compute_seconds", worker="slow") == 0.02
    assert value(metrics, "hetps_worker_samples_per_second", worker="slow") == 3200.0


def test_rejections_by_reason_shard_wide_and_per_worker(shard: Shard, metrics: ShardMetrics) -> None:
    with pytest.raises(ShardError):
        shard.heartbeat(99, {})  # unknown worker: nobody to blame
    with pytest.raises(ShardError):
        push(shard, 1, 1, 5)  # a base clock from the future
    assert value(metrics, "hetps_rejected_requests_total", reason="unknown_worker") == 1
    assert value(metrics, "hetps_rejected_requests_total", reason="future_clock") == 1
    assert value(metrics, "hetps_worker_rejected_requests_total", worker="fast", reason="future_clock") == 1
    assert shard.rejected == {"unknown_worker": 1, "future_clock": 1}


def test_observers_get_pull_series_but_no_push_series(shard: Shard, metrics: ShardMetrics) -> None:
    assert shard.layout is not None
    watcher = shard.join("watcher", "cpu", True, shard.layout, shard.layout.hash).worker.worker_id
    shard.pull(watcher, 0)
    assert value(metrics, "hetps_active_workers", role="observer") == 1
    assert value(metrics, "hetps_active_workers", role="worker") == 2
    assert value(metrics, "hetps_pulls_total", worker="watcher") == 1
    for name in ("hetps_pushes_total", "hetps_push_staleness_count", "hetps_received_bytes_total"):
        assert value(metrics, name, worker="watcher") is None


def test_a_departed_workers_series_are_removed(shard: Shard, metrics: ShardMetrics) -> None:
    push(shard, 1, 1, 0)
    with pytest.raises(ShardError):
        push(shard, 1, 2, 9)
    shard.heartbeat(1, {"samples_per_second": 10.0, "compute_seconds": 0.1})
    metrics.update_applied(0.0, 2)
    metrics.push_applied(shard.workers[1], PushOutcome(2, 0, {"gap": 0.1, "scale": 1.0}))
    fast = shard.workers[1]
    assert "fast" in worker_label_values(metrics.registry)

    shard.leave(1)
    assert worker_label_values(metrics.registry) == {"slow"}
    assert metrics.worker_names() == {"slow"}
    # Events about the departed worker that race its leave do not bring its series back.
    metrics.pulled(fast, 3, 100)
    metrics.rejected("unknown_worker", fast)
    metrics.heartbeat(fast, {"samples_per_second": 1.0})
    assert worker_label_values(metrics.registry) == {"slow"}
    assert value(metrics, "hetps_active_workers", role="worker") == 1
    assert value(metrics, "hetps_evictions_total") == 0
    # The shard-wide totals keep what the departed worker did.
    assert value(metrics, "hetps_updates_applied_total") == 2
    assert value(metrics, "hetps_rejected_requests_total", reason="future_clock") == 1


def test_a_name_back_after_leaving_counts_afresh_and_late_events_write_nothing(
    shard: Shard, metrics: ShardMetrics
) -> None:
    assert shard.layout is not None
    push(shard, 1, 1, 0)
    shard.heartbeat(1, {"samples_per_second": 10.0})
    fast = shard.workers[1]
    shard.leave(1)
    # Every per-worker hook, for the record that left: none may write to a removed series.
    metrics.push_applied(fast, PushOutcome(2, 0, {"gap": 0.1, "scale": 1.0, "local_steps": 4.0}))
    metrics.push_duplicate(fast)
    metrics.bytes_received(fast, 100)
    metrics.pulled(fast, 2, 100)
    metrics.heartbeat(fast, {"samples_per_second": 1.0, "compute_seconds": 0.1})
    assert worker_label_values(metrics.registry) == {"slow"}
    again = shard.join("fast", "cpu", False, shard.layout, shard.layout.hash).worker.worker_id
    assert value(metrics, "hetps_pushes_total", worker="fast") == 0
    assert value(metrics, "hetps_received_bytes_total", worker="fast") == 0
    assert value(metrics, "hetps_worker_samples_per_second", worker="fast") is None
    push(shard, again, 2, 1)
    assert value(metrics, "hetps_pushes_total", worker="fast") == 1
    assert value(metrics, "hetps_push_staleness_count", worker="fast") == 1
    assert value(metrics, "hetps_received_bytes_total", worker="fast") == 4 * shard.params.numel()


def test_an_evicted_workers_series_are_removed(shard: Shard, metrics: ShardMetrics, time_source: FakeTime) -> None:
    push(shard, 2, 1, 0)
    time_source.now += 5
    shard.heartbeat(1, {})
    time_source.now += 6  # slow has been silent for 11 s, longer than the 10 s lease
    assert [w.name for w in shard.evict_expired()] == ["slow"]
    assert worker_label_values(metrics.registry) == {"fast"}
    assert value(metrics, "hetps_evictions_total") == 1
    assert value(metrics, "hetps_active_workers", role="worker") == 1


def test_a_name_resumed_keeps_one_series_and_a_second_live_holder_is_refused(
    shard: Shard, metrics: ShardMetrics
) -> None:
    assert shard.layout is not None
    push(shard, 1, 1, 0)
    with pytest.raises(ShardError) as refused:
        shard.join("fast", "cpu", False, shard.layout, shard.layout.hash)
    assert refused.value.kind is ErrorKind.NAME_IN_USE
    assert value(metrics, "hetps_pushes_total", worker="fast") == 1
    again = shard.join("fast", "cpu", False, shard.layout, shard.layout.hash, resume=True).worker.worker_id
    assert 1 not in shard.workers
    push(shard, again, 2, 1)
    # The replaced record took its series with it; the resumed one counts afresh (a counter reset).
    assert value(metrics, "hetps_pushes_total", worker="fast") == 1
    shard.leave(again)
    assert worker_label_values(metrics.registry) == {"slow"}


def test_checkpoint_age_only_once_a_checkpoint_exists(metrics: ShardMetrics, time_source: FakeTime) -> None:
    assert value(metrics, "hetps_checkpoint_age_seconds") is None
    metrics.checkpoint_written()
    time_source.now += 42
    assert value(metrics, "hetps_checkpoint_age_seconds") == 42
    assert value(metrics, "hetps_checkpoint_last_timestamp_seconds") == 1000.0
    metrics.clock_restored(500)
    assert value(metrics, "hetps_clock") == 500


def test_the_docs_describe_every_metric_the_server_exports() -> None:
    metrics = ShardMetrics(process_metrics=True)
    metrics.checkpoint_written()
    exported = {family.name for family in metrics.registry.collect() if family.name.startswith("hetps_")}
    # The first cell of each row of the docs' metric tables.
    documented = set(re.findall(r"^\| `(hetps_[a-z_]+)` \|", DOCS.read_text(), flags=re.MULTILINE))
    # prometheus-client names a counter's family without its `_total`, an info metric without `_info`.
    documented_families = {re.sub(r"_(total|info)$", "", name) for name in documented}
    assert exported - documented_families == set(), "exported but not documented"
    assert documented_families - exported == set(), "documented but not exported"
