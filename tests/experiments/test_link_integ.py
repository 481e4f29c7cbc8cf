"""The emulated link: a token bucket on the loopback device, tried in a network namespace of its own."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from experiments.harness.link import MIN_BURST_BYTES, MIN_QUEUE_BYTES, Link
from tests.experiments.namespaces import network_namespace_available

# Runs in a fresh network namespace, so the shaping never touches the loopback the rest of the
# machine uses: it times 6 MB over TCP without the link, with it, and shows what is left after.
MEASURE = r"""
import json, socket, subprocess, threading, time
from experiments.harness.link import Link, LinkUnavailableError, emulated_link, root_discipline

subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
PAYLOAD = b"x" * (6 * 1000 * 1000)

def megabits_per_second():
    server = socket.create_server(("127.0.0.1", 0))
    received = []
    def sink():
        connection, _ = server.accept()
        total = 0
        while chunk := connection.recv(1 << 20):
            total += len(chunk)
        received.append(total)
        connection.close()
    thread = threading.Thread(target=sink)
    thread.start()
    began = time.monotonic()
    with socket.create_connection(server.getsockname()) as client:
        client.sendall(PAYLOAD)
    thread.join()
    seconds = time.monotonic() - began
    server.close()
    assert received == [len(PAYLOAD)]
    return len(PAYLOAD) * 8 / seconds / 1e6

free = megabits_per_second()
with emulated_link(Link(80)):
    during = root_discipline()
    shaped = megabits_per_second()
    try:
        with emulated_link(Link(10)):
            refused = None
    except LinkUnavailableError as error:
        refused = str(error)
after = root_discipline()
print(json.dumps({"free": free, "shaped": shaped, "during": during, "after": after, "refused": refused}))
"""


def test_a_link_has_a_positive_rate() -> None:
    with pytest.raises(ValueError, match="positive"):
        Link(0)


def test_the_bucket_and_queue_scale_with_the_rate_above_their_floors() -> None:
    slow = Link(8).tbf_arguments()
    fast = Link(10_000).tbf_arguments()
    assert slow == ["tbf", "rate", "8000kbit", "burst", str(MIN_BURST_BYTES), "limit", str(MIN_QUEUE_BYTES)]
    # 10 Gbit/s is 1.25 GB/s: 5 ms of it in the bucket, a quarter of a second in the queue.
    assert fast[2:] == ["10000000kbit", "burst", "6250000", "limit", "312500000"]


@pytest.mark.skipif(
    not network_namespace_available(), reason="needs unshare, ip, tc and the right to make a network namespace"
)
def test_the_link_holds_traffic_to_its_rate_refuses_a_second_and_is_removed_after() -> None:
    done = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", MEASURE], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout)
    assert measured["during"] == "tbf"
    assert measured["after"] == "noqueue"
    # 6 MB at 80 Mbit/s takes 0.6 s; the first 256 KiB of the bucket pass at once.
    assert 60 <= measured["shaped"] <= 90
    assert measured["free"] >= 5 * measured["shaped"]
    assert "already has a tbf" in measured["refused"]
    assert "tc qdisc del dev lo root" in measured["refused"]
