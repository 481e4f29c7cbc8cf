"""An emulated network link for a race: the loopback device's traffic shares R megabits per second.

On one machine every worker reaches the server over loopback, where a round trip costs a few
milliseconds and bandwidth is whatever the CPUs can copy. That hides the case the local-SGD rules
exist for, a cluster whose link is slow next to its compute (a parameter server's network card,
a site's uplink). :func:`emulated_link` puts a token-bucket filter (the kernel's ``tbf`` queueing
discipline, set with ``tc``) on the loopback device for as long as the race runs: every byte any
process sends to another, in either direction, passes one bucket that refills at R Mbit/s, so
hetps's pushes and pulls and DDP's all-reduce pay for their bytes on the same link. The kernel
shapes the traffic, so the emulation costs no CPU. Latency is not emulated (the ``netem``
discipline is not in every kernel); a link's delay is left out.

It needs ``tc`` and the right to change the device's queueing (root, or CAP_NET_ADMIN); without
them :class:`LinkUnavailableError` says what is missing. It refuses to replace a discipline someone
else set, and removes its own when the race ends.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

DEVICE = "lo"
# The bucket holds this much of the rate (and at least MIN_BURST_BYTES, above loopback's 64 KiB
# packets): small enough that the rate holds over a few milliseconds.
BURST_SECONDS = 0.005
MIN_BURST_BYTES = 256 * 1024
# Bytes that may wait in the queue before the kernel drops (TCP then backs off): a quarter of a
# second of the rate, and at least 4 MiB, so a burst of pushes waits instead of being dropped.
QUEUE_SECONDS = 0.25
MIN_QUEUE_BYTES = 4 * 1024 * 1024


class LinkUnavailableError(RuntimeError):
    """The link cannot be set up on this machine; the message says why and what to do."""


@dataclass(frozen=True)
class Link:
    """A shared link of ``megabits_per_second`` (10^6 bits) on ``device``."""

    megabits_per_second: float
    device: str = DEVICE

    def __post_init__(self) -> None:
        if not self.megabits_per_second > 0:
            raise ValueError(f"a link's rate must be positive, not {self.megabits_per_second} Mbit/s")

    @property
    def bytes_per_second(self) -> float:
        return self.megabits_per_second * 1e6 / 8

    def tbf_arguments(self) -> list[str]:
        burst = max(MIN_BURST_BYTES, int(self.bytes_per_second * BURST_SECONDS))
        limit = max(MIN_QUEUE_BYTES, int(self.bytes_per_second * QUEUE_SECONDS))
        rate = f"{round(self.megabits_per_second * 1000)}kbit"
        return ["tbf", "rate", rate, "burst", str(burst), "limit", str(limit)]


def _tc(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["tc", *arguments], capture_output=True, text=True, check=False)


def root_discipline(device: str = DEVICE) -> str:
    """The device's root queueing discipline as ``tc`` names it (``noqueue`` on an untouched loopback)."""
    shown = _tc("qdisc", "show", "dev", device)
    if shown.returncode != 0:
        raise LinkUnavailableError(f"tc cannot read {device}'s queueing: {shown.stderr.strip()}")
    for line in shown.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[0] == "qdisc" and "root" in fields:
            return fields[1]
    return "noqueue"


@contextmanager
def emulated_link(link: Link | None) -> Iterator[None]:
    """Shape ``link.device``'s traffic to the link's rate while the block runs (nothing for ``None``)."""
    if link is None:
        yield
        return
    if shutil.which("tc") is None:
        raise LinkUnavailableError("an emulated link needs tc (Debian package iproute2)")
    existing = root_discipline(link.device)
    if existing not in ("noqueue", "noop"):
        raise LinkUnavailableError(
            f"{link.device} already has a {existing} queueing discipline (an earlier run's link if it is tbf); "
            f"remove it with `tc qdisc del dev {link.device} root` and run again"
        )
    added = _tc("qdisc", "add", "dev", link.device, "root", *link.tbf_arguments())
    if added.returncode != 0:
        raise LinkUnavailableError(
            f"tc could not shape {link.device} ({added.stderr.strip()}): an emulated link needs root or CAP_NET_ADMIN"
        )
    try:
        yield
    finally:
        _tc("qdisc", "del", "dev", link.device, "root")
