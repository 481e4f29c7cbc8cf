"""Each rule driven over the wire by a client built only from the .proto.

The client (tests/integration/proto_scenario_client.py) imports nothing of hetps: it joins two
workers, pulls and pushes a scripted sequence with different base clocks, and reports the
parameters after every push. They must equal what the rule's equations give: computed here in
closed form for ASGD, SA and momentum, and for every rule by the same scenario applied to the
shard core in this process (whose rules the unit tests check against hand-computed examples).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from psproto.layout import Layout
from psproto.v1 import ps_pb2
from psserver.core.rules import RULES, PayloadKind, RuleSpec
from psserver.core.shard import Shard, ShardConfig
from pstools.inprocess import InProcessService
from tests.integration.conftest import StartServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TENSORS = [("w", [2, 2]), ("b", [2])]
INITIAL = [0.5, -0.25, 1.0, 0.75, -0.5, 0.125]
PUSHES = [
    [1.0, -2.0, 0.5, 0.25, 1.5, -1.0],
    [0.5, 0.5, -1.0, 2.0, -0.25, 0.75],
    [-1.0, 1.0, 0.25, -0.5, 0.5, 2.0],
    [2.0, 0.0, -0.5, 1.0, 1.0, -0.25],
]
LR = 0.1


def _kind(rule: str) -> str:
    return "gradient" if PayloadKind.GRADIENT in RULES[rule].accepted_kinds else "delta"


def _scenario(rule: str) -> dict[str, object]:
    kind = _kind(rule)
    # Worker 1's second push was computed on clock 0 and lands at clock 3: staleness 3.
    steps = [
        ["pull", 0],
        ["pull", 1],
        ["push", 0, kind, PUSHES[0]],
        ["push", 1, kind, PUSHES[1]],
        ["pull", 0],
        ["push", 0, kind, PUSHES[2]],
        ["push", 1, kind, PUSHES[3]],
    ]
    return {"tensors": TENSORS, "initial": INITIAL, "workers": 2, "steps": steps}


def _core_replay(rule: str, scenario: dict[str, object]) -> list[dict[str, object]]:
    """The same scenario applied to the shard core in-process (through the in-process service): the reference."""
    layout = Layout.from_named_shapes((name, tuple(shape)) for name, shape in TENSORS)
    shard = Shard(ShardConfig(RuleSpec.parse(rule, {"lr": str(LR)})))
    workers = [InProcessService(shard, layout, f"w{i}", device="") for i in range(2)]
    workers[0].init(torch.tensor(INITIAL))
    observer = None
    pulled = torch.empty(layout.total_length)
    results = []
    for step in scenario["steps"]:  # type: ignore[attr-defined]
        worker = workers[step[1]]
        if step[0] == "pull":
            worker.pull(pulled)
            continue
        kind = ps_pb2.PAYLOAD_KIND_GRADIENT if step[2] == "gradient" else ps_pb2.PAYLOAD_KIND_DELTA
        (outcome,) = worker.push(torch.tensor(step[3]), kind)
        if observer is None:
            observer = InProcessService(shard, layout, "observer", device="", observer=True)
        observer.pull(pulled)
        results.append({"clock": outcome.clock, "staleness": outcome.staleness, "params": shard.params.tolist()})
    return results


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stubs")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{REPO / 'protos' / 'psproto' / 'v1'}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            "ps.proto",
        ],
        check=True,
        timeout=60,
    )
    return out


def _run_client(stubs: Path, address: str, scenario: dict[str, object], tmp_path: Path) -> list[dict[str, object]]:
    scenario_file = tmp_path / "scenario.json"
    result_file = tmp_path / "result.json"
    scenario_file.write_text(json.dumps(scenario))
    completed = subprocess.run(
        [
            sys.executable,
            str(REPO / "tests" / "integration" / "proto_scenario_client.py"),
            str(stubs),
            address,
            str(scenario_file),
            str(result_file),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(result_file.read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize("rule", sorted(RULES))
def test_a_proto_only_client_sees_each_rule_apply_its_equations(
    rule: str, start_psserver: StartServer, stubs: Path, tmp_path: Path
) -> None:
    scenario = _scenario(rule)
    observed = _run_client(stubs, start_psserver(rule, lr=LR), scenario, tmp_path)
    expected = _core_replay(rule, scenario)
    assert [r["staleness"] for r in observed] == [0, 1, 0, 3] == [r["staleness"] for r in expected]
    assert [r["clock"] for r in observed] == [1, 2, 3, 4]
    for seen, wanted in zip(observed, expected, strict=True):
        torch.testing.assert_close(torch.tensor(seen["params"]), torch.tensor(wanted["params"]), rtol=0, atol=1e-6)
    assert observed[-1]["params"] != INITIAL


def _closed_form(rule: str) -> list[torch.Tensor]:
    theta = torch.tensor(INITIAL, dtype=torch.float64)
    velocity = torch.zeros_like(theta)
    staleness = [0, 1, 0, 3]
    history = []
    for gradient, tau in zip(PUSHES, staleness, strict=True):
        g = torch.tensor(gradient, dtype=torch.float64)
        if rule == "asgd":
            theta = theta - LR * g
        elif rule == "sa":
            theta = theta - LR / max(tau, 1) * g
        elif rule == "momentum":
            velocity = 0.9 * velocity + g
            theta = theta - LR * velocity
        history.append(theta.float())
    return history


@pytest.mark.parametrize("rule", ["asgd", "sa", "momentum"])
def test_closed_form_equations_over_the_wire(
    rule: str, start_psserver: StartServer, stubs: Path, tmp_path: Path
) -> None:
    observed = _run_client(stubs, start_psserver(rule, lr=LR), _scenario(rule), tmp_path)
    for seen, wanted in zip(observed, _closed_form(rule), strict=True):
        torch.testing.assert_close(torch.tensor(seen["params"]), wanted, rtol=0, atol=1e-6)
