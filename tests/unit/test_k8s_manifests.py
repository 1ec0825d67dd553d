"""The Kubernetes manifests of deploy/k8s cannot be applied here (no cluster), so check what can
be checked statically: every document validates strictly against the Kubernetes OpenAPI schemas,
the kustomization lists exactly the manifest files, every volume, probe port and Service points
at something that exists, the commands parse with the services' own argument parsers, the
ConfigMap'd configs load with the project's config loaders, and every secret file a service reads
is mounted, readable by the image's non-root user."""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import yaml

from continuum_common.config import load_listener_config, load_router_config, router_warnings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KUSTOMIZATION = K8S / "kustomization.yaml"
NAMESPACE = "continuum"
# The oldest Kubernetes the manifests target (the floor of the kubernetes-validate pin in the dev
# extra) and the newest the installed package ships schemas for.
KUBERNETES_VERSIONS = sorted({"1.30", kubernetes_validate.latest_version()})
CLUSTER_SCOPED = {"Namespace"}

Doc = dict[str, Any]


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p != KUSTOMIZATION)


def load_documents() -> list[tuple[Path, Doc]]:
    out = []
    for path in manifest_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                out.append((path, doc))
    return out


DOCUMENTS = load_documents()


def ref(doc: Doc) -> str:
    return f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


def of_kind(kind: str) -> dict[str, Doc]:
    return {doc["metadata"]["name"]: doc for _, doc in DOCUMENTS if doc["kind"] == kind}


def deployments() -> dict[str, Doc]:
    return of_kind("Deployment")


def pod(deployment: Doc) -> Doc:
    spec: Doc = deployment["spec"]["template"]["spec"]
    return spec


def container(deployment: Doc) -> Doc:
    containers = pod(deployment)["containers"]
    assert len(containers) == 1, f"{ref(deployment)}: one container expected"
    first: Doc = containers[0]
    return first


def schema_problem(doc: Doc, version: str) -> str | None:
    """None when the document validates strictly against Kubernetes `version`, else a message
    naming the document (kind/name) and the failing field."""
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(p) for p in exc.path) or "(document)"
        return f"{ref(doc)} (Kubernetes {exc.version}): {where}: {exc.message}"
    except kubernetes_validate.SchemaNotFoundError as exc:
        return f"{ref(doc)}: {exc.message}"
    return None


# ------------------------------------------------------------------------------------ schemas


def test_manifests_exist() -> None:
    kinds = {doc["kind"] for _, doc in DOCUMENTS}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "ConfigMap", "Secret"} <= kinds
    assert set(deployments()) == {"ingress", "indexer", "kv-listener", "gemini-cache"}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(("path", "doc"), DOCUMENTS, ids=[f"{p.relative_to(K8S)}:{ref(d)}" for p, d in DOCUMENTS])
def test_document_validates_strictly(path: Path, doc: Doc, version: str) -> None:
    problem = schema_problem(doc, version)
    if problem is not None:
        pytest.fail(f"{path.relative_to(ROOT)}: {problem}")


def test_validator_catches_errors() -> None:
    indexer = deployments()["indexer"]
    version = KUBERNETES_VERSIONS[0]
    assert schema_problem(indexer, version) is None

    wrong_type = copy.deepcopy(indexer)
    wrong_type["spec"]["replicas"] = "two"
    problem = schema_problem(wrong_type, version)
    assert problem is not None and problem.startswith("Deployment/indexer") and "spec.replicas" in problem

    misspelt = copy.deepcopy(indexer)  # strict mode rejects unknown fields
    container(misspelt)["readinessprobe"] = container(misspelt).pop("readinessProbe")
    problem = schema_problem(misspelt, version)
    assert problem is not None and "readinessprobe" in problem

    removed_api = {"apiVersion": "autoscaling/v2beta1", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "x"}}
    problem = schema_problem(removed_api, version)
    assert problem is not None and "HorizontalPodAutoscaler/x" in problem


# ------------------------------------------------------------------------------ kustomization


def test_kustomization_lists_every_manifest_file() -> None:
    kustomization = yaml.safe_load(KUSTOMIZATION.read_text())
    assert kustomization["namespace"] == NAMESPACE
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed)), "a file is listed twice"
    for name in listed:
        assert (K8S / name).is_file(), f"kustomization.yaml lists {name}, which does not exist"
    on_disk = {p.relative_to(K8S).as_posix() for p in manifest_files()}
    assert on_disk - set(listed) == set(), "manifest files missing from kustomization.yaml"
    assert set(listed) <= on_disk


def test_every_namespaced_object_is_in_the_namespace() -> None:
    assert set(of_kind("Namespace")) == {NAMESPACE}
    for path, doc in DOCUMENTS:
        if doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"].get("namespace") == NAMESPACE, f"{path.name}: {ref(doc)}"
    names = [(doc["kind"], doc["metadata"]["name"]) for _, doc in DOCUMENTS]
    assert len(names) == len(set(names)), "two objects share a kind and name"


# ------------------------------------------------------------------------------- deployments


def test_every_deployment_has_probes_and_resources() -> None:
    for name, deployment in deployments().items():
        c = container(deployment)
        for probe in ("readinessProbe", "livenessProbe"):
            assert probe in c, f"{name}: no {probe}"
        requests = c.get("resources", {}).get("requests", {})
        limits = c.get("resources", {}).get("limits", {})
        assert {"cpu", "memory"} <= set(requests), f"{name}: resource requests missing"
        assert "memory" in limits, f"{name}: no memory limit"


def declared_ports(c: Doc) -> dict[str | int, int]:
    ports: dict[str | int, int] = {}
    for port in c.get("ports", []):
        ports[port["containerPort"]] = port["containerPort"]
        if "name" in port:
            ports[port["name"]] = port["containerPort"]
    return ports


def http_probe(c: Doc, probe: str) -> tuple[str, int]:
    action = c[probe].get("httpGet")
    assert action is not None, f"{c['name']}: {probe} is not an httpGet probe"
    ports = declared_ports(c)
    assert action["port"] in ports, f"{c['name']}: {probe} port {action['port']} is not a container port"
    return action["path"], ports[action["port"]]


def test_probes_hit_each_services_health_endpoints() -> None:
    expected = {
        "ingress": {"readinessProbe": ("/readyz", 8080), "livenessProbe": ("/healthz", 8080)},
        # the indexer's and gemini-cache's /healthz fail while Redis or NATS is down: readiness
        # only; their liveness asks /metrics, which the same server always answers
        "indexer": {"readinessProbe": ("/healthz", 9102), "livenessProbe": ("/metrics", 9102)},
        "kv-listener": {"readinessProbe": ("/healthz", 7817), "livenessProbe": ("/healthz", 7817)},
        "gemini-cache": {"readinessProbe": ("/healthz", 9103), "livenessProbe": ("/metrics", 9103)},
    }
    for name, deployment in deployments().items():
        for probe, want in expected[name].items():
            assert http_probe(container(deployment), probe) == want, f"{name} {probe}"


def test_indexer_runs_two_replicas_and_the_listener_one() -> None:
    assert deployments()["indexer"]["spec"]["replicas"] == 2
    listener = deployments()["kv-listener"]["spec"]
    assert listener["replicas"] == 1
    assert listener["strategy"]["type"] == "Recreate"


def test_hpa_scales_the_ingress_deployment() -> None:
    hpas = of_kind("HorizontalPodAutoscaler")
    assert len(hpas) == 1
    (hpa,) = hpas.values()
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == ("apps/v1", "Deployment", "ingress")
    assert target["name"] in deployments()
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 10)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["type"] == "Utilization"
    assert 0 < metric["resource"]["target"]["averageUtilization"] <= 100
    # Utilisation is a fraction of the request: without one the HPA cannot compute it.
    assert "cpu" in container(deployments()["ingress"])["resources"]["requests"]
    # The HPA owns the replica count; a fixed one would be reset on every apply.
    assert "replicas" not in deployments()["ingress"]["spec"]


def dockerfile_uid() -> int:
    match = re.search(r"--uid (\d+)", (ROOT / "deploy" / "compose" / "Dockerfile").read_text())
    assert match, "the Dockerfile no longer creates its user with --uid"
    return int(match[1])


def test_pods_run_as_the_images_non_root_user_on_a_read_only_root() -> None:
    uid = dockerfile_uid()
    for name, deployment in deployments().items():
        spec = pod(deployment)
        security = spec["securityContext"]
        assert security["runAsNonRoot"] is True, name
        assert security["runAsUser"] == uid, name
        # fsGroup gives the mounted secret files (mode 0440) the group the user runs with
        assert security["fsGroup"] == security["runAsGroup"], name
        assert spec["automountServiceAccountToken"] is False, name
        c = container(deployment)
        assert c["image"].split(":")[0] == "continuum", name
        assert c["securityContext"]["readOnlyRootFilesystem"] is True, name
        assert c["securityContext"]["allowPrivilegeEscalation"] is False, name
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], name
        volumes = {v["name"]: v for v in spec["volumes"]}
        tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
        assert tmp and "emptyDir" in volumes[tmp[0]["name"]], f"{name}: /tmp must be a writable emptyDir"


def test_mounted_configmaps_and_secrets_exist() -> None:
    config_maps, secrets = of_kind("ConfigMap"), of_kind("Secret")
    for name, deployment in deployments().items():
        volumes = {v["name"]: v for v in pod(deployment)["volumes"]}
        for mount in container(deployment)["volumeMounts"]:
            assert mount["name"] in volumes, f"{name}: mount of undeclared volume {mount['name']}"
        for volume in volumes.values():
            if "configMap" in volume:
                source = volume["configMap"]
                assert source["name"] in config_maps, f"{name}: ConfigMap {source['name']} is not in the manifests"
                keys = set(config_maps[source["name"]].get("data", {}))
            elif "secret" in volume:
                source = volume["secret"]
                assert source["secretName"] in secrets, f"{name}: Secret {source['secretName']} is not in the manifests"
                secret = secrets[source["secretName"]]
                keys = set(secret.get("data", {})) | set(secret.get("stringData", {}))
                assert source["defaultMode"] == 0o440, f"{name}: secret files must be mode 0440"
            else:
                continue
            for item in source.get("items", []):
                assert item["key"] in keys, f"{name}: volume {volume['name']} projects a missing key {item['key']}"


def test_services_select_pods_and_name_their_ports() -> None:
    services = {n: s for n, s in of_kind("Service").items() if s["spec"].get("type") != "ExternalName"}
    assert {"ingress", "gemini-cache"} <= set(services)
    assert services["ingress"]["spec"]["ports"][0]["port"] == 8080
    for name, service in services.items():
        selector = service["spec"]["selector"]
        matching = [
            d for d in deployments().values() if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(matching) == 1, f"Service/{name} selects {len(matching)} Deployments"
        ports = declared_ports(container(matching[0]))
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, f"Service/{name}: targetPort {port['targetPort']} is not declared"
    for name, deployment in deployments().items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items(), name


def test_nats_and_redis_are_referenced_not_deployed() -> None:
    services = of_kind("Service")
    for name in ("nats", "redis"):
        assert services[name]["spec"]["type"] == "ExternalName"
        assert services[name]["spec"]["externalName"].endswith(".svc.cluster.local")
    assert not of_kind("StatefulSet")


# ------------------------------------------------------------------- configs, commands, secrets


def config_file(deployment: Doc) -> tuple[str, str]:
    """(the --config path of the command, the text the pod finds there)."""
    command = container(deployment)["command"]
    path = PurePosixPath(command[command.index("--config") + 1])
    volumes = {v["name"]: v for v in pod(deployment)["volumes"]}
    for mount in container(deployment)["volumeMounts"]:
        if PurePosixPath(mount["mountPath"]) == path.parent and "configMap" in volumes[mount["name"]]:
            assert "subPath" not in mount, "a subPath mount would not see ConfigMap updates"
            data = of_kind("ConfigMap")[volumes[mount["name"]]["configMap"]["name"]]["data"]
            assert path.name in data, f"{ref(deployment)}: {path} is not in its ConfigMap"
            return str(path), data[path.name]
    raise AssertionError(f"{ref(deployment)}: nothing mounts a ConfigMap at {path.parent}")


@pytest.fixture
def configs(tmp_path: Path) -> dict[str, Path]:
    """Each Deployment's config file, written out as the pod sees it."""
    out = {}
    for name, deployment in deployments().items():
        _, text = config_file(deployment)
        out[name] = tmp_path / f"{name}.yaml"
        out[name].write_text(text)
    return out


def test_every_command_is_a_console_script() -> None:
    scripts = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
    for name, deployment in deployments().items():
        assert container(deployment)["command"][0] in scripts, name


def test_configmapped_configs_load_with_the_projects_loaders(configs: dict[str, Path]) -> None:
    router = load_router_config(configs["ingress"])
    assert router_warnings(router) == []
    assert configs["indexer"].read_text() == configs["ingress"].read_text() == configs["gemini-cache"].read_text()
    # gemini-cache exits at start when the feature is off
    assert router.gemini_context_cache.enabled
    assert router.bus.embedded is False and router.bus.url.startswith("nats://nats:")
    connection = router.redis_connection()
    assert connection is not None and connection.url.startswith("redis://redis:")

    from continuum_listener.config import problems

    listener = load_listener_config(configs["kv-listener"])
    assert problems(listener, b"salt") == []
    assert listener.bus is not None and listener.bus.url.startswith("nats://nats:")
    assert listener.bus.user != router.bus.user, "the listener needs its own NATS user (push-mode permissions)"
    backends = {b.name for b in router.backends}
    assert {s.backend_name for s in listener.sources} == backends
    assert {s.backend_name for s in router.kv_cache_index.event_sources} == backends


def listen_port(value: str) -> int:
    return int(value.rpartition(":")[2])


def test_commands_parse_with_the_services_own_parsers(configs: dict[str, Path]) -> None:
    from continuum_gemini_cache.__main__ import parse_args as gemini_args
    from continuum_indexer.__main__ import build_settings
    from continuum_indexer.__main__ import parse_args as indexer_args
    from continuum_router.cli import build_parser

    def args_of(name: str) -> list[str]:
        command: list[str] = container(deployments()[name])["command"]
        args = command[1:]
        args[args.index("--config") + 1] = str(configs[name])  # the pod's file, written out here
        return args

    def port_of(name: str) -> int:
        return int(container(deployments()[name])["ports"][0]["containerPort"])

    ingress = build_parser().parse_args(args_of("ingress"))
    assert ingress.command == "serve" and ingress.host == "0.0.0.0" and ingress.port == port_of("ingress")

    # build_settings also refuses a config whose KV index is off or not in Redis
    indexer = build_settings(indexer_args(args_of("indexer")))
    assert indexer.listen == ("0.0.0.0", port_of("indexer"))

    gemini = gemini_args(args_of("gemini-cache"))
    assert (gemini.http_host, gemini.http_port) == ("0.0.0.0", port_of("gemini-cache"))

    listener = load_listener_config(configs["kv-listener"])
    assert listen_port(listener.listen) == port_of("kv-listener")
    assert listener.listen.startswith("0.0.0.0:")


def file_fields(data: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(dotted path, value) of every `*_file` setting in a parsed config."""
    if isinstance(data, dict):
        for key, value in data.items():
            where = f"{path}.{key}" if path else str(key)
            if str(key).endswith("_file") and isinstance(value, str):
                yield where, value
            else:
                yield from file_fields(value, where)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from file_fields(value, f"{path}[{i}]")


def secret_files_read(name: str, config: Doc) -> set[str]:
    """The secret files each service reads from its config at start."""
    fields = dict(file_fields(config))
    if name in ("ingress", "kv-listener"):
        return set(fields.values())
    shared = {v for k, v in fields.items() if k.startswith(("bus.", "redis.", "response_cache.redis."))}
    if name == "indexer":
        return shared
    assert name == "gemini-cache"
    gemini = tuple(f"backends[{i}]." for i, b in enumerate(config.get("backends", [])) if b.get("type") == "gemini")
    return shared | {v for k, v in fields.items() if gemini and k.startswith(gemini)}


def mounted_secret_files(deployment: Doc) -> dict[str, str]:
    """Path in the pod -> Secret key, for every secret volume of the Deployment."""
    volumes = {v["name"]: v for v in pod(deployment)["volumes"]}
    out = {}
    for mount in container(deployment)["volumeMounts"]:
        source = volumes[mount["name"]].get("secret")
        if source is None:
            continue
        secret = of_kind("Secret")[source["secretName"]]
        every_key = [*secret.get("data", {}), *secret.get("stringData", {})]
        items: list[Doc] = source.get("items") or [{"key": k, "path": k} for k in every_key]
        for item in items:
            out[str(PurePosixPath(mount["mountPath"]) / item["path"])] = item["key"]
    return out


def test_every_secret_file_a_service_reads_is_mounted(configs: dict[str, Path]) -> None:
    for name, deployment in deployments().items():
        config = yaml.safe_load(configs[name].read_text())
        wanted = secret_files_read(name, config)
        assert wanted, f"{name} reads no secret file?"
        mounted = mounted_secret_files(deployment)
        assert wanted <= set(mounted), f"{name}: {sorted(wanted - set(mounted))} not mounted"
    # push mode: the listener must not hold the router's NATS credentials
    assert "nats-router-password" not in mounted_secret_files(deployments()["kv-listener"]).values()


def test_secret_is_a_template_without_values() -> None:
    (secret,) = of_kind("Secret").values()
    assert "data" not in secret, "the template must use stringData placeholders"
    assert secret["stringData"] and all(v == "" for v in secret["stringData"].values())
