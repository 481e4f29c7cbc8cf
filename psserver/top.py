"""``psserver top``: a live terminal view of running shards, refreshed in place from their Status RPC.

One row per worker and shard: its speed (from its heartbeats), how many pushes it makes, how
stale they are, what the rule did to them (gap, applied scale) and, where the rule assigns them, the
local steps ``H`` of its next window. Above it, one row per
shard: clock, clock rate, workers and rejected requests by reason. Rates are the change
between two refreshes. A replicated shard's replicas (each one given with ``--server``) also
show their standing, and its primary each backup's lag. A shard that does not answer shows its
error and is asked again at the next refresh; Ctrl-C quits.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from psproto.security import ClientTls, bearer_metadata, open_channel
from psproto.v1 import ps_pb2, ps_pb2_grpc

Fetch = Callable[[str], ps_pb2.StatusResponse]
_MISSING = "–"


@dataclass
class ShardView:
    """One shard as last seen, with rates against the refresh before."""

    address: str
    status: ps_pb2.StatusResponse | None = None
    error: str | None = None
    clock_rate: float | None = None
    push_rates: dict[str, float] = field(default_factory=dict)


@dataclass
class _Sample:
    at: float
    clock: int
    pushes: dict[str, int]


class StatusPoller:
    """Asks every shard for its Status and derives clock and push rates between calls."""

    def __init__(self, addresses: Sequence[str], fetch: Fetch, now: Callable[[], float] = time.monotonic) -> None:
        self.addresses = list(addresses)
        self._fetch = fetch
        self._now = now
        self._previous: dict[str, _Sample] = {}

    def poll(self) -> list[ShardView]:
        return [self._poll_one(address) for address in self.addresses]

    def _poll_one(self, address: str) -> ShardView:
        try:
            status = self._fetch(address)
        except grpc.RpcError as error:
            self._previous.pop(address, None)
            return ShardView(address, error=f"{error.code().name}: {error.details()}")
        sample = _Sample(self._now(), status.clock, {w.worker_name: w.pushes for w in status.workers})
        view = ShardView(address, status)
        previous = self._previous.get(address)
        if previous is not None and sample.at > previous.at:
            elapsed = sample.at - previous.at
            view.clock_rate = max(0, sample.clock - previous.clock) / elapsed
            view.push_rates = {
                name: max(0, pushes - previous.pushes[name]) / elapsed
                for name, pushes in sample.pushes.items()
                if name in previous.pushes
            }
        self._previous[address] = sample
        return view


class GrpcStatusFetcher:
    """One channel per address, kept open between refreshes; TLS with ``tls``, the token as metadata."""

    def __init__(self, timeout_s: float, tls: ClientTls | None = None, auth_token: str | None = None) -> None:
        self.timeout_s = timeout_s
        self._tls = tls
        self._metadata = bearer_metadata(auth_token)
        self._channels: dict[str, grpc.Channel] = {}

    def __call__(self, address: str) -> ps_pb2.StatusResponse:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(address, self._tls)
        reply: ps_pb2.StatusResponse = ps_pb2_grpc.ParameterServerStub(channel).Status(
            ps_pb2.StatusRequest(), timeout=self.timeout_s, metadata=self._metadata
        )
        return reply

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()


def _number(value: float | None, spec: str, suffix: str = "") -> str:
    return _MISSING if value is None else f"{value:{spec}}{suffix}"


def _seconds(value: float | None) -> str:
    if value is None:
        return _MISSING
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def _uptime(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


# Columns a narrow terminal leaves out, so that the ones the view is for stay readable.
_OPTIONAL_COLUMNS = {"address", "uptime", "device", "step", "pulls", "seen", "failovers", "digest mismatches"}
_WIDE_COLUMNS = 110


def _table(title: str, columns: Sequence[str], rows: Sequence[dict[str, str | Text]], width: int) -> Table:
    shown = [c for c in columns if width >= _WIDE_COLUMNS or c not in _OPTIONAL_COLUMNS]
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    for column in shown:
        left = column in {"worker", "device", "address", "rule", "rejected", "replica", "role", "primary", "backup"}
        table.add_column(column, justify="left" if left else "right", no_wrap=column != "rejected")
    for row in rows:
        table.add_row(*(row.get(column, "") for column in shown))
    return table


def _shard_rows(views: Sequence[ShardView]) -> list[dict[str, str | Text]]:
    rows: list[dict[str, str | Text]] = []
    for view in views:
        status = view.status
        if status is None:
            rows.append({"address": view.address, "rule": Text(view.error or "no answer", style="bold red")})
            continue
        rejected = ", ".join(f"{reason} {count}" for reason, count in sorted(status.rejected.items()))
        rows.append(
            {
                "shard": f"{status.shard_index}/{status.num_shards}",
                "address": view.address,
                "rule": status.rule.name,
                "clock": str(status.clock),
                "updates/s": _number(view.clock_rate, ".1f"),
                "workers": str(sum(1 for w in status.workers if w.role != ps_pb2.ROLE_OBSERVER)),
                "rejected": rejected or "0",
                "uptime": _uptime(status.uptime_seconds),
            }
        )
    return rows


def _need(worker: ps_pb2.WorkerStatus, fastest: float) -> float:
    """How much an operator needs to see this worker, as the metrics choose whose series to keep
    (``psserver.metrics``): how far behind it is, times how much slower it computes than the fastest."""
    speed = worker.stats.get("samples_per_second", 0.0)
    slowness = fastest / speed if speed > 0 and fastest > 0 else 1.0
    return (worker.mean_staleness + 1.0) * slowness


_Listed = tuple[ShardView, int, ps_pb2.WorkerStatus]  # a shard's view, its index, one of its workers


def _shown_workers(views: Sequence[ShardView], limit: int | None) -> tuple[list[_Listed], list[ps_pb2.WorkerStatus]]:
    """The workers to list, by shard and name, and those left out: past ``limit`` rows, the ones that
    matter most are listed (the furthest behind and slowest)."""
    entries = [
        (view, view.status.shard_index, w) for view in views if view.status is not None for w in view.status.workers
    ]
    hidden: list[ps_pb2.WorkerStatus] = []
    if limit is not None and len(entries) > limit:
        fastest = max((w.stats.get("samples_per_second", 0.0) for _, _, w in entries), default=0.0)
        entries.sort(key=lambda entry: (-_need(entry[2], fastest), entry[2].worker_name))
        hidden = [w for _, _, w in entries[limit:]]
        entries = entries[:limit]
    order = {id(view): index for index, view in enumerate(views)}
    entries.sort(key=lambda entry: (order[id(entry[0])], entry[2].worker_name))
    return entries, hidden


def _worker_rows(views: Sequence[ShardView], limit: int | None = None) -> list[dict[str, str | Text]]:
    rows: list[dict[str, str | Text]] = []
    entries, hidden = _shown_workers(views, limit)
    for view, shard_index, w in entries:
        row: dict[str, str | Text] = {
            "worker": w.worker_name,
            "shard": str(shard_index),
            "device": w.device or _MISSING,
            "pulls": str(w.pulls),
            "seen": f"{w.seconds_since_seen:.1f}s",
        }
        if w.role == ps_pb2.ROLE_OBSERVER:
            row["worker"] = Text(f"{w.worker_name} (observer)", style="dim")
        else:
            row |= {
                "samples/s": _number(w.stats.get("samples_per_second"), ",.0f"),
                "step": _seconds(w.stats.get("compute_seconds")),
                "pushes": str(w.pushes),
                "push/s": _number(view.push_rates.get(w.worker_name), ".1f"),
                "τ last": str(w.last_staleness),
                "τ mean": f"{w.mean_staleness:.2f}",
                "τ max": str(w.max_staleness),
                "gap": _number(w.last_telemetry.get("gap"), ".3f"),
                "penalty": _number(w.last_telemetry.get("scale"), ".3f"),
                "H": _number(w.last_telemetry.get("local_steps"), ".0f"),
            }
        rows.append(row)
    if hidden:
        rows.append(
            {
                "worker": Text(f"… {len(hidden)} more", style="dim"),
                "pushes": str(sum(w.pushes for w in hidden)),
                "τ mean": f"{sum(w.mean_staleness for w in hidden) / len(hidden):.2f}",
                "τ max": str(max(w.max_staleness for w in hidden)),
            }
        )
    return rows


_ROLE_STYLES = {"primary": "bold green", "candidate": "yellow", "deposed": "bold red"}


def _yes_no(value: bool) -> Text:
    return Text("yes") if value else Text("no", style="bold red")


def _replica_rows(views: Sequence[ShardView]) -> list[dict[str, str | Text]]:
    rows: list[dict[str, str | Text]] = []
    for view in views:
        if view.status is None or not view.status.HasField("replica"):
            continue
        replica = view.status.replica
        rows.append(
            {
                "shard": str(view.status.shard_index),
                "replica": replica.address or view.address,
                "role": Text(replica.role, style=_ROLE_STYLES.get(replica.role, "")),
                "epoch": str(replica.epoch),
                "primary": replica.primary or Text("none", style="bold red"),
                "in sync": _yes_no(replica.in_sync),
                "version": str(replica.version),
                "clock": str(replica.clock),
                "failovers": str(replica.failovers),
                "digest mismatches": Text(str(replica.digest_mismatches), style="bold red")
                if replica.digest_mismatches
                else "0",
            }
        )
    return rows


def _backup_rows(views: Sequence[ShardView]) -> list[dict[str, str | Text]]:
    rows: list[dict[str, str | Text]] = []
    for view in views:
        if view.status is None:
            continue
        replica = view.status.replica
        for b in sorted(replica.backups, key=lambda b: b.address):
            rows.append(
                {
                    "shard": str(view.status.shard_index),
                    "backup": b.address,
                    "primary": replica.address or view.address,
                    "in sync": _yes_no(b.in_sync),
                    "behind": str(b.lag_versions),
                    "lag bytes": human_size(b.lag_bytes),
                    "lag": _seconds(b.lag_seconds),
                }
            )
    return rows


def replicas_table(views: Sequence[ShardView], width: int = _WIDE_COLUMNS) -> Table | None:
    """Each replica's standing, for the replicated shards among ``views`` (None: only lone servers)."""
    rows = _replica_rows(views)
    columns = (
        "shard",
        "replica",
        "role",
        "epoch",
        "primary",
        "in sync",
        "version",
        "clock",
        "failovers",
        "digest mismatches",
    )
    return _table("replicas", columns, rows, width) if rows else None


def backups_table(views: Sequence[ShardView], width: int = _WIDE_COLUMNS) -> Table | None:
    """Each backup as its primary among ``views`` sees it (None: no primary with backups)."""
    rows = _backup_rows(views)
    columns = ("shard", "backup", "primary", "in sync", "behind", "lag bytes", "lag")
    return _table("backups (as their primary sees them)", columns, rows, width) if rows else None


def _spread(views: Sequence[ShardView]) -> Text:
    """How heterogeneous the cluster is: the fastest worker's speed over the slowest's."""
    speeds: dict[str, float] = {}
    for view in views:
        for w in view.status.workers if view.status else ():
            if "samples_per_second" in w.stats and w.stats["samples_per_second"] > 0:
                speeds[w.worker_name] = w.stats["samples_per_second"]
    if len(speeds) < 2:
        return Text("speed spread: waiting for two workers' heartbeats", style="dim")
    fastest = max(speeds, key=lambda name: speeds[name])
    slowest = min(speeds, key=lambda name: speeds[name])
    return Text(f"speed spread {speeds[fastest] / speeds[slowest]:.1f}× (fastest {fastest}, slowest {slowest})")


def render(
    views: Sequence[ShardView], interval_s: float, width: int = _WIDE_COLUMNS, height: int | None = None
) -> RenderableType:
    """The whole screen for one refresh, for a terminal ``width`` columns wide; given its ``height``,
    the workers that do not fit are summed up in one row, and the ones listed are those that matter
    most (the furthest behind and slowest)."""
    heading = Text.assemble(
        ("hetps top", "bold"),
        f"  {len(views)} shard(s), every {interval_s:g} s, {time.strftime('%H:%M:%S')}  ",
        ("Ctrl-C quits", "dim"),
    )
    sharded = any(view.status is not None and view.status.num_shards > 1 for view in views)
    shard_columns = ("shard", "address", "rule", "clock", "updates/s", "workers", "rejected", "uptime")
    worker_columns = (
        "worker",
        *(("shard",) if sharded else ()),
        "device",
        "samples/s",
        "step",
        "pushes",
        "push/s",
        "pulls",
        "τ last",
        "τ mean",
        "τ max",
        "gap",
        "penalty",
        "H",
        "seen",
    )
    above: list[RenderableType] = [
        heading,
        _table("shards", shard_columns, _shard_rows(views), width),
        *(table for table in (replicas_table(views, width), backups_table(views, width)) if table is not None),
        _spread(views),
    ]
    limit = None if height is None else max(1, height - _lines(Group(*above), width) - _WORKER_TABLE_LINES)
    return Group(*above, _table("workers", worker_columns, _worker_rows(views, limit), width))


# The workers table's lines besides its rows: its title, header, the rule under it, and the row
# that sums up the workers left out.
_WORKER_TABLE_LINES = 4


def _lines(renderable: RenderableType, width: int) -> int:
    """How many lines ``renderable`` takes on a terminal ``width`` columns wide."""
    console = Console(width=width, file=io.StringIO())
    return len(console.render_lines(renderable, console.options, pad=False))


def run_top(
    addresses: Sequence[str],
    interval_s: float,
    once: bool = False,
    console: Console | None = None,
    tls: ClientTls | None = None,
    auth_token: str | None = None,
) -> list[str]:
    """Show the view until Ctrl-C (or once, with ``once``); TLS with ``tls``, ``auth_token`` as bearer token.

    Returns the errors of the shards that did not answer the last refresh (``address: CODE: details``).
    """
    console = console or Console()
    fetcher = GrpcStatusFetcher(timeout_s=max(1.0, min(interval_s, 5.0)), tls=tls, auth_token=auth_token)
    poller = StatusPoller(addresses, fetcher)
    views: list[ShardView] = []
    try:
        views = poller.poll()
        if once:
            console.print(render(views, interval_s, console.width))
        else:
            with Live(
                render(views, interval_s, console.width, console.height),
                console=console,
                auto_refresh=False,
                screen=True,
            ) as live:
                while True:
                    time.sleep(interval_s)
                    views = poller.poll()
                    live.update(render(views, interval_s, console.width, console.height), refresh=True)
    except KeyboardInterrupt:
        pass
    finally:
        fetcher.close()
    return [f"{view.address}: {view.error}" for view in views if view.status is None]
