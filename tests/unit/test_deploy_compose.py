"""Static checks of deploy/compose (scripts/compose-smoke starts the stack on a Docker engine;
these run everywhere): the files parse, every Continuum command exists, every mounted config
validates against the real schemas, and the wiring between files agrees, including the fixes
that only show when the stack runs (secrets readable by the service user, NATS permissions and
replication, nginx re-resolving the replicas, the Redis Cluster keeping itself formed, the
gemini profile, one image build, restart policies)."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

import yaml

from continuum_common.config import load_listener_config, load_router_config
from continuum_common.procs import find_binary

COMPOSE = Path(__file__).resolve().parents[2] / "deploy" / "compose"
ROOT = COMPOSE.parents[1]


IMAGE = "${CONTINUUM_IMAGE:-continuum:local}"


def compose() -> dict:
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())


def continuum_services() -> dict[str, dict]:
    return {name: s for name, s in compose()["services"].items() if s.get("image") == IMAGE}


def test_every_continuum_command_is_a_console_script() -> None:
    scripts = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
    commands = [s["command"][0] for s in continuum_services().values()]
    assert len(commands) == 8 and set(commands) <= scripts


def test_mounted_configs_validate() -> None:
    router = load_router_config(COMPOSE / "config" / "router.yaml")
    listener = load_listener_config(COMPOSE / "config" / "kv-listener.yaml")
    backends = {b.name for b in router.backends}
    assert {s.backend_name for s in listener.sources} == backends
    assert {s.backend_name for s in router.kv_cache_index.event_sources} == backends
    for service in compose()["services"].values():
        for arg in service.get("command", []):
            if isinstance(arg, str) and arg.startswith("/etc/continuum/"):
                assert (COMPOSE / "config" / arg.removeprefix("/etc/continuum/")).is_file(), arg


def test_listener_may_publish_exactly_its_backends() -> None:
    nats_conf = (COMPOSE / "config" / "nats.conf").read_text()
    listener = load_listener_config(COMPOSE / "config" / "kv-listener.yaml")
    for source in listener.sources:
        assert f'"continuum.kv.events.{source.backend_name}"' in nats_conf
    assert "continuum.kv.events.>" not in nats_conf.split("kv-listener-a")[1]


def test_secrets_referenced_by_configs_are_declared() -> None:
    declared = set(compose()["secrets"])
    text = (COMPOSE / "config" / "router.yaml").read_text() + (COMPOSE / "config" / "kv-listener.yaml").read_text()
    used = {
        line.split("/run/secrets/")[1].split()[0]
        for line in text.splitlines()
        if "/run/secrets/" in line and not line.lstrip().startswith("#")
    }
    assert used and used <= declared


def test_dashboard_queries_use_metric_names_the_code_registers() -> None:
    dashboard = json.loads((COMPOSE / "grafana" / "dashboards" / "continuum.json").read_text())
    source = "\n".join(p.read_text() for p in (ROOT / "services").rglob("*.py"))
    source += "\n".join(p.read_text() for p in (ROOT / "libs").rglob("*.py"))
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            for token in re.findall(r"continuum_[a-z_]+", target["expr"]):
                base = token
                for suffix in ("_total", "_bucket"):
                    base = base.removesuffix(suffix)
                assert f'"{base}' in source, f"{panel['title']}: {token} is not registered anywhere"


def test_the_image_is_built_once_and_shared() -> None:
    services = compose()["services"]
    builders = [name for name, s in services.items() if "build" in s]
    assert builders == ["ingress"]
    assert services["ingress"]["build"] == {"context": "../..", "dockerfile": "deploy/compose/Dockerfile"}
    for name, service in continuum_services().items():
        # nothing to pull: the image comes from the ingress build
        assert service["pull_policy"] == "never", name
    dockerignore = (ROOT / ".dockerignore").read_text().split()
    assert ".git" in dockerignore and ".venv" in dockerignore


def test_every_service_restarts_after_a_crash() -> None:
    for name, service in compose()["services"].items():
        assert service.get("restart") == "unless-stopped", name


def test_secrets_are_copied_for_the_service_user() -> None:
    """Docker bind-mounts file secrets with their host owner and mode (0600 by init-secrets.sh),
    which the image's user cannot read: the services start as root, mount the secrets under
    /run/host-secrets, and the entrypoint copies them into a tmpfs /run/secrets for that user."""
    entrypoint = (COMPOSE / "continuum-entrypoint.sh").read_text()
    assert "/run/host-secrets" in entrypoint and 'install -m 0400 -o "$SERVICE_USER"' in entrypoint
    assert "exec setpriv --reuid=" in entrypoint and "SERVICE_USER=continuum" in entrypoint
    dockerfile = (COMPOSE / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["continuum-entrypoint"]' in dockerfile and "USER continuum" in dockerfile
    for name, service in continuum_services().items():
        assert service["user"] == "root" and any(t.startswith("/run/secrets:") for t in service["tmpfs"]), name
        for secret in service["secrets"]:
            assert secret["target"] == f"/run/host-secrets/{secret['source']}", name


def mounted_secrets(service: str) -> set[str]:
    return {s["source"] for s in compose()["services"][service]["secrets"]}


def secrets_named_in(config: str) -> set[str]:
    text = (COMPOSE / "config" / config).read_text()
    return {
        line.split("/run/secrets/")[1].split()[0].strip("\"'")
        for line in text.splitlines()
        if "/run/secrets/" in line and not line.lstrip().startswith("#")
    }


def test_each_service_gets_the_secrets_it_reads() -> None:
    router = load_router_config(COMPOSE / "config" / "router.yaml")
    listener = load_listener_config(COMPOSE / "config" / "kv-listener.yaml")
    bus_password = Path(router.bus.password_file or "").name
    assert mounted_secrets("ingress") == secrets_named_in("router.yaml")
    assert mounted_secrets("kv-listener") == secrets_named_in("kv-listener.yaml")
    # the listener never holds the router's NATS password
    assert Path(listener.bus.password_file or "").name in mounted_secrets("kv-listener")
    assert bus_password not in mounted_secrets("kv-listener")
    for name in ("indexer-1", "indexer-2", "gemini-cache"):
        assert mounted_secrets(name) == {bus_password}, name
    assert all(not compose()["services"][f"sim-{i}"]["secrets"] for i in (1, 2, 3))


def test_nats_servers_take_their_name_from_the_config_file() -> None:
    """`--name` on the command line makes a SIGHUP reload fail; the name comes from the
    environment into nats.conf instead."""
    nats_conf = (COMPOSE / "config" / "nats.conf").read_text()
    assert "server_name: $NATS_SERVER_NAME" in nats_conf
    # routes and clients use names, not the container addresses that change on restart
    assert "advertise: $NATS_SERVER_NAME" in nats_conf and "no_advertise: true" in nats_conf
    names = []
    for name in ("nats-1", "nats-2", "nats-3"):
        service = compose()["services"][name]
        assert service["command"] == ["-c", "/etc/nats/nats.conf"], name
        names.append(service["environment"]["NATS_SERVER_NAME"])
        assert f"nats://{name}:6222" in nats_conf
    assert names == ["nats-1", "nats-2", "nats-3"]


def test_nats_nodes_run_a_release_whose_first_start_forms_the_cluster() -> None:
    """nats-server 2.10 left one node out of the JetStream meta group in 6 of 200 fresh starts
    of these three services (streams could not get 3 replicas); 2.12 and 2.14 in none of 220
    (docs/operations.md, "Recovering")."""
    images = {compose()["services"][name]["image"] for name in ("nats-1", "nats-2", "nats-3")}
    assert len(images) == 1
    found = re.fullmatch(r"nats:(\d+)\.(\d+)-alpine", images.pop())
    assert found and (int(found.group(1)), int(found.group(2))) >= (2, 12)


def test_nats_conf_is_accepted_by_nats_server(tmp_path: Path) -> None:
    """`nats-server -t` parses the file as a server would start with it (the compose file's
    environment filled in)."""
    env = {"NATS_SERVER_NAME": "nats-1", "NATS_ROUTER_PASSWORD": "krouter", "NATS_LISTENER_PASSWORD": "klistener"}
    conf = tmp_path / "nats.conf"
    conf.write_text((COMPOSE / "config" / "nats.conf").read_text().replace("/data", str(tmp_path / "data")))
    command = [find_binary("nats-server"), "-t", "-c", str(conf)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, result.stderr[-500:]
    assert "configuration file" in (result.stdout + result.stderr).lower()


def test_listener_may_write_the_heartbeat_of_exactly_its_backends() -> None:
    """The heartbeat key is the backend name (continuum_listener.adapters.heartbeat)."""
    listener_part = (COMPOSE / "config" / "nats.conf").read_text().split("kv-listener-a")[1]
    listener = load_listener_config(COMPOSE / "config" / "kv-listener.yaml")
    allowed = set(re.findall(r'"\$KV\.continuum_listeners\.([^"]+)"', listener_part))
    assert allowed == {s.backend_name for s in listener.sources}
    assert '"$JS.API.STREAM.CREATE.KV_continuum_listeners"' in listener_part


def test_streams_and_the_heartbeat_bucket_are_replicated_on_every_nats_node() -> None:
    nodes = [n for n in compose()["services"] if re.fullmatch(r"nats-\d", n)]
    router = load_router_config(COMPOSE / "config" / "router.yaml")
    listener = load_listener_config(COMPOSE / "config" / "kv-listener.yaml")
    # the listener creates both the stream and the heartbeat bucket with bus.stream.replicas
    assert router.bus.stream.replicas == listener.bus.stream.replicas == len(nodes) == 3
    for cfg in (router.bus, listener.bus):
        assert {u.split("//")[1] for u in cfg.url.split(",")} == {f"{n}:4222" for n in nodes}


def test_nginx_resolves_the_replicas_at_request_time() -> None:
    nginx = (COMPOSE / "config" / "nginx.conf").read_text()
    assert re.search(r"resolver 127\.0\.0\.11 valid=\d+s", nginx)
    assert "set $ingress ingress:8080;" in nginx and "proxy_pass http://$ingress;" in nginx
    assert not re.search(r"^\s*upstream\s", nginx, re.M)  # a static upstream block resolves once, at start
    for directive in ("proxy_connect_timeout 2s", "proxy_next_upstream error timeout", "proxy_next_upstream_tries"):
        assert directive in nginx
    assert compose()["services"]["lb"]["ports"] == ["127.0.0.1:${CONTINUUM_HTTP_PORT:-8080}:8080"]


def test_redis_cluster_nodes_are_known_by_name_and_kept_formed() -> None:
    services = compose()["services"]
    nodes = sorted(n for n in services if re.fullmatch(r"redis-\d", n))
    assert nodes == ["redis-1", "redis-2", "redis-3"]
    for node in nodes:
        command = services[node]["command"]
        assert command[command.index("--cluster-announce-hostname") + 1] == node
        # nodes.conf outlives the container
        assert any(v.endswith(":/data") for v in services[node]["volumes"]), node
    keeper = services["redis-cluster"]
    assert keeper["environment"]["REDIS_NODES"].split() == nodes
    assert keeper["entrypoint"] == ["/bin/sh", "/etc/redis-cluster/redis-cluster.sh"]
    script = (COMPOSE / "redis-cluster.sh").read_text()
    assert "cluster meet" in script and "--cluster create" in script and "trap 'exit 0' TERM" in script
    assert "cluster-preferred-endpoint-type hostname" in (COMPOSE / "config" / "redis.conf").read_text()
    for name in ("indexer-1", "gemini-cache", "ingress"):
        assert "redis-cluster" in services[name]["depends_on"], name


def test_gemini_profile_starts_a_service_that_has_work() -> None:
    from continuum_gemini_cache.config import resolve

    services = compose()["services"]
    assert services["gemini-cache"]["profiles"] == ["gemini"]
    assert [n for n, s in services.items() if "gemini" in s.get("profiles", [])] == ["gemini-cache"]
    config = services["gemini-cache"]["command"][services["gemini-cache"]["command"].index("--config") + 1]
    resolve(load_router_config(COMPOSE / "config" / config.removeprefix("/etc/continuum/")))  # raises when disabled


def test_prometheus_finds_optional_and_replicated_targets_by_name() -> None:
    """A static gemini-cache target would be down whenever the profile is off."""
    prometheus = yaml.safe_load((COMPOSE / "config" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    for name, port in (("ingress", 8080), ("gemini-cache", 9103)):
        assert "static_configs" not in jobs[name]
        assert jobs[name]["dns_sd_configs"] == [{"names": [name], "type": "A", "port": port, "refresh_interval": "5s"}]


def test_init_secrets_output_is_ignored_by_git() -> None:
    script = (COMPOSE / "init-secrets.sh").read_text()
    assert "> .env.new" in script and "mv .env.new .env" in script
    ignored = (COMPOSE / ".gitignore").read_text().split()
    assert ".env" in ignored and ".env.new" in ignored
    assert (COMPOSE / "secrets" / ".gitignore").read_text().split()[0] == "*"


def test_offline_override_only_parks_the_images_without_an_offline_source() -> None:
    override = yaml.safe_load((COMPOSE / "compose.offline.yaml").read_text())
    assert override["services"] == {
        name: {"profiles": ["online-only"]} for name in ("otel-collector", "jaeger", "grafana")
    }


def test_generated_nats_passwords_start_with_a_letter(tmp_path: Path) -> None:
    """nats-server reads the passwords from the environment as config values: one starting
    with a digit fails to parse, and every NATS node crash-loops."""
    script = tmp_path / "init-secrets.sh"
    script.write_text((COMPOSE / "init-secrets.sh").read_text())
    for _ in range(8):  # 8 fresh sets: with hex alone, most runs would have a digit first somewhere
        for old in (tmp_path / "secrets").glob("*") if (tmp_path / "secrets").exists() else []:
            old.unlink()
        subprocess.run(["sh", str(script)], check=True, capture_output=True)
        env = dict(line.split("=", 1) for line in (tmp_path / ".env").read_text().splitlines() if "=" in line)
        assert env["NATS_ROUTER_PASSWORD"][0].isalpha() and env["NATS_LISTENER_PASSWORD"][0].isalpha()
