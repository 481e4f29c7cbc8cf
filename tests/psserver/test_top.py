"""``psserver top``: rates and rendering without a network (the live view: test_top_integ.py)."""

from __future__ import annotations

import re

import grpc
from rich.console import Console

from psproto.v1 import ps_pb2
from psserver.top import ShardView, StatusPoller, render


def status(clock: int, pushes: dict[str, int], **stats: dict[str, float]) -> ps_pb2.StatusResponse:
    reply = ps_pb2.StatusResponse(clock=clock, shard_index=0, num_shards=1, uptime_seconds=75.0)
    reply.rule.name = "sa"
    reply.rejected["unknown_worker"] = 2
    for name, count in pushes.items():
        worker = reply.workers.add(worker_name=name, device="cpu", pushes=count, pulls=count, mean_staleness=1.5)
        worker.stats.update(stats.get(name, {}))
        worker.last_telemetry.update({"scale": 0.25, "staleness": 4.0})
        worker.last_staleness = 4
    return reply


class FakeRpcError(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection refused"


def screen(views: list[ShardView], width: int) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(render(views, 1.0, width))
    text = console.export_text()
    console.file.close()
    return text


def test_rates_come_from_the_change_between_two_refreshes() -> None:
    replies = iter([status(100, {"a": 10, "b": 4}), status(160, {"a": 40, "b": 10, "c": 1})])
    now = iter([10.0, 12.0])
    poller = StatusPoller(["x:1"], lambda address: next(replies), now=lambda: next(now))
    first = poller.poll()[0]
    assert first.clock_rate is None and first.push_rates == {}
    second = poller.poll()[0]
    assert second.clock_rate == 30.0
    assert second.push_rates == {"a": 15.0, "b": 3.0}  # c joined since: no rate yet


def test_an_unreachable_shard_shows_its_error_and_is_asked_again() -> None:
    calls = []

    def fetch(address: str) -> ps_pb2.StatusResponse:
        calls.append(address)
        if len(calls) == 1:
            raise FakeRpcError()
        return status(1, {})

    poller = StatusPoller(["x:1"], fetch)
    down = poller.poll()[0]
    assert down.status is None and down.error == "UNAVAILABLE: connection refused"
    assert "UNAVAILABLE: connection refused" in screen([down], 120)
    assert poller.poll()[0].status is not None


def test_the_view_shows_speed_staleness_penalty_and_spread() -> None:
    reply = status(
        500,
        {"gpu-fast": 300, "gpu-slow": 75},
        **{
            "gpu-fast": {"samples_per_second": 8000.0, "compute_seconds": 0.004},
            "gpu-slow": {"samples_per_second": 2000.0, "compute_seconds": 0.016},
        },
    )
    reply.workers[1].last_telemetry["local_steps"] = 2.0  # DyLU assigned the slow worker 2 local steps
    view = ShardView("127.0.0.1:50051", reply, clock_rate=37.5, push_rates={"gpu-fast": 30.0})
    wide = screen([view], 140)
    assert "speed spread 4.0× (fastest gpu-fast, slowest gpu-slow)" in wide
    assert "unknown_worker 2" in wide and "37.5" in wide and "0:01:15" in wide
    fast_row = next(line for line in wide.splitlines() if line.strip().startswith("gpu-fast"))
    assert fast_row.split() == [
        "gpu-fast", "cpu", "8,000", "4.0", "ms", "300", "30.0", "300", "4", "1.50", "0", "–", "0.250", "–", "0.0s"
    ]  # fmt: skip
    assert " H " in next(line for line in wide.splitlines() if "penalty" in line)
    narrow = screen([view], 80)
    assert max(len(line.rstrip()) for line in narrow.splitlines()) <= 80
    slow_row = next(line for line in narrow.splitlines() if line.strip().startswith("gpu-slow"))
    assert slow_row.split() == ["gpu-slow", "2,000", "75", "–", "4", "1.50", "0", "–", "0.250", "2"]


def worker_names(lines: list[str]) -> list[str]:
    return [line.split()[0] for line in lines if re.fullmatch(r"w\d{3}", line.split()[0] if line.split() else "")]


def many_workers(count: int) -> ShardView:
    """``count`` workers at one pace, but w017 (far behind) and w033 (four times slower), when there."""
    reply = status(900, {f"w{i:03d}": 10 for i in range(count)})
    for worker in reply.workers:
        worker.stats["samples_per_second"] = 4000.0
        worker.max_staleness = 3
    if count > 33:
        reply.workers[17].mean_staleness = 40.0
        reply.workers[17].max_staleness = 55
        reply.workers[33].stats["samples_per_second"] = 1000.0
    return ShardView("127.0.0.1:50051", reply)


def test_a_screen_too_short_for_every_worker_lists_those_that_matter_and_sums_up_the_rest() -> None:
    view = many_workers(200)
    console = Console(width=140, height=30, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(render([view], 1.0, 140, height=30))
    lines = console.export_text().rstrip("\n").splitlines()
    console.file.close()
    assert len(lines) <= 30
    listed = worker_names(lines)
    assert "w017" in listed and "w033" in listed  # the furthest behind and the slowest
    others = [name for name in listed if name not in ("w017", "w033")]
    assert others == [f"w{i:03d}" for i in range(200) if i not in (17, 33)][: len(others)]  # then by name
    assert listed == sorted(listed) and len(listed) >= 10
    summary = next(line.split() for line in lines if line.strip().startswith("…"))
    hidden = 200 - len(listed)
    assert summary[:3] == ["…", str(hidden), "more"]
    assert summary[-3:] == [str(10 * hidden), "1.50", "3"]  # their pushes, mean and worst staleness


def test_every_worker_is_listed_when_they_fit_or_when_no_height_is_given() -> None:
    text = screen([many_workers(200)], 140)  # the --once view: every worker, by name
    assert worker_names(text.splitlines()) == [f"w{i:03d}" for i in range(200)]
    assert "… " not in text
    console = Console(width=140, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(render([many_workers(5)], 1.0, 140, height=40))
    assert "… " not in console.export_text()
    console.file.close()


# -- a replicated shard ----------------------------------------------------------------------


def replica_status(role: str, address: str, **standing: object) -> ps_pb2.StatusResponse:
    reply = status(40, {})
    reply.replica.CopyFrom(ps_pb2.ReplicaStatus(role=role, name=f"{address}/ab12cd34", address=address, **standing))
    return reply


def primary_and_backup() -> list[ShardView]:
    primary = replica_status("primary", "10.0.0.1:50051", epoch=3, primary="10.0.0.1:50051", version=120, clock=40)
    primary.replica.in_sync = True
    primary.replica.failovers = 1
    primary.replica.backups.add(
        name="10.0.0.2:50051/x", address="10.0.0.2:50051", in_sync=True, lag_versions=0, lag_bytes=0
    )
    primary.replica.backups.add(
        name="10.0.0.3:50051/y",
        address="10.0.0.3:50051",
        in_sync=False,
        lag_versions=7,
        lag_bytes=3 * 1024 * 1024,
        lag_seconds=2.5,
    )
    backup = replica_status("backup", "10.0.0.2:50051", epoch=3, primary="10.0.0.1:50051", version=118, clock=38)
    backup.replica.in_sync = True
    backup.replica.digest_mismatches = 2
    return [ShardView("10.0.0.1:50051", primary), ShardView("10.0.0.2:50051", backup)]


def row_of(text: str, first: str) -> list[str]:
    return next(line for line in text.splitlines() if line.split()[:2] == ["0", first]).split()


def test_replicas_show_their_standing_and_the_primarys_backups_their_lag() -> None:
    wide = screen(primary_and_backup(), 140)
    assert "replicas" in wide and "backups (as their primary sees them)" in wide
    # shard, replica, role, epoch, primary, in sync, version, clock (the state it holds), failovers, digest mismatches
    primary = ["0", "10.0.0.1:50051", "primary", "3", "10.0.0.1:50051", "yes", "120", "40", "1", "0"]
    backup = ["0", "10.0.0.2:50051", "backup", "3", "10.0.0.1:50051", "yes", "118", "38", "0", "2"]
    assert row_of(wide, "10.0.0.1:50051") == primary
    assert row_of(wide, "10.0.0.2:50051")[:10] == backup
    # shard, backup, primary, in sync, behind, lag bytes, lag
    behind = ["0", "10.0.0.3:50051", "10.0.0.1:50051", "no", "7", "3.0", "MiB", "2.50", "s"]
    assert row_of(wide, "10.0.0.3:50051") == behind
    narrow = screen(primary_and_backup(), 80)
    assert max(len(line.rstrip()) for line in narrow.splitlines()) <= 80
    assert row_of(narrow, "10.0.0.1:50051") == primary[:8]  # failovers and mismatches left out
    assert row_of(narrow, "10.0.0.3:50051") == behind


def test_a_replica_without_a_primary_says_so_and_lone_servers_show_no_replica_tables() -> None:
    candidate = replica_status("candidate", "10.0.0.4:50051")
    text = screen([ShardView("10.0.0.4:50051", candidate)], 120)
    assert row_of(text, "10.0.0.4:50051") == ["0", "10.0.0.4:50051", "candidate", "0", "none", "no", "0", "0", "0", "0"]
    assert "backups" not in text  # a replica that is not primary has none to show
    lone = screen([ShardView("x:1", status(5, {"a": 1}))], 120)
    assert "replicas" not in lone and "backups" not in lone
