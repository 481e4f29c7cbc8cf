"""The committed stubs must be exactly what the .proto generates."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_generated_code_matches_the_proto(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("gen_proto", REPO / "scripts" / "gen_proto.py")
    assert spec is not None and spec.loader is not None
    gen_proto = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_proto)
    written = gen_proto.generate(tmp_path)
    assert {p.name for p in written} == {"ps_pb2.py", "ps_pb2.pyi", "ps_pb2_grpc.py", "ps_pb2_grpc.pyi"}
    for fresh in written:
        committed = REPO / "psproto" / "v1" / fresh.name
        assert committed.read_text() == fresh.read_text(), f"{committed} is stale: run `make proto`"
