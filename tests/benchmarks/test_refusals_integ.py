"""``benchmarks.harness.refusals``: a live server's refusals, by reason, from its Prometheus endpoint."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import grpc
import pytest

from benchmarks.harness.processes import Fleet, HetpsJob
from benchmarks.harness.refusals import refused_during, rejected_requests
from psproto.v1 import ps_pb2, ps_pb2_grpc


def test_a_refused_request_is_counted_by_its_reason(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    try:
        server = fleet.start_hetps(HetpsJob("refusals", "tiny", "asgd", (), 0, 1))
        before = rejected_requests(server.ready.metrics_port)
        with grpc.insecure_channel(server.address) as channel:
            stub = ps_pb2_grpc.ParameterServerStub(channel)
            for _ in range(2):
                with pytest.raises(grpc.RpcError) as refused:
                    stub.Heartbeat(ps_pb2.HeartbeatRequest(worker_id=12345), timeout=5)
                assert refused.value.code() is grpc.StatusCode.NOT_FOUND
        assert refused_during(before, rejected_requests(server.ready.metrics_port)) == {"unknown_worker": 2}
    finally:
        fleet.stop()


def test_a_server_without_metrics_reports_nothing_and_unchanged_reasons_are_left_out() -> None:
    assert rejected_requests(None) == Counter()
    assert refused_during(Counter(a=1, b=2), Counter(a=1, b=5, c=1)) == {"b": 3, "c": 1}
