"""The Grafana dashboard: real metric names, consistent files (promtool's checks of its PromQL and of the
example Prometheus config: test_dashboard_integ.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from psserver.metrics import ShardMetrics
from tests.psserver.test_metrics import primary_view

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "hetps.json"

# Grafana's variables, replaced by what Grafana would put there.
_GRAFANA_DURATIONS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}


def load_dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # panels inside a collapsed row


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    found = [
        (f"{panel['title']} / {target['refId']}", target["expr"])
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["query"]["query"])
            assert match, f"variable {variable['name']}: expected label_values(selector, label)"
            found.append((f"variable {variable['name']}", match.group(1)))
    return found


def as_promql(expr: str) -> str:
    """The query as Prometheus receives it from Grafana: durations filled in, variables as `.*`."""
    for variable, duration in _GRAFANA_DURATIONS.items():
        expr = expr.replace(variable, duration)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (a small lexer: enough for dashboard queries)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    expr = re.sub(r"\{[^}]*\}", " ", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", " ", expr)  # range selectors
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
        followed_by_call = expr[match.end() :].lstrip().startswith("(")
        if not followed_by_call and match.group() not in _KEYWORDS | {"Inf", "NaN", "inf", "nan"}:
            names.add(match.group())
    return names


def exported_sample_names() -> set[str]:
    """Every sample name a server's registry can export, from each family's type."""
    metrics = ShardMetrics(process_metrics=True)
    metrics.checkpoint_written()  # checkpoint metrics exist only once a checkpoint does
    metrics.watch_replica(primary_view)  # replica metrics exist only on a replica, backups' on its primary
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_count", "_sum"),
        "summary": ("_count", "_sum", ""),
        "info": ("_info",),
        "gauge": ("",),
    }
    return {family.name + suffix for family in metrics.registry.collect() for suffix in suffixes[family.type]}


def test_the_lexer_finds_metric_names_and_nothing_else() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (worker, le) (rate(a_bucket{x=~"$y", le!="1e3"}[5m]))) '
        "/ on (worker) group_left b_total > bool 1e3 or max(c) without (shard) offset 5m"
    )
    assert metric_names(as_promql(expr)) == {"a_bucket", "b_total", "c"}


def test_every_query_names_only_metrics_the_server_exports() -> None:
    exported = exported_sample_names()
    for where, expr in queries(load_dashboard()):
        names = metric_names(as_promql(expr))
        assert names, f"{where}: no metric in {expr!r}"
        assert names <= exported, f"{where}: {sorted(names - exported)} not exported by psserver"


def test_the_dashboard_covers_what_the_issue_asks_for() -> None:
    exprs = " ".join(expr for _, expr in queries(load_dashboard()))
    for metric in (
        "hetps_push_staleness_bucket",
        "hetps_push_gap_sum",
        "hetps_push_scale_sum",
        "hetps_worker_samples_per_second",
        "hetps_updates_applied_total",
        "hetps_received_bytes_total",
        "hetps_sent_bytes_total",
        "hetps_rejected_requests_total",
        "hetps_rpc_duration_seconds_bucket",
        "hetps_apply_duration_seconds_bucket",
        "hetps_replica_role",
        "hetps_replica_epoch",
        "hetps_replica_failovers_total",
        "hetps_replica_digest_mismatches_total",
        "hetps_backup_in_sync",
        "hetps_backup_lag_versions",
        "hetps_backup_lag_seconds",
        "hetps_backup_lag_bytes",
    ):
        assert metric in exprs, metric
    ids = [panel["id"] for panel in panels(load_dashboard())]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_panels_use_the_provisioned_datasource() -> None:
    dashboard = load_dashboard()
    provisioned = (DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text()
    uid = re.search(r"^\s*uid:\s*(\S+)", provisioned, re.MULTILINE)
    assert uid is not None
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "datasource"]
    assert variable["current"]["value"] == uid.group(1)
    for panel in panels(dashboard):
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
    provider = (DOCKER / "grafana" / "provisioning" / "dashboards" / "hetps.yaml").read_text()
    assert "path: /var/lib/grafana/dashboards/hetps" in provider
