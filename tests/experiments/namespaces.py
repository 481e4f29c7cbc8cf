"""Whether this machine lets a test make a network namespace of its own (to shape its loopback)."""

from __future__ import annotations

import shutil
import subprocess


def network_namespace_available() -> bool:
    """``unshare -n`` works and ``ip`` and ``tc`` are installed (root, or CAP_SYS_ADMIN and CAP_NET_ADMIN)."""
    if any(shutil.which(tool) is None for tool in ("unshare", "ip", "tc")):
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False).returncode == 0
