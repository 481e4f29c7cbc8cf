"""One side of ``benchmarks.against_revision``: a hetps server and one worker, both from one source tree.

Run as a script (``python PATH/revision_step.py SHAPES_JSON WIRE_DTYPE``: the model's tensor
shapes, a JSON list of lists, and the wire dtype) with ``PYTHONPATH`` set to the
tree under test, so ``psserver`` and ``psworker`` are that tree's; it imports nothing else of
hetps, and only what every revision compared has kept: ``psserver serve`` with ``--ready-file``
and ``psworker.optim.ParameterServerOptimizer``. Each side runs on its own defaults (allocator,
threads), as a user gets them.

It starts the server (ASGD, one shard), joins, warms up, prints ``ready``, then for every line
``N`` on its standard input takes N steps (fixed gradients, no forward or backward pass: the
step is the round trip and the apply) and prints their times in ms as one JSON list; ``quit``
(or end of input) stops both.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

WARM_UP_STEPS = 20


def _start_server(work_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    ready_file = work_dir / "ready.json"
    command = [sys.executable, "-m", "psserver", "serve", "--host", "127.0.0.1", "--port", "0"]
    command += ["--rule", "asgd", "--lr", "0.01", "--metrics-port", "0", "--ready-file", str(ready_file)]
    log = (work_dir / "server.log").open("wb")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not ready_file.exists():
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the server did not start; see {work_dir / 'server.log'}")
        time.sleep(0.05)
    ready = json.loads(ready_file.read_text())
    return server, f"127.0.0.1:{ready['port']}"


def main() -> None:
    shapes, wire_dtype = json.loads(sys.argv[1]), sys.argv[2]
    from psworker.optim import ParameterServerOptimizer

    torch.manual_seed(0)
    model = nn.ParameterList([nn.Parameter(torch.randn(shape) * 0.01) for shape in shapes])
    gradients = [torch.randn_like(parameter) * 1e-3 for parameter in model]
    with tempfile.TemporaryDirectory(prefix="hetps-ab-") as work:
        server, address = _start_server(Path(work))
        try:
            optimizer = ParameterServerOptimizer(model, address, name=f"ab-{os.getpid()}", wire_dtype=wire_dtype)

            def step() -> float:
                for parameter, gradient in zip(model, gradients, strict=True):
                    parameter.grad = gradient.clone()
                started = time.perf_counter()
                optimizer.step()
                return (time.perf_counter() - started) * 1e3

            for _ in range(WARM_UP_STEPS):
                step()
            print("ready", flush=True)
            for line in sys.stdin:
                if line.strip() == "quit":
                    break
                print(json.dumps([step() for _ in range(int(line))]), flush=True)
            optimizer.close()
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(30)


if __name__ == "__main__":
    main()
