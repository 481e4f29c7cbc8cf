"""ShardMetrics as a real shard's observer: what each event records, and that departed workers vanish."""

from __future__ import annotations

import re
from dataclasses import replace
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
from psserver.metrics import (
    AGGREGATE_WORKER,
    DEFAULT_WORKER_SERIES,
    SELECTION_SECONDS,
    STALENESS_BUCKETS,
    ShardMetrics,
)
from psserver.replication.backups import BackupView
from psserver.replication.node import ReplicaView, Role

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


PRIMARY = ReplicaView(
    role=Role.PRIMARY,
    epoch=3,
    name="10.0.0.1:50051/aaaa",
    address="10.0.0.1:50051",
    primary="10.0.0.1:50051",
    version=120,
    clock=118,
    in_sync=True,
    failovers=1,
    digest_mismatches=2,
    backups=[
        BackupView("10.0.0.2:50051/bbbb", "10.0.0.2:50051", True, 0, 0, 0.0),
        BackupView("10.0.0.3:50051/cccc", "10.0.0.3:50051", False, 7, 4096, 1.5),
    ],
)


def primary_view() -> ReplicaView:
    """A primary at epoch 3 with one backup in sync and one behind."""
    return PRIMARY


def replica_names(registry: CollectorRegistry) -> set[str]:
    return {
        family.name
        for family in registry.collect()
        if family.name.startswith(("hetps_replica", "hetps_backup")) and family.samples
    }


def test_a_lone_server_exports_no_replica_metrics(metrics: ShardMetrics) -> None:
    assert replica_names(metrics.registry) == set()


def test_a_primary_exports_its_standing_and_each_backups_lag(metrics: ShardMetrics) -> None:
    metrics.watch_replica(primary_view)
    me = {"replica": "10.0.0.1:50051/aaaa"}
    roles = {role.value: value(metrics, "hetps_replica_role", **me, role=role.value) for role in Role}
    assert roles == {"candidate": 0, "backup": 0, "primary": 1, "deposed": 0}
    assert value(metrics, "hetps_replica_epoch", **me) == 3
    assert value(metrics, "hetps_replica_in_sync", **me) == 1
    assert value(metrics, "hetps_replica_version", **me) == 120
    assert value(metrics, "hetps_replica_failovers_total", **me) == 1
    assert value(metrics, "hetps_replica_digest_mismatches_total", **me) == 2
    behind = {"backup": "10.0.0.3:50051/cccc"}
    assert value(metrics, "hetps_backup_in_sync", backup="10.0.0.2:50051/bbbb") == 1
    assert value(metrics, "hetps_backup_in_sync", **behind) == 0
    assert value(metrics, "hetps_backup_lag_versions", **behind) == 7
    assert value(metrics, "hetps_backup_lag_bytes", **behind) == 4096
    assert value(metrics, "hetps_backup_lag_seconds", **behind) == 1.5


def test_replica_metrics_are_read_at_each_scrape(metrics: ShardMetrics) -> None:
    """A backup has no backups' series; once promoted, its role and epoch change in the next scrape."""
    views = iter(
        [
            replace(PRIMARY, name="", role=Role.CANDIDATE, epoch=0, backups=[]),  # not registered in etcd yet
            replace(PRIMARY, role=Role.BACKUP, epoch=2, failovers=0, backups=[]),
            PRIMARY,
        ]
    )
    metrics.watch_replica(lambda: next(views))
    assert replica_names(metrics.registry) == set()
    backup = generate_latest(metrics.registry).decode()
    assert 'hetps_replica_role{replica="10.0.0.1:50051/aaaa",role="backup",shard="3"} 1.0' in backup
    assert "hetps_replica_epoch" in backup and "hetps_backup_" not in backup
    primary = generate_latest(metrics.registry).decode()
    assert 'hetps_replica_role{replica="10.0.0.1:50051/aaaa",role="primary",shard="3"} 1.0' in primary
    assert 'hetps_replica_epoch{replica="10.0.0.1:50051/aaaa",shard="3"} 3.0' in primary
    assert 'hetps_backup_lag_versions{backup="10.0.0.3:50051/cccc",shard="3"} 7.0' in primary


def test_the_docs_describe_every_metric_the_server_exports() -> None:
    metrics = ShardMetrics(process_metrics=True)
    metrics.checkpoint_written()
    metrics.watch_replica(primary_view)
    exported = {family.name for family in metrics.registry.collect() if family.name.startswith("hetps_")}
    # The first cell of each row of the docs' metric tables.
    documented = set(re.findall(r"^\| `(hetps_[a-z_]+)` \|", DOCS.read_text(), flags=re.MULTILINE))
    # prometheus-client names a counter's family without its `_total`, an info metric without `_info`.
    documented_families = {re.sub(r"_(total|info)$", "", name) for name in documented}
    assert exported - documented_families == set(), "exported but not documented"
    assert documented_families - exported == set(), "documented but not exported"


# -- a bounded number of workers with series of their own --------------------------------------------


def join_many(metrics: ShardMetrics, count: int) -> list[WorkerRecord]:
    workers = [WorkerRecord(i, f"w{i:03d}", "cpu", False) for i in range(count)]
    for worker in workers:
        metrics.worker_joined(worker)
    return workers


def own_series(metrics: ShardMetrics) -> set[str]:
    """Worker names with series of their own in a scrape (the aggregate's label is empty)."""
    return worker_label_values(metrics.registry) - {AGGREGATE_WORKER}


def total(metrics: ShardMetrics, name: str) -> float:
    """The sum of every series of one sample name, aggregate included."""
    return sum(s.value for family in metrics.registry.collect() for s in family.samples if s.name == name)


def push_round(metrics: ShardMetrics, workers: list[WorkerRecord], clock: int, staleness: dict[str, int]) -> int:
    """Each worker pulls and pushes once (staleness 2 unless given); returns the clock after the round."""
    for worker in workers:
        clock += 1
        metrics.update_applied(0.001, clock)
        metrics.push_applied(worker, PushOutcome(clock, staleness.get(worker.name, 2), {"gap": 0.5, "scale": 0.5}))
        metrics.pulled(worker, clock, 100)
    return clock


def test_512_workers_give_at_most_32_with_series_of_their_own_and_a_small_scrape_counting_all(
    metrics: ShardMetrics, time_source: FakeTime
) -> None:
    workers = join_many(metrics, 512)
    assert metrics.worker_series == DEFAULT_WORKER_SERIES == 32
    assert own_series(metrics) == {f"w{i:03d}" for i in range(32)}  # the first to join, while places were free
    assert value(metrics, "hetps_aggregated_workers", role="worker") == 480
    assert value(metrics, "hetps_active_workers", role="worker") == 512
    clock = 0
    for _ in range(2):
        time_source.now += SELECTION_SECONDS
        metrics.before_scrape()
        pushes_before = total(metrics, "hetps_pushes_total")
        # The worst case for a scrape: every series of every kind, one refusal reason per worker.
        for i, worker in enumerate(workers):
            clock += 1
            metrics.update_applied(0.001, clock)
            outcome = PushOutcome(clock, i % 100, {"gap": 0.5, "scale": 0.5, "local_steps": 4.0})
            metrics.push_applied(worker, outcome)
            metrics.push_duplicate(worker)
            metrics.bytes_received(worker, 100)
            metrics.pulled(worker, clock, 100)
            metrics.heartbeat(worker, {"samples_per_second": 100.0 + i, "compute_seconds": 0.01})
            metrics.rejected("future_clock", worker)
        # Every worker's push is in the sums, whether in its own series or in the aggregate's.
        assert total(metrics, "hetps_pushes_total") - pushes_before == 512
    assert len(own_series(metrics)) == 32
    assert value(metrics, "hetps_aggregated_workers", role="worker") == 480
    assert value(metrics, "hetps_push_staleness_count", worker=AGGREGATE_WORKER) is not None
    scrape = generate_latest(metrics.registry)
    assert len(scrape) < 200_000, len(scrape)  # docs/observability.md states this bound


def test_the_refused_and_the_stragglers_take_the_places_and_the_ones_they_replace_lose_their_series(
    time_source: FakeTime,
) -> None:
    metrics = ShardMetrics(shard_index=3, wall_clock=time_source, worker_series=2)
    workers = join_many(metrics, 6)
    assert own_series(metrics) == {"w000", "w001"}
    clock = push_round(metrics, workers, 0, {"w004": 40})
    metrics.rejected("future_clock", workers[5])
    time_source.now += SELECTION_SECONDS - 1
    assert own_series(metrics) == {"w000", "w001"}  # not revised before SELECTION_SECONDS
    time_source.now += 1
    assert own_series(metrics) == {"w004", "w005"}  # the refused worker first, then the furthest behind
    # Counted before w005 had its own series: in the aggregate, and never moved from it.
    assert value(metrics, "hetps_worker_rejected_requests_total", worker="", reason="future_clock") == 1
    assert value(metrics, "hetps_pushes_total", worker="w005") == 0  # its series start from zero
    assert value(metrics, "hetps_aggregated_workers", role="worker") == 4
    # The one that gave its place up writes to the aggregate, never to a series of its own again.
    aggregate_pushes = value(metrics, "hetps_pushes_total", worker="")
    assert aggregate_pushes is not None
    clock = push_round(metrics, workers[:1], clock, {})
    metrics.rejected("future_clock", workers[0])
    assert own_series(metrics) == {"w004", "w005"}
    assert value(metrics, "hetps_pushes_total", worker="") == aggregate_pushes + 1
    assert value(metrics, "hetps_worker_rejected_requests_total", worker="", reason="future_clock") == 2

    # Refused again, w000 takes back the place of w005, which is no longer refused and no further
    # behind than the rest; then, refused no more and alike the rest, w000 keeps it (no churn
    # among workers alike) until w002 falls clearly further behind.
    clock = push_round(metrics, workers, clock, {"w004": 40})
    time_source.now += SELECTION_SECONDS
    assert own_series(metrics) == {"w000", "w004"}
    # w000 pulls last, so that w005's older parameters put it a little (not clearly) further behind.
    clock = push_round(metrics, workers[::-1], clock, {"w004": 40})
    time_source.now += SELECTION_SECONDS
    assert own_series(metrics) == {"w000", "w004"}
    for _ in range(4):
        clock = push_round(metrics, workers, clock, {"w004": 40, "w002": 30})
    time_source.now += SELECTION_SECONDS
    assert own_series(metrics) == {"w002", "w004"}


def test_a_stalled_worker_takes_a_place_as_its_parameters_age(time_source: FakeTime) -> None:
    metrics = ShardMetrics(shard_index=3, wall_clock=time_source, worker_series=1)
    workers = join_many(metrics, 4)
    clock = push_round(metrics, workers, 0, {"w000": 3, "w001": 3, "w002": 3, "w003": 3})
    metrics.rejected("future_clock", workers[0])
    time_source.now += SELECTION_SECONDS
    assert own_series(metrics) == {"w000"}  # refused: it keeps its place
    assert value(metrics, "hetps_worker_rejected_requests_total", worker="w000", reason="future_clock") == 1
    for _ in range(10):  # w003 is silent while 30 updates are applied (10 times its staleness)
        clock = push_round(metrics, workers[:3], clock, {"w000": 3, "w001": 3, "w002": 3})
    time_source.now += SELECTION_SECONDS
    assert own_series(metrics) == {"w003"}  # every series of w000, its refusals' included, is gone


def test_under_bsp_the_slowest_worker_takes_a_place(time_source: FakeTime) -> None:
    metrics = ShardMetrics(shard_index=3, wall_clock=time_source, worker_series=2)
    workers = join_many(metrics, 4)
    push_round(metrics, workers, 0, {w.name: 0 for w in workers})  # a BSP round: nobody is stale
    for worker in workers:
        metrics.heartbeat(worker, {"samples_per_second": 10.0 if worker.name == "w003" else 100.0})
    time_source.now += SELECTION_SECONDS
    # w003 holds the barrier; the others are alike, so the other place stays where it was.
    assert own_series(metrics) == {"w000", "w003"}
    assert value(metrics, "hetps_worker_samples_per_second", worker="w003") == 10.0  # as last reported


def test_the_aggregates_gauges_are_the_mean_of_the_workers_it_counts(time_source: FakeTime) -> None:
    metrics = ShardMetrics(shard_index=3, wall_clock=time_source, worker_series=1)
    workers = join_many(metrics, 3)
    for worker, speed in zip(workers, (50.0, 10.0, 30.0), strict=True):
        metrics.heartbeat(worker, {"samples_per_second": speed})
    assert value(metrics, "hetps_worker_samples_per_second", worker="w000") == 50.0
    assert value(metrics, "hetps_worker_samples_per_second", worker="") == 20.0
    assert value(metrics, "hetps_worker_compute_seconds", worker="") is None  # nobody reported one
    # Workers leave: the aggregate's counters stay, its gauge goes with the last worker it counted.
    metrics.worker_left(workers[1], evicted=False)
    assert value(metrics, "hetps_worker_samples_per_second", worker="") == 30.0
    assert value(metrics, "hetps_aggregated_workers", role="worker") == 1
    metrics.worker_left(workers[2], evicted=True)
    assert value(metrics, "hetps_worker_samples_per_second", worker="") is None
    assert value(metrics, "hetps_aggregated_workers", role="worker") == 0
    assert value(metrics, "hetps_pushes_total", worker="") == 0
    # A worker with series of its own leaves: the next to join takes the free place at once.
    metrics.worker_left(workers[0], evicted=False)
    metrics.worker_joined(WorkerRecord(7, "late", "cpu", False))
    assert own_series(metrics) == {"late"}


def test_worker_series_0_counts_everyone_in_the_aggregate_and_below_0_is_refused(time_source: FakeTime) -> None:
    metrics = ShardMetrics(shard_index=3, wall_clock=time_source, worker_series=0)
    workers = join_many(metrics, 3)
    push_round(metrics, workers, 0, {})
    time_source.now += SELECTION_SECONDS
    assert own_series(metrics) == set()
    assert value(metrics, "hetps_pushes_total", worker="") == 3
    with pytest.raises(ValueError, match="worker_series must be 0 or more, not -1"):
        ShardMetrics(worker_series=-1)
