"""Load: 32 workers push and pull concurrently for 25 s; no errors, and the server's memory stays flat.

Resident memory is compared from :data:`WARM_S` on, once caches and pools are filled (the server
reaches its level in about 5 s). Over the remaining 17 s (about 4,500 pushes at the 260-300
pushes/s a loaded 2-core host makes) :data:`GROWTH_MIB` is about 3.5 KB a push: a push that leaves
behind any of its 197 KB message fails, and so did a server made to keep 4 KB of every push (18 MiB
grown); a steady server grows 4-7 MiB there.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from psproto.layout import Layout
from pstools.launcher import start_server
from pstools.warm_start import stop_process
from psworker.client import NO_RETRY, ClientConfig, PSClient

pytestmark = pytest.mark.integration

WORKERS = 32
SECONDS = 25.0
WARM_S = 8.0
# The most resident memory may grow from WARM_S to the end, and the most a sample may exceed its first.
GROWTH_MIB = 15.0
PEAK_MIB = 25.0
LAYOUT = Layout.from_named_shapes([("w", (256, 192)), ("b", (192,))])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_32_workers_for_25_seconds(tmp_path: Path) -> None:
    process, address = start_server(
        tmp_path, "momentum", 0.001, (), extra_args=["--consistency", "ssp", "--ssp-bound", "8"]
    )
    errors: list[str] = []
    pushes = [0] * WORKERS
    stop = threading.Event()
    ready = threading.Barrier(WORKERS + 1)

    def work(rank: int) -> None:
        try:
            with PSClient(address, LAYOUT, name=f"load-{rank}", config=ClientConfig(retry=NO_RETRY)) as client:
                params = torch.empty(LAYOUT.total_length)
                if not client.initialized:
                    client.init(torch.zeros(LAYOUT.total_length))
                client.pull(params)
                gradient = torch.full((LAYOUT.total_length,), 1e-3)
                ready.wait(120)
                while not stop.is_set():
                    client.push(gradient, pull_into=params)
                    pushes[rank] += 1
        except Exception as error:  # every error fails the test
            errors.append(f"load-{rank}: {error!r}")
            if not ready.broken:
                ready.abort()

    threads = [threading.Thread(target=work, args=(rank,), daemon=True) for rank in range(WORKERS)]
    samples: list[tuple[float, float]] = []
    try:
        for thread in threads:
            thread.start()
        ready.wait(120)
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < SECONDS and not errors:
            samples.append((elapsed, rss_mib(process.pid)))
            time.sleep(1.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        code = stop_process(process)
    assert not errors, errors[:5]
    assert code == 0
    total = sum(pushes)
    assert min(pushes) > 0
    # The first seconds fill caches and pools; after that resident memory must stay flat.
    warm = [rss for t, rss in samples if t >= WARM_S]
    first, last, peak = warm[0], warm[-1], max(warm)
    report = {
        "workers": WORKERS,
        "seconds": SECONDS,
        "pushes": total,
        "pushes_per_second": round(total / SECONDS, 1),
        "rss_mib_at_start": round(samples[0][1], 1),
        "rss_mib_when_warm": round(first, 1),
        "rss_mib_at_end": round(last, 1),
        "rss_mib_peak": round(peak, 1),
        "rss_samples": [[round(t, 1), round(r, 1)] for t, r in samples],
    }
    (tmp_path / "load-report.json").write_text(json.dumps(report, indent=1))
    print(f"\nload: {json.dumps({k: v for k, v in report.items() if k != 'rss_samples'})}")
    assert last - first < GROWTH_MIB, report
    assert peak - first < PEAK_MIB, report
