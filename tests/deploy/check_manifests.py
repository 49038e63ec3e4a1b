"""Checks of the rendered Kubernetes manifests (deploy/) against the server's
own configuration and the image, for what kubernetes-validate cannot see:
that the pieces agree with each other.

    python3 tests/deploy/check_manifests.py --dockerfile deploy/Dockerfile \
        NAME=RENDERED.yaml [NAME=RENDERED.yaml ...]

RENDERED.yaml is `kubectl kustomize` of an overlay (deploy/overlays/*) or of
one of the combinations in deploy/examples. For every render: every
namespaced object names its namespace, the custom resources pass their
CRDs' schemas (--crd-validator), the workload's (the single-node
StatefulSet, or the PostgreSQL variant's Deployment) probes name the health
services `readiness` and `liveness` (HTTP probes of /readyz and /livez on
the metrics port where agentrt serves TLS itself, which native gRPC probes
cannot speak), $(VAR) references in the environment resolve, 
terminationGracePeriodSeconds exceeds the preStop
sleep plus `shutdown_grace` of the ConfigMap's config.toml, the data dir of
config.toml is on the volumeClaimTemplate's mount (sled) or there is no
volume claim at all, the database URL and the cluster key come from Secrets,
each pod advertises its own IP on the declared internal port (https:// with
TLS, the replicas then trusting a CA from a Secret and verifying each other
for a server name the Certificate names, with client auth allowed), that
port is open only between agentrt pods and an HPA scales the Deployment
(PostgreSQL),
key files and TLS files
lie on Secret mounts, the container runs as a numeric non-root user with a
read-only root filesystem and no privileges, and the Services, the
NetworkPolicy and the mesh proxies' drain times fit; the metrics ports
(agentrt's and a sidecar's) admit only a selected scraper, and behind a
mesh sidecar the per-address transport caps are off. Custom resources the
schema validator skips (Istio, Linkerd's Gateway API routes, cert-manager)
get a shape check of the fields the deployment relies on; a kind with no
check fails. Then every check is shown able to fail: each mutation in
MUTATIONS breaks one thing in a copy of the first render and must make the
named check fail (the PostgreSQL mutations on the first PostgreSQL render).

With --examples DIR and --readme FILE: DIR holds one kustomization for
every combination of an overlay and a set of components (at most one mesh)
and the README names each. With --full NAME: that render (PostgreSQL, Istio,
TLS and telemetry together) carries every component's pieces on its
Deployment.

Ends with `check_manifests: N passed, M failed`; exit status 1 on any
failure.
"""

import argparse
import copy
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib

import yaml

SESSION_HEADER = "x-agentrt-session"
STREAMING = ("/agentrt.v1.AgentRuntime/Chat", "/agentrt.v1.AgentRuntime/Subscribe")
BUILD_COMMAND = "cargo build --release --locked -p agentrt-server"
# Validated by kubernetes-validate against the Kubernetes schemas.
CORE_KINDS = {
    "Namespace", "ServiceAccount", "ConfigMap", "Service", "StatefulSet",
    "PodDisruptionBudget", "NetworkPolicy", "Deployment", "HorizontalPodAutoscaler",
}
WORKLOADS = ("StatefulSet", "Deployment")
# Kinds that live outside namespaces; every other object must name one.
CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
    "PriorityClass", "StorageClass", "ClusterIssuer", "GatewayClass", "PersistentVolume",
    "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration",
}
OVERLAYS = ("single-node", "postgres")
MESHES = (None, "istio", "linkerd")
# The command that validates custom resources against their CRDs' schemas
# (tests/deploy/crds/validate.mjs); set by --crd-validator.
CRD_VALIDATOR = None


class Failed(Exception):
    pass


def need(cond, why):
    if not cond:
        raise Failed(why)


def seconds(text):
    """A duration as agentrt and Istio write it ("30s", "1m30s", "500ms")."""
    text = str(text).strip()
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text)
    need(parts and "".join(a + b for a, b in parts) == text, f"bad duration {text!r}")
    unit = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(a) * unit[b] for a, b in parts)


class Render:
    """One rendered kustomization and the facts checks need from it."""

    def __init__(self, name, docs):
        self.name = name
        self.docs = [d for d in docs if d]

    def all(self, kind):
        return [d for d in self.docs if d.get("kind") == kind]

    def one(self, kind, name=None):
        found = [d for d in self.all(kind) if name is None or d["metadata"]["name"] == name]
        need(len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}")
        return found[0]

    @property
    def workload(self):
        """The one StatefulSet (sled) or Deployment (PostgreSQL) running agentrt."""
        found = [d for d in self.docs if d.get("kind") in WORKLOADS]
        need(len(found) == 1, f"expected one StatefulSet or Deployment, found {len(found)}")
        return found[0]

    @property
    def pod(self):
        return self.workload["spec"]["template"]["spec"]

    @property
    def container(self):
        cs = [c for c in self.pod["containers"] if c["name"] == "agentrt"]
        need(len(cs) == 1, "the pod has no container named agentrt")
        return cs[0]

    def arg(self, flag):
        args = self.container.get("args", [])
        for i, a in enumerate(args):
            if a == flag and i + 1 < len(args):
                return args[i + 1]
            if a.startswith(flag + "="):
                return a.split("=", 1)[1]
        return None

    def setting(self, flag, env):
        """A server setting given as a flag in args or as a literal variable."""
        value = self.arg(flag)
        if value is not None:
            return value
        found = [e for e in self.container.get("env", []) if e["name"] == env]
        return found[0].get("value") if found else None

    def mount_for(self, path):
        """(volumeMount, volume) whose mount holds `path`."""
        best = None
        for m in self.container.get("volumeMounts", []):
            mp = m["mountPath"].rstrip("/")
            if path == mp or path.startswith(mp + "/"):
                if best is None or len(mp) > len(best["mountPath"]):
                    best = m
        need(best is not None, f"{path} is on no volume mount")
        vols = {v["name"]: v for v in self.pod.get("volumes", [])}
        return best, vols.get(best["name"])

    @property
    def config(self):
        path = self.arg("--config")
        need(path, "the container's args name no --config file")
        mount, vol = self.mount_for(path)
        need(vol and "configMap" in vol, f"--config {path} is not on a ConfigMap mount")
        key = mount.get("subPath") or path[len(mount["mountPath"].rstrip("/")) + 1:]
        cm = self.one("ConfigMap", vol["configMap"]["name"])
        need(key in cm.get("data", {}), f"ConfigMap {cm['metadata']['name']} has no key {key}")
        return tomllib.loads(cm["data"][key])

    @property
    def store_kind(self):
        return self.config.get("store", {}).get("kind", "sled")

    def env(self, name):
        found = [e for e in self.container.get("env", []) if e["name"] == name]
        need(len(found) == 1, f"the container sets {name} {len(found)} times, not once")
        return found[0]

    def port(self, name):
        for p in self.container.get("ports", []):
            if p.get("name") == name:
                return p["containerPort"]
        raise Failed(f"the container has no port named {name}")

    def drain_budget(self):
        pre = self.container.get("lifecycle", {}).get("preStop", {})
        need("sleep" in pre, "the container has no preStop sleep")
        return pre["sleep"]["seconds"] + seconds(self.config.get("shutdown_grace", "30s"))

    @property
    def tls(self):
        return self.setting("--tls-cert", "AGENTRT_TLS_CERT") is not None or "tls" in self.config

    def transport(self, key):
        """A [transport] setting as the server sees it: the environment
        variable (AGENTRT_<KEY>) overrides config.toml."""
        value = self.setting("--" + key.replace("_", "-"), "AGENTRT_" + key.upper())
        if value is not None:
            need(str(value).isdigit(), f"AGENTRT_{key.upper()} {value!r} is not a number")
            return int(value)
        return self.config.get("transport", {}).get(key)


# ----------------------------------------------------------------- checks
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


@check
def every_namespaced_object_names_its_namespace(r):
    """kubectl puts an object without a namespace into whatever namespace
    the caller's context points at: every namespaced object names one, and
    all name the deployment's."""
    names = {d["metadata"]["name"] for d in r.all("Namespace")}
    need(len(names) <= 1, f"several Namespaces {sorted(names)}")
    for d in r.docs:
        if d.get("kind") in CLUSTER_SCOPED:
            continue
        ns = d.get("metadata", {}).get("namespace")
        need(ns, f"{d.get('kind')} {d.get('metadata', {}).get('name')} names no namespace")
        need(not names or ns in names, f"{d['kind']} {d['metadata']['name']} is in {ns}, not {sorted(names)}")


@check
def custom_resources_match_their_crd_schemas(r):
    custom = [d for d in r.docs if d.get("kind") not in CORE_KINDS]
    if not custom:
        return
    need(CRD_VALIDATOR, "no --crd-validator to check the custom resources with")
    done = subprocess.run(CRD_VALIDATOR, input=json.dumps(custom), capture_output=True, text=True, timeout=120)
    need(done.returncode == 0, f"the CRD validator failed: {done.stderr.strip()[-500:]}")
    verdicts = json.loads(done.stdout)
    need(len(verdicts) == len(custom), "the CRD validator answered for another number of objects")
    bad = [f"{d['kind']} {d['metadata'].get('name')}: {why}" for d, why in zip(custom, verdicts) if why]
    need(not bad, "; ".join(bad))


@check
def probes_name_the_health_services(r):
    c = r.container
    grpc_port = r.port("grpc")
    want = {"startupProbe": "readiness", "readinessProbe": "readiness", "livenessProbe": "liveness"}
    paths = {"readiness": "/readyz", "liveness": "/livez"}
    for probe, service in want.items():
        need(probe in c, f"no {probe}")
        p = c[probe]
        kinds = [k for k in ("grpc", "httpGet", "tcpSocket", "exec") if k in p]
        need(len(kinds) == 1, f"{probe} has {kinds or 'no'} handlers, not one")
        if "grpc" in p:
            # Native gRPC probes are plaintext: they fail on a TLS listener.
            need(not r.tls, f"{probe} is a gRPC probe, but agentrt serves TLS (use /readyz, /livez)")
            need(p["grpc"].get("service") == service,
                 f"{probe} asks for service {p['grpc'].get('service')!r}, not {service!r}")
            need(p["grpc"]["port"] == grpc_port, f"{probe} probes port {p['grpc']['port']}, not {grpc_port}")
        else:
            # A TCP probe would not see a drain; HTTP probes mirror the health services.
            need("httpGet" in p, f"{probe} is neither a gRPC probe nor an HTTP probe of the health routes")
            h = p["httpGet"]
            need(h.get("path") == paths[service], f"{probe} asks {h.get('path')!r}, not {paths[service]!r}")
            need(h.get("port") in ("metrics", r.port("metrics")), f"{probe} probes port {h.get('port')}, not metrics")
            need(h.get("scheme", "HTTP") == "HTTP", f"{probe} uses {h.get('scheme')}: the metrics listener is plain HTTP")


@check
def env_references_resolve(r):
    """The kubelet expands $(VAR) in an env value only from entries before
    it, and in args from any entry; an unresolved reference stays literal."""
    seen = set()
    for e in r.container.get("env", []):
        for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", e.get("value", "")):
            need(ref in seen, f"env {e['name']} refers to $({ref}), not set before it")
        seen.add(e["name"])
    for a in r.container.get("args", []):
        for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
            need(ref in seen, f"args refer to $({ref}), which the container does not set")


@check
def grace_period_covers_prestop_and_shutdown_grace(r):
    grace = r.pod.get("terminationGracePeriodSeconds", 30)
    budget = r.drain_budget()
    need(grace > budget, f"terminationGracePeriodSeconds {grace} <= preStop + shutdown_grace = {budget:g}")


@check
def data_dir_is_on_the_claimed_volume(r):
    if r.store_kind != "sled":
        return  # shared_store_replicas_are_stateless covers the other stores
    need(r.workload["kind"] == "StatefulSet", "sled runs in a StatefulSet (its volume is the pod's)")
    data_dir = r.config.get("data_dir")
    need(data_dir, "config.toml sets no data_dir (the default ./agentrt-data is on the image)")
    mount, vol = r.mount_for(data_dir)
    claims = {t["metadata"]["name"] for t in r.workload["spec"].get("volumeClaimTemplates", [])}
    need(mount["name"] in claims and vol is None,
         f"data_dir {data_dir} is on {mount['name']}, not a volumeClaimTemplate ({sorted(claims)})")
    need(not mount.get("readOnly"), "the data volume is mounted read-only")


def _from_secret(r, var, what):
    ref = r.env(var).get("valueFrom", {}).get("secretKeyRef")
    need(ref and ref.get("name") and ref.get("key"), f"{what} ({var}) is not from a secretKeyRef")


@check
def shared_store_replicas_are_stateless(r):
    """PostgreSQL mode: a Deployment with no volume claim, secrets from
    Secrets, the internal port declared, advertised at the pod IP, open only
    between agentrt pods, and an HPA on the Deployment."""
    if r.store_kind == "sled":
        return
    cfg = r.config
    need(r.store_kind == "postgres", f"unknown [store] kind {r.store_kind!r}")
    w = r.workload
    need(w["kind"] == "Deployment", f"PostgreSQL replicas run as a {w['kind']}, not a Deployment")
    need(not r.all("PersistentVolumeClaim") and not w["spec"].get("volumeClaimTemplates")
         and not any("persistentVolumeClaim" in v for v in r.pod.get("volumes", [])),
         "a PostgreSQL replica claims a volume (it must be stateless)")
    store = cfg["store"]
    need("url" not in store, "the database URL (and its password) is written into the ConfigMap")
    need(store.get("url_env"), "[store] has no url_env")
    _from_secret(r, store["url_env"], "the database URL")
    cluster = cfg.get("cluster")
    need(cluster, "config.toml has no [cluster]: replicas could not forward to a turn's owner")
    need(cluster.get("key_env"), "[cluster] has no key_env")
    _from_secret(r, cluster["key_env"], "the cluster key")
    listen = cluster.get("listen", "")
    need(listen.startswith("0.0.0.0:"), "[cluster] listen is not on all interfaces")
    port = int(listen.rsplit(":", 1)[1])
    need(r.port("cluster") == port, f"[cluster] listen port {port} != container port cluster")
    need(port != r.port("grpc"), "the internal service shares the public port")
    # With TLS the internal port speaks mTLS, advertised as https://.
    scheme = "https" if r.tls else "http"
    advertise = r.arg("--cluster-advertise")
    need(advertise == f"{scheme}://$(POD_IP):{port}",
         f"--cluster-advertise {advertise!r} is not {scheme}://$(POD_IP):{port}")
    pod_ip = r.env("POD_IP").get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    need(pod_ip == "status.podIP", "POD_IP is not the downward API's status.podIP")
    labels = w["spec"]["template"]["metadata"]["labels"]
    policy = r.one("NetworkPolicy")

    def only_agentrt(peers):
        return bool(peers) and all(
            set(p) == {"podSelector"} and p["podSelector"].get("matchLabels", {}).items() <= labels.items()
            and p["podSelector"].get("matchLabels") for p in peers)

    for direction, peers_key in (("ingress", "from"), ("egress", "to")):
        rules = [rule for rule in policy["spec"].get(direction, [])
                 if any(p.get("port") == port for p in rule.get("ports", [])) or not rule.get("ports")]
        need(rules, f"NetworkPolicy {direction} does not allow the internal port {port}")
        for rule in rules:
            need(only_agentrt(rule.get(peers_key)),
                 f"NetworkPolicy {direction} opens port {port} beyond the agentrt pods")
    hpas = [h for h in r.all("HorizontalPodAutoscaler")
            if h["spec"]["scaleTargetRef"]["kind"] == "Deployment"
            and h["spec"]["scaleTargetRef"]["name"] == w["metadata"]["name"]]
    need(len(hpas) == 1, "no HorizontalPodAutoscaler scales the Deployment")
    hpa = hpas[0]
    need(hpa["apiVersion"] == "autoscaling/v2", "the HPA is not autoscaling/v2")
    need(any(m["type"] == "Resource" and m["resource"]["name"] == "cpu" for m in hpa["spec"]["metrics"]),
         "the HPA does not scale on CPU")
    need(hpa["spec"].get("minReplicas", 1) >= 2, "the HPA may scale to one replica (no failover)")
    need("replicas" not in w["spec"], "the Deployment sets replicas, which every apply would reset under the HPA")
    need(r.container["resources"].get("requests", {}).get("cpu"), "no CPU request for the HPA's utilization")


@check
def runs_as_non_root_with_a_read_only_root(r):
    pod_sc, sc = r.pod.get("securityContext", {}), r.container.get("securityContext", {})
    merged = {**pod_sc, **sc}
    need(merged.get("runAsNonRoot") is True, "runAsNonRoot is not true")
    uid = merged.get("runAsUser")
    need(isinstance(uid, int) and uid > 0, f"runAsUser {uid!r} is not a numeric non-root UID")
    need(sc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem is not true")
    need(sc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation is not false")
    need("ALL" in sc.get("capabilities", {}).get("drop", []), "capabilities do not drop ALL")
    need(merged.get("seccompProfile", {}).get("type") == "RuntimeDefault", "seccompProfile is not RuntimeDefault")
    need(r.pod.get("automountServiceAccountToken") is False, "the pod mounts a service account token")


@check
def secrets_are_mounted_files(r):
    keys = r.config.get("auth", {}).get("api_keys", [])
    need(keys, "config.toml has no [[auth.api_keys]]: a non-loopback listen address is refused")
    for k in keys:
        need("key" not in k, "an API key is written into the ConfigMap")
        path = k.get("key_file")
        need(path, f"api key of {k.get('user')} has no key_file")
        mount, vol = r.mount_for(path)
        need(vol and "secret" in vol, f"key_file {path} is not on a Secret mount")
        need("subPath" not in mount, "a Secret mounted with subPath never sees updates")
        items = vol["secret"].get("items")
        if items:
            rel = path[len(mount["mountPath"].rstrip("/")) + 1:]
            need(rel in {i["path"] for i in items}, f"Secret volume has no item for {rel}")
    for flag in ("--tls-cert", "--tls-key", "--tls-client-ca"):
        path = r.setting(flag, "AGENTRT_" + flag[2:].replace("-", "_").upper())
        if path:
            _, vol = r.mount_for(path)
            need(vol and "secret" in vol, f"{flag} {path} is not on a Secret mount")


@check
def listen_ports_match_container_services_and_policy(r):
    cfg = r.config
    listen_port = int(cfg.get("listen", "").rsplit(":", 1)[-1] or 0)
    need(cfg.get("listen", "").startswith("0.0.0.0:"), "config.toml does not listen on all interfaces")
    need(listen_port == r.port("grpc"), f"listen port {listen_port} != container port grpc")
    metrics = cfg.get("metrics_listen")
    need(metrics, "config.toml sets no metrics_listen")
    need(int(metrics.rsplit(":", 1)[1]) == r.port("metrics"), "metrics_listen port != container port metrics")
    need(cfg.get("log_format") == "json", "log_format is not json")
    services = r.all("Service")
    if r.workload["kind"] == "StatefulSet":
        need(any(s["spec"].get("clusterIP") == "None" and s["metadata"]["name"] == r.workload["spec"]["serviceName"]
                 for s in services), "serviceName is not a headless Service")
    # A TLS port declared as grpc would make a mesh proxy parse it as
    # plaintext HTTP/2; declared https, the proxy passes it through.
    protocol = "https" if r.tls else "grpc"
    for s in services:
        grpc = [p for p in s["spec"]["ports"] if p["name"] == "grpc"]
        need(grpc and grpc[0].get("appProtocol") == protocol,
             f"Service {s['metadata']['name']}: no grpc port with appProtocol {protocol}")
        need(grpc[0]["targetPort"] in ("grpc", listen_port), f"Service {s['metadata']['name']} targets another port")
    policy = r.one("NetworkPolicy")
    ingress = {p["port"] for rule in policy["spec"]["ingress"] for p in rule.get("ports", [])}
    need({listen_port, r.port("metrics")} <= ingress, f"NetworkPolicy ingress {sorted(ingress, key=str)} lacks grpc/metrics")
    r.one("PodDisruptionBudget")
    res = r.container.get("resources", {})
    need(res.get("requests") and res.get("limits"), "no resource requests/limits")
    if r.store_kind == "sled":
        need(r.workload["spec"]["replicas"] == 1, "more than one replica on sled (one process per data dir)")


METRICS_PORTS = {15090, 15020}


def _meshed(r):
    meta = r.workload["spec"]["template"]["metadata"]
    return (meta.get("labels", {}).get("sidecar.istio.io/inject") == "true"
            or meta.get("annotations", {}).get("linkerd.io/inject") == "enabled")


@check
def metrics_ports_admit_only_the_scraper(r):
    """The metrics listener needs no credentials: only a selected scraper may reach it."""
    ports = METRICS_PORTS | {r.port("metrics")}
    policy = r.one("NetworkPolicy")
    for rule in policy["spec"].get("ingress", []):
        rule_ports = {p.get("port") for p in rule.get("ports", [])}
        if rule.get("ports") and not rule_ports & ports:
            continue
        peers = rule.get("from")
        opened = sorted(rule_ports & ports, key=str) or "every port"
        need(peers, f"NetworkPolicy opens {opened} to every source")
        for peer in peers:
            need("ipBlock" not in peer, f"NetworkPolicy opens {opened} to an ipBlock")
            selectors = [peer.get(k) for k in ("namespaceSelector", "podSelector")]
            need(all(s is not None for s in selectors) and all(
                s.get("matchLabels") or s.get("matchExpressions") for s in selectors),
                f"NetworkPolicy opens {opened} beyond one namespace's scraper pods "
                "(needs a namespaceSelector and a podSelector, both non-empty)")


@check
def per_address_caps_are_off_behind_a_mesh(r):
    if not _meshed(r):
        return
    for key in ("max_connections_per_ip", "max_pending_requests_per_ip"):
        need(r.transport(key) == 0,
             f"behind a mesh sidecar every caller has its address: {key} must be 0")


@check
def mesh_proxies_outlive_the_drain(r):
    meta = r.workload["spec"]["template"]["metadata"]
    ann, labels = meta.get("annotations", {}), meta.get("labels", {})
    grace = r.pod.get("terminationGracePeriodSeconds", 30)
    budget = r.drain_budget()
    if labels.get("sidecar.istio.io/inject") == "true":
        proxy = yaml.safe_load(ann.get("proxy.istio.io/config", "")) or {}
        drain = seconds(proxy.get("terminationDrainDuration", "5s"))
        need(budget <= drain < grace, f"Istio terminationDrainDuration {drain:g}s not in [{budget:g}, {grace})")
    if ann.get("linkerd.io/inject") == "enabled":
        wait = int(ann.get("config.alpha.linkerd.io/proxy-wait-before-exit-seconds", "0"))
        need(budget <= wait < grace, f"Linkerd proxy-wait-before-exit-seconds {wait} not in [{budget:g}, {grace})")


def shape_destination_rule(r, d):
    need(d["apiVersion"].startswith("networking.istio.io/"), "DestinationRule apiVersion")
    need(d["spec"]["host"] in {s["metadata"]["name"] for s in r.all("Service")}, "DestinationRule host is no Service")
    tp = d["spec"]["trafficPolicy"]
    need(tp["loadBalancer"]["consistentHash"]["httpHeaderName"] == SESSION_HEADER,
         f"DestinationRule does not hash on {SESSION_HEADER}")
    idle = tp.get("connectionPool", {}).get("http", {}).get("idleTimeout")
    if idle:
        need(seconds(idle) > seconds(r.config.get("heartbeat_interval", "15s")), "idleTimeout below the heartbeat")


def shape_virtual_service(r, d):
    need(d["apiVersion"].startswith("networking.istio.io/"), "VirtualService apiVersion")
    services = {s["metadata"]["name"] for s in r.all("Service")}
    for method in STREAMING:
        # Istio takes the first route that matches; no match list is a catch-all.
        route = next((h for h in d["spec"]["http"]
                      if not h.get("match") or any(m.get("uri", {}).get("exact") == method for m in h["match"])),
                     None)
        need(route is not None, f"VirtualService has no route for {method}")
        need(route.get("retries", {}).get("attempts") == 0, f"{method} may be retried")
        need(seconds(route.get("timeout", "0s")) == 0, f"{method} has a route timeout")
    for h in d["spec"]["http"]:
        for dest in h["route"]:
            need(dest["destination"]["host"] in services, "VirtualService routes to no Service")


def shape_peer_authentication(r, d):
    need(d["apiVersion"].startswith("security.istio.io/"), "PeerAuthentication apiVersion")
    need(d["spec"]["mtls"]["mode"] == "STRICT", "PeerAuthentication is not STRICT")


def shape_grpc_route(r, d):
    need(d["apiVersion"] == "gateway.networking.k8s.io/v1", "GRPCRoute apiVersion")
    ann = d["metadata"].get("annotations", {})
    need(not [a for a in ann if a.startswith("retry.linkerd.io/")], "GRPCRoute configures retries")
    for a in ("timeout.linkerd.io/request", "timeout.linkerd.io/response"):
        need(a not in ann, f"GRPCRoute sets {a}, which cuts long streams")
    if "timeout.linkerd.io/idle" in ann:
        need(seconds(ann["timeout.linkerd.io/idle"]) > seconds(r.config.get("heartbeat_interval", "15s")),
             "Linkerd idle timeout not above the heartbeat interval")
    need(any(p["kind"] == "Service" and p["name"] == "agentrt" for p in d["spec"]["parentRefs"]),
         "GRPCRoute is not attached to the agentrt Service")
    methods = {f"/{m['method']['service']}/{m['method']['method']}"
               for rule in d["spec"]["rules"] for m in rule.get("matches", [])}
    need(set(STREAMING) <= methods, "GRPCRoute does not name Chat and Subscribe")
    need(any(not rule.get("matches") for rule in d["spec"]["rules"]), "GRPCRoute has no catch-all rule")


@check
def replicas_verify_each_other_with_tls(r):
    """PostgreSQL with TLS: the internal port's mTLS can work — the
    replicas trust a CA file from the certificate's Secret, verify each
    other for a server name (their pod IPs are in no certificate) that the
    Certificate names, and the Certificate allows client auth."""
    if r.store_kind == "sled" or not r.tls:
        return
    cluster = r.config.get("cluster", {})
    ca = (r.setting("--cluster-ca-file", "AGENTRT_CLUSTER_CA_FILE") or cluster.get("ca_file")
          or r.setting("--tls-client-ca", "AGENTRT_TLS_CLIENT_CA") or r.config.get("tls", {}).get("client_ca"))
    need(ca, "TLS with [cluster] but no cluster CA (AGENTRT_CLUSTER_CA_FILE): the replicas could not start")
    _, vol = r.mount_for(ca)
    need(vol and "secret" in vol, f"the cluster CA file {ca} is not on a Secret mount")
    name = r.setting("--cluster-server-name", "AGENTRT_CLUSTER_SERVER_NAME") or cluster.get("server_name")
    need(name, "no AGENTRT_CLUSTER_SERVER_NAME: replicas would verify each other for pod IPs, "
         "which no certificate names")
    for cert in r.all("Certificate"):
        need(name in cert["spec"].get("dnsNames", []),
             f"Certificate {cert['metadata']['name']} does not name the cluster server name {name}")
        need("client auth" in cert["spec"].get("usages", []),
             f"Certificate {cert['metadata']['name']} does not allow client auth (the replicas present it)")


def shape_certificate(r, d):
    need(d["apiVersion"] == "cert-manager.io/v1", "Certificate apiVersion")
    secret = d["spec"]["secretName"]
    path = r.setting("--tls-cert", "AGENTRT_TLS_CERT")
    need(path, "a Certificate but no --tls-cert / AGENTRT_TLS_CERT")
    _, vol = r.mount_for(path)
    need(vol["secret"]["secretName"] == secret, f"--tls-cert is not from Secret {secret}")
    need(d["spec"]["issuerRef"]["name"], "Certificate has no issuer")
    need("agentrt" in d["spec"]["dnsNames"], "Certificate does not name the Service")


SHAPES = {
    "DestinationRule": shape_destination_rule,
    "VirtualService": shape_virtual_service,
    "PeerAuthentication": shape_peer_authentication,
    "GRPCRoute": shape_grpc_route,
    "Certificate": shape_certificate,
}


@check
def custom_resources_have_the_fields_relied_on(r):
    for d in r.docs:
        kind = d.get("kind")
        if kind in CORE_KINDS:
            continue
        need(kind in SHAPES, f"no shape check for {d.get('apiVersion')} {kind}")
        SHAPES[kind](r, d)


def dockerfile_checks(path, renders):
    """The image's start command and user are the ones the manifests assume."""
    text = open(path, encoding="utf-8").read()
    lines = re.sub(r"\\\n", " ", text).splitlines()
    stages, current = {}, None
    for line in lines:
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        op = words[0].upper()
        if op == "FROM":
            base = words[1]
            name = words[3] if len(words) > 3 and words[2].upper() == "AS" else f"#{len(stages)}"
            # A stage FROM an earlier stage inherits its ENTRYPOINT, CMD, USER.
            current = {"ops": list(stages[base]["ops"]) if base in stages else []}
            stages[name] = current
        elif current is not None:
            current["ops"].append((op, line.split(None, 1)[1] if len(words) > 1 else ""))
    need(current is not None, f"{path} has no FROM")
    ops = current["ops"]
    results = []

    def get(op):
        vals = [v for o, v in ops if o == op]
        return vals[-1] if vals else None

    def run(name, fn):
        try:
            fn()
            results.append((name, None))
        except Failed as e:
            results.append((name, str(e)))

    def no_healthcheck():
        need("HEALTHCHECK" not in {o for s in stages.values() for o, _ in s["ops"]}, "HEALTHCHECK present")

    def user_matches():
        user = get("USER")
        need(user and user.split(":")[0].isdigit() and int(user.split(":")[0]) > 0, f"USER {user!r} not numeric non-root")
        for r in renders:
            uid = {**r.pod.get("securityContext", {}), **r.container.get("securityContext", {})}.get("runAsUser")
            need(uid == int(user.split(":")[0]), f"{r.name}: runAsUser {uid} != image USER {user}")

    def start_command():
        entry = json.loads(get("ENTRYPOINT"))
        cmd = json.loads(get("CMD"))
        need(entry == ["/usr/local/bin/agentrt-server"], f"ENTRYPOINT {entry}")
        for r in renders:
            need(r.container.get("command") in (None, entry), f"{r.name}: command overrides ENTRYPOINT")
            need(r.container.get("args", [])[: len(cmd)] == cmd, f"{r.name}: args do not start with CMD {cmd}")

    def release_build():
        need(any(BUILD_COMMAND in v for s in stages.values() for o, v in s["ops"] if o == "RUN"),
             f"no RUN {BUILD_COMMAND!r} (the binary every image has)")

    def baked_model():
        fetched = [re.search(r"--model-path\s+(\S+)\s+fetch-model", v) for o, v in stages.get("model", {"ops": []})["ops"]
                   if o == "RUN"]
        fetched = [m.group(1) for m in fetched if m]
        need(fetched, "the model stage runs no `agentrt-server --model-path PATH fetch-model`")
        env = {}
        for o, v in ops:
            if o == "ENV":
                env.update(kv.split("=", 1) for kv in v.split() if "=" in kv)
        need(env.get("AGENTRT_MODEL_PATH") == fetched[0],
             f"AGENTRT_MODEL_PATH {env.get('AGENTRT_MODEL_PATH')!r} is not the fetched {fetched[0]!r}")
        copied = [v.split()[-2] for o, v in ops if o == "COPY" and v.startswith("--from=model")]
        need(any(fetched[0].startswith(c.rstrip("/") + "/") for c in copied), "the fetched model is not copied in")

    run("dockerfile: no HEALTHCHECK", no_healthcheck)
    run("dockerfile: AGENTRT_MODEL_PATH is the baked model", baked_model)
    run("dockerfile: numeric non-root USER = runAsUser", user_matches)
    run("dockerfile: ENTRYPOINT/CMD = the StatefulSet's command", start_command)
    run("dockerfile: the release build .ci/run repeats", release_build)
    return results


def run_checks(render):
    out = []
    for fn in CHECKS:
        try:
            fn(render)
            out.append((fn.__name__, None))
        except Failed as e:
            out.append((fn.__name__, str(e)))
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            out.append((fn.__name__, f"malformed manifest: {type(e).__name__}: {e}"))
    return out


# Each mutation breaks one thing the checks must catch: (name, check, fn).
def _container(docs):
    w = next(d for d in docs if d["kind"] in WORKLOADS)
    return w, w["spec"]["template"]["spec"], w["spec"]["template"]["spec"]["containers"][0]


def _env(docs, name):
    return next(e for e in _container(docs)[2]["env"] if e["name"] == name)


def _literal_env(docs, name, value):
    e = _env(docs, name)
    e.pop("valueFrom")
    e["value"] = value


def _policy_rule(docs, direction, port):
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    return next(rule for rule in policy["spec"][direction]
                if any(p.get("port") == port for p in rule.get("ports", [])))


def _set_config(docs, old, new):
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    key = next(iter(cm["data"]))
    need(old in cm["data"][key], f"mutation: {old!r} not in config.toml")
    cm["data"][key] = cm["data"][key].replace(old, new)


MUTATIONS = [
    ("readiness probe on the empty service", "probes_name_the_health_services",
     lambda d: _container(d)[2]["readinessProbe"]["grpc"].update(service="")),
    ("liveness probe on readiness", "probes_name_the_health_services",
     lambda d: _container(d)[2]["livenessProbe"]["grpc"].update(service="readiness")),
    ("grace period 40 s = preStop + shutdown_grace", "grace_period_covers_prestop_and_shutdown_grace",
     lambda d: _container(d)[1].update(terminationGracePeriodSeconds=40)),
    ("shutdown_grace raised to 55 s", "grace_period_covers_prestop_and_shutdown_grace",
     lambda d: _set_config(d, 'shutdown_grace = "30s"', 'shutdown_grace = "55s"')),
    ("data dir moved off the volume", "data_dir_is_on_the_claimed_volume",
     lambda d: _set_config(d, 'data_dir = "/var/lib/agentrt"', 'data_dir = "/srv/agentrt"')),
    ("data volume mounted elsewhere", "data_dir_is_on_the_claimed_volume",
     lambda d: next(m for m in _container(d)[2]["volumeMounts"] if m["name"] == "data").update(mountPath="/data")),
    ("runs as root", "runs_as_non_root_with_a_read_only_root",
     lambda d: _container(d)[2]["securityContext"].update(runAsUser=0)),
    ("writable root filesystem", "runs_as_non_root_with_a_read_only_root",
     lambda d: _container(d)[2]["securityContext"].update(readOnlyRootFilesystem=False)),
    ("an API key inline in the ConfigMap", "secrets_are_mounted_files",
     lambda d: _set_config(d, 'key_file = "/etc/agentrt/keys/app"', 'key = "app-secret"')),
    ("listen port differs from the container port", "listen_ports_match_container_services_and_policy",
     lambda d: _set_config(d, 'listen = "0.0.0.0:50051"', 'listen = "0.0.0.0:50052"')),
    ("metrics port open to every source", "metrics_ports_admit_only_the_scraper",
     lambda d: _policy_rule(d, "ingress", 9090).pop("from")),
    ("metrics port open to every pod of the scraper's namespace", "metrics_ports_admit_only_the_scraper",
     lambda d: _policy_rule(d, "ingress", 9090)["from"][0].pop("podSelector")),
]

def _drop_env(docs, name):
    c = _container(docs)[2]
    before = len(c["env"])
    c["env"] = [e for e in c["env"] if e["name"] != name]
    need(len(c["env"]) < before, f"mutation: no env {name}")


def _first(docs, kind):
    return next(d for d in docs if d["kind"] == kind)


def _probe(docs, probe):
    return _container(docs)[2][probe]


def _move_env_first(docs, name):
    c = _container(docs)[2]
    c["env"].sort(key=lambda e: e["name"] != name)


# Breaks of a meshed variant, applied to the first render with a sidecar.
MESH_MUTATIONS = [
    ("per-address connection cap on behind the sidecar", "per_address_caps_are_off_behind_a_mesh",
     lambda d: _env(d, "AGENTRT_MAX_CONNECTIONS_PER_IP").update(value="256")),
    ("per-address pending cap left to config.toml behind the sidecar", "per_address_caps_are_off_behind_a_mesh",
     lambda d: _drop_env(d, "AGENTRT_MAX_PENDING_REQUESTS_PER_IP")),
]

# Breaks of a render with custom resources, each applied to the first
# render holding its kind: a namespace left out, and one field per kind
# that its CRD's schema refuses.
CR_MUTATIONS = [
    ("a DestinationRule without a namespace", "every_namespaced_object_names_its_namespace", "DestinationRule",
     lambda d: _first(d, "DestinationRule")["metadata"].pop("namespace")),
    ("a GRPCRoute without a namespace", "every_namespaced_object_names_its_namespace", "GRPCRoute",
     lambda d: _first(d, "GRPCRoute")["metadata"].pop("namespace")),
    ("a Certificate in another namespace", "every_namespaced_object_names_its_namespace", "Certificate",
     lambda d: _first(d, "Certificate")["metadata"].update(namespace="default")),
    ("a DestinationRule keepalive interval that is no duration string", "custom_resources_match_their_crd_schemas",
     "DestinationRule", lambda d: _first(d, "DestinationRule")["spec"]["trafficPolicy"]["connectionPool"]["tcp"]
     ["tcpKeepalive"].update(interval=20)),
    ("a PeerAuthentication port mode Istio does not know", "custom_resources_match_their_crd_schemas",
     "PeerAuthentication", lambda d: _first(d, "PeerAuthentication")["spec"].update(
         portLevelMtls={"9090": {"mode": "STRICTEST"}})),
    ("a VirtualService retryOn that is no string", "custom_resources_match_their_crd_schemas",
     "VirtualService", lambda d: _first(d, "VirtualService")["spec"]["http"][-1]["retries"].update(retryOn=5)),
    ("a GRPCRoute match type Gateway API does not know", "custom_resources_match_their_crd_schemas", "GRPCRoute",
     lambda d: _first(d, "GRPCRoute")["spec"]["rules"][0]["matches"][0]["method"].update(type="Prefix")),
    ("a Certificate key algorithm cert-manager does not know", "custom_resources_match_their_crd_schemas",
     "Certificate", lambda d: _first(d, "Certificate")["spec"]["privateKey"].update(algorithm="DSA")),
]

# Breaks of a render where agentrt serves TLS, applied to the first one.
TLS_MUTATIONS = [
    ("a gRPC readiness probe on the TLS port", "probes_name_the_health_services",
     lambda d: _container(d)[2].update(readinessProbe={"grpc": {"port": 50051, "service": "readiness"}})),
    ("a TCP startup probe (blind to a drain)", "probes_name_the_health_services",
     lambda d: _container(d)[2].update(startupProbe={"tcpSocket": {"port": 50051}})),
    ("liveness probing /readyz (a drain would restart the pod)", "probes_name_the_health_services",
     lambda d: _probe(d, "livenessProbe")["httpGet"].update(path="/readyz")),
    ("the TLS port declared as plaintext gRPC", "listen_ports_match_container_services_and_policy",
     lambda d: _first(d, "Service")["spec"]["ports"][0].update(appProtocol="grpc")),
]

# Breaks of a PostgreSQL render with TLS, applied to the first one.
PG_TLS_MUTATIONS = [
    ("a replica certificate without client auth", "replicas_verify_each_other_with_tls",
     lambda d: _first(d, "Certificate")["spec"].update(usages=["server auth"])),
    ("a cluster server name the certificate does not name", "replicas_verify_each_other_with_tls",
     lambda d: _env(d, "AGENTRT_CLUSTER_SERVER_NAME").update(value="agentrt.elsewhere.svc")),
    ("no cluster CA", "replicas_verify_each_other_with_tls",
     lambda d: _drop_env(d, "AGENTRT_CLUSTER_CA_FILE")),
    ("the mTLS port advertised as plaintext", "shared_store_replicas_are_stateless",
     lambda d: _container(d)[2]["args"].__setitem__(3, "http://$(POD_IP):50052")),
]

# Breaks of a render with telemetry on, applied to the first one.
OTEL_MUTATIONS = [
    ("OTEL_RESOURCE_ATTRIBUTES before the POD_NAME it refers to", "env_references_resolve",
     lambda d: _move_env_first(d, "OTEL_RESOURCE_ATTRIBUTES")),
]


# Breaks of the PostgreSQL variant, applied to the first PostgreSQL render.
PG_MUTATIONS = [
    ("database URL inline in the ConfigMap", "shared_store_replicas_are_stateless",
     lambda d: _set_config(d, 'url_env = "AGENTRT_DATABASE_URL"', 'url = "postgresql://u:pw@db/agentrt"')),
    ("database URL as a literal env value", "shared_store_replicas_are_stateless",
     lambda d: _literal_env(d, "AGENTRT_DATABASE_URL", "postgresql://u:pw@db/agentrt")),
    ("cluster key as a literal env value", "shared_store_replicas_are_stateless",
     lambda d: _literal_env(d, "AGENTRT_CLUSTER_KEY", "not-a-secret")),
    ("a PersistentVolumeClaim volume", "shared_store_replicas_are_stateless",
     lambda d: _container(d)[1]["volumes"].append({"name": "data", "persistentVolumeClaim": {"claimName": "x"}})),
    ("internal port not declared", "shared_store_replicas_are_stateless",
     lambda d: _container(d)[2].update(ports=[p for p in _container(d)[2]["ports"] if p["name"] != "cluster"])),
    ("advertise a fixed host", "shared_store_replicas_are_stateless",
     lambda d: _container(d)[2].update(args=["--config", "/etc/agentrt/config.toml",
                                             "--cluster-advertise", "http://agentrt:50052"])),
    ("internal port open to every pod", "shared_store_replicas_are_stateless",
     lambda d: _policy_rule(d, "ingress", 50052).pop("from")),
    ("HPA on another workload", "shared_store_replicas_are_stateless",
     lambda d: next(x for x in d if x["kind"] == "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
     .update(name="other")),
]


def self_test(render, mutations=MUTATIONS):
    """Each mutation must make its check fail (so no check is vacuous)."""
    results = []
    for name, target, mutate in mutations:
        broken = Render(render.name + "*", copy.deepcopy(render.docs))
        try:
            mutate(broken.docs)
        except (Failed, StopIteration, KeyError, IndexError) as e:
            results.append((f"self-test: {name}", f"could not apply the mutation: {e}"))
            continue
        # It must fail its check, and only that one: a break that trips
        # another check first would not show that its own check works.
        failing = {c: why for c, why in run_checks(broken) if why}
        if target not in failing:
            why = f"{target} still passes"
        elif len(failing) > 1:
            why = f"other checks fail too: {sorted(set(failing) - {target})}"
        else:
            why = None
        results.append((f"self-test: {name} fails {target}", why))
    return results


def _safe(fn, render, default):
    try:
        return fn(render)
    except (Failed, KeyError, StopIteration):
        return default


def full_combination(r):
    """PostgreSQL with Istio, TLS and telemetry: every component's pieces
    land on the Deployment (none of them targets only the StatefulSet)."""
    w = r.workload
    need(w["kind"] == "Deployment", f"the workload is a {w['kind']}, not the PostgreSQL Deployment")
    names = [e["name"] for e in r.container.get("env", [])]
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_SERVICE_NAME",
                "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER"):
        need(var in names, f"the Deployment has no {var}")
    meta = w["spec"]["template"]["metadata"]
    need(meta.get("labels", {}).get("sidecar.istio.io/inject") == "true", "the Deployment's pod gets no Istio sidecar")
    need("proxy.istio.io/config" in meta.get("annotations", {}), "the Deployment's pod has no Istio proxy config")
    need(r.transport("max_connections_per_ip") == 0, "the per-address caps are on behind the sidecar")
    need(r.one("PeerAuthentication")["spec"]["mtls"]["mode"] == "STRICT", "mesh mTLS is not STRICT")
    dr = r.one("DestinationRule")["spec"]["trafficPolicy"]
    need(dr.get("tls", {}).get("mode") == "ISTIO_MUTUAL", "the DestinationRule does not use Istio mTLS")
    need(r.tls, "agentrt serves no TLS on the Deployment")
    _, vol = r.mount_for(r.setting("--tls-cert", "AGENTRT_TLS_CERT"))
    need(vol and vol.get("secret", {}).get("secretName") == r.one("Certificate")["spec"]["secretName"],
         "the certificate's Secret is not mounted on the Deployment")
    need("httpGet" in r.container["readinessProbe"], "the Deployment's readiness probe is not /readyz")
    need(r.store_kind == "postgres", "config.toml is not the PostgreSQL one")


def combinations():
    """The deploy/examples directory name of every combination a user would
    choose: an overlay with a set of components (at most one mesh)."""
    out = []
    for overlay, mesh, tls, otel in itertools.product(OVERLAYS, MESHES, (False, True), (False, True)):
        parts = [p for p in (mesh, "tls" if tls else None, "otel" if otel else None) if p]
        if parts:
            out.append("-".join([overlay] + parts))
    return out


def examples_checks(examples_dir, readme, rendered_names):
    results = []
    present = sorted(n for n in os.listdir(examples_dir) if os.path.isdir(os.path.join(examples_dir, n)))
    want = combinations()
    missing, extra = sorted(set(want) - set(present)), sorted(set(present) - set(want))
    results.append(("examples: one kustomization per combination",
                    None if not missing and not extra else f"missing {missing}, unexpected {extra}"))
    text = open(readme, encoding="utf-8").read()
    unnamed = [n for n in want if f"`{n}`" not in text]
    results.append((f"examples: {os.path.basename(readme)} names each combination",
                    None if not unnamed else f"not named: {unnamed}"))
    unrendered = [n for n in want + list(OVERLAYS) if n not in rendered_names]
    results.append(("examples: every combination and overlay rendered and checked",
                    None if not unrendered else f"not given: {unrendered}"))
    return results


def _kind_or_none(render):
    try:
        return render.store_kind
    except Failed:
        return None  # a broken render; its checks already say why


def _meshed_or_false(render):
    try:
        return _meshed(render)
    except (Failed, KeyError):
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dockerfile", required=True)
    ap.add_argument("--crd-validator", help="command validating custom resources (JSON on stdin)")
    ap.add_argument("--examples", help="deploy/examples: one directory per combination")
    ap.add_argument("--readme", help="the README that must name every combination")
    ap.add_argument("--full", help="the render with PostgreSQL, Istio, TLS and telemetry together")
    ap.add_argument("renders", nargs="+", metavar="NAME=RENDERED.yaml")
    args = ap.parse_args()
    global CRD_VALIDATOR
    CRD_VALIDATOR = shlex.split(args.crd_validator) if args.crd_validator else None
    renders = []
    for spec in args.renders:
        name, _, path = spec.partition("=")
        with open(path, encoding="utf-8") as f:
            renders.append(Render(name, list(yaml.safe_load_all(f))))
    results = []
    for r in renders:
        results += [(f"{r.name}: {c}", why) for c, why in run_checks(r)]
    results += dockerfile_checks(args.dockerfile, renders)
    results += self_test(renders[0])
    pg = [r for r in renders if _kind_or_none(r) == "postgres"]
    if pg:
        results += self_test(pg[0], PG_MUTATIONS)
    meshed = [r for r in renders if _meshed_or_false(r)]
    if meshed:
        results += self_test(meshed[0], MESH_MUTATIONS)
    for name, target, kind, mutate in CR_MUTATIONS:
        holder = next((r for r in renders if r.all(kind)), None)
        if holder is None:
            results.append((f"self-test: {name}", f"no render holds a {kind}"))
        else:
            results += self_test(holder, [(name, target, mutate)])
    tls = [r for r in renders if _safe(lambda x: x.tls, r, False)]
    if tls:
        results += self_test(tls[0], TLS_MUTATIONS)
    pg_tls = [r for r in tls if _kind_or_none(r) == "postgres"]
    if pg_tls:
        results += self_test(pg_tls[0], PG_TLS_MUTATIONS)
    otel = [r for r in renders if _safe(lambda x: x.env("OTEL_RESOURCE_ATTRIBUTES"), r, None)]
    if otel:
        results += self_test(otel[0], OTEL_MUTATIONS)
    if args.full:
        full = [r for r in renders if r.name == args.full]
        if not full:
            results.append((f"{args.full}: full combination", "not among the renders"))
        else:
            try:
                full_combination(full[0])
                results.append((f"{args.full}: OTEL_ variables, Istio sidecar and mTLS, TLS on the Deployment", None))
            except (Failed, KeyError) as e:
                results.append((f"{args.full}: full combination", str(e)))
    if args.examples:
        need(args.readme, "--examples needs --readme")
        results += examples_checks(args.examples, args.readme, {r.name for r in renders})
    passed = failed = 0
    for name, why in results:
        if why is None:
            passed += 1
            print(f"check_manifests: ok   {name}")
        else:
            failed += 1
            print(f"check_manifests: FAIL {name}: {why}")
    print(f"check_manifests: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
