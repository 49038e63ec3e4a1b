"""Runs the image's steps without Docker: what deploy/Dockerfile does at
build time and what the pod does at run time, on this machine.

    python3 tests/deploy/run_like_pod.py --dockerfile deploy/Dockerfile \
        --rendered base.yaml --binary target/release/agentrt-server \
        --map /opt/agentrt/models=.ci/models

1. The `model` stage's RUN commands, with the image's paths mapped to
   local ones (--map), so the model is provisioned exactly as the image
   build provisions it.
2. The start command of the rendered StatefulSet on the image: the final
   stage's ENTRYPOINT (the local --binary) with the container's args (or
   CMD), the image's ENV plus the container's env (fieldRefs filled in as
   for pod agentrt-0), and every volume mount recreated under a temporary
   root: the ConfigMap's files as rendered, the Secret's items as fresh
   random keys, the data volume as an empty directory. Paths in args, env
   and the config file are rewritten to that root; nothing else changes,
   except two loopback overrides in the environment (AGENTRT_LISTEN and
   AGENTRT_METRICS_LISTEN), because a test binds 127.0.0.1 with a free port
   rather than 0.0.0.0:50051.
3. Checks: the listening line, health `readiness` and `liveness` SERVING
   (grpcio, hand-encoded grpc.health.v1 messages), a call with a key from
   the Secret files succeeds and one without is UNAUTHENTICATED, the
   metrics endpoint answers, the local model loaded, every stderr line is
   JSON, no key appears in any output, and SIGTERM ends the process with
   status 0.

With --image TAG (and --buildah-root DIR), the same pod runs inside the
image deploy/Dockerfile built (tests/deploy/image/build.sh), through
`buildah run --isolation chroot`: the image's own ENTRYPOINT, CMD, ENV,
USER and files (the model baked in by its model stage), the volume mounts
bind-mounted at their real paths and owned by the image's user, as a
kubelet with fsGroup would leave them. No path is rewritten. When the pod
mounts a TLS Secret (the tls component), a test CA and a certificate for
the Certificate's DNS names and 127.0.0.1 fill it, and the checks speak
TLS. Both modes also probe /readyz and /livez over HTTP, and drain the
server with RuntimeAdmin.Drain (an admin key from the Secret): /readyz
must answer 503 and /livez 200 until RuntimeAdmin.Undrain.

Ends with `run_like_pod: N passed, M failed`; exit status 1 on any failure.
"""

import argparse
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import grpc
import yaml

from urllib.error import HTTPError

START_TIMEOUT = 120  # seconds to the listening line (a cold model load included)
READY_TIMEOUT = 60
RESULTS = []


def result(name, why=None):
    RESULTS.append((name, why))
    print(f"run_like_pod: {'ok  ' if why is None else 'FAIL'} {name}{'' if why is None else ': ' + why}", flush=True)
    return why is None


def dockerfile_stages(path):
    """{stage name: [(INSTRUCTION, rest)]}; a stage FROM another inherits it."""
    text = re.sub(r"\\\n", " ", open(path, encoding="utf-8").read())
    stages, current, last = {}, None, None
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        op = words[0].upper()
        if op == "FROM":
            name = words[3] if len(words) > 3 and words[2].upper() == "AS" else f"#{len(stages)}"
            current = list(stages.get(words[1], []))
            stages[name] = current
            last = name
        elif current is not None:
            current.append((op, line.split(None, 1)[1] if len(words) > 1 else ""))
    return stages, last


def env_pairs(rest):
    return dict(kv.split("=", 1) for kv in shlex.split(rest) if "=" in kv)


class PathMap:
    """Rewrites absolute image/pod paths to local ones, in one pass."""

    def __init__(self, pairs):
        self.pairs = dict(pairs)

    def add(self, src, dst):
        self.pairs[src.rstrip("/")] = str(dst)

    def __call__(self, text):
        keys = sorted(self.pairs, key=len, reverse=True)
        pattern = re.compile("|".join(re.escape(k) + r"(?=/|\"|'|\s|$|,)" for k in keys))
        return pattern.sub(lambda m: self.pairs[m.group(0)], text)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health_check(channel, service):
    req = service.encode()
    assert len(req) < 128, "a one-byte length prefix"
    call = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=lambda s: b"\x0a" + bytes([len(s)]) + s if s else b"",
        response_deserializer=lambda b: b[1] if len(b) >= 2 and b[0] == 0x08 else 0,
    )
    return call(req, timeout=5)


class Image:
    """The image as buildah stored it, and a container of it to run in."""

    def __init__(self, tag, root):
        os.makedirs(os.path.join(root, "tmp"), exist_ok=True)
        self.buildah = ["env", f"TMPDIR={os.path.join(root, 'tmp')}", "buildah", "--root", os.path.join(root, "storage"),
                        "--runroot", os.path.join(root, "run"), "--storage-driver", "vfs"]
        out = subprocess.run(self.buildah + ["inspect", "--type", "image", tag],
                             capture_output=True, text=True, check=True).stdout
        config = json.loads(out)["OCIv1"]["config"]
        self.entrypoint = config.get("Entrypoint") or []
        self.cmd = config.get("Cmd") or []
        self.env = dict(e.split("=", 1) for e in config.get("Env") or [])
        user = config.get("User") or "0:0"
        self.uid, _, gid = user.partition(":")
        self.uid, self.gid = int(self.uid), int(gid or self.uid)
        self.container = subprocess.run(self.buildah + ["from", "--quiet", tag],
                                        capture_output=True, text=True, check=True).stdout.strip()

    def popen(self, argv, env, mounts, stdout, stderr):
        """`buildah run` of argv in the container."""
        config = [a for k, v in env.items() for a in ("--env", f"{k}={v}")]
        subprocess.run(self.buildah + ["config"] + config + [self.container], check=True)
        volumes = [a for local, path, ro in mounts for a in ("--volume", f"{local}:{path}{':ro' if ro else ''}")]
        return subprocess.Popen(self.buildah + ["run", "--isolation", "chroot"] + volumes
                                + [self.container, "--"] + argv, stdout=stdout, stderr=stderr)

    def remove(self):
        subprocess.run(self.buildah + ["rm", self.container], capture_output=True)


def descendant(pid, comm):
    """The first process below pid whose name is comm (the server inside
    `buildah run`, which does not pass signals on to it)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat", encoding="utf-8").read()
            except OSError:
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            children.setdefault(ppid, []).append((int(entry), name))
    todo = [pid]
    while todo:
        for child, name in children.get(todo.pop(), []):
            if name == comm:
                return child
            todo.append(child)
    return None


def make_tls(directory, names, uid, gid):
    """tls.crt, tls.key and ca.crt as cert-manager writes them: a test CA and
    a server certificate for names, localhost and 127.0.0.1."""
    ca_key, ca_crt = os.path.join(directory, "ca.key"), os.path.join(directory, "ca.crt")
    key, csr, crt = (os.path.join(directory, n) for n in ("tls.key", "tls.csr", "tls.crt"))
    ext = os.path.join(directory, "san.ext")
    sans = ",".join([f"DNS:{n}" for n in names + ["localhost"]] + ["IP:127.0.0.1"])
    with open(ext, "w", encoding="utf-8") as f:
        f.write(f"subjectAltName={sans}\nextendedKeyUsage=serverAuth,clientAuth\n")
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
        "-subj", "/CN=agentrt test CA", "-keyout", ca_key, "-out", ca_crt)
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={names[0]}",
        "-keyout", key, "-out", csr)
    run("x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial", "-days", "2",
        "-extfile", ext, "-out", crt)
    for leftover in (ca_key, csr, ext, os.path.join(directory, "ca.srl")):
        if os.path.exists(leftover):
            os.remove(leftover)
    for name in os.listdir(directory):
        os.chown(os.path.join(directory, name), uid, gid)
    with open(ca_crt, "rb") as f:
        return f.read()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dockerfile", required=True)
    ap.add_argument("--rendered", required=True)
    ap.add_argument("--binary", help="the local binary standing in for the image's ENTRYPOINT")
    ap.add_argument("--map", action="append", default=[], metavar="IMAGE_PATH=LOCAL_PATH")
    ap.add_argument("--image", help="run inside this image (buildah) instead of --binary")
    ap.add_argument("--buildah-root", help="buildah's storage root (tests/deploy/image/build.sh's BUILDAH_ROOT)")
    args = ap.parse_args()
    if bool(args.image) == bool(args.binary):
        ap.error("give exactly one of --binary and --image")
    if args.image:
        return run_image(args)

    binary = os.path.abspath(args.binary)
    stages, final = dockerfile_stages(args.dockerfile)
    ops = stages[final]
    last = lambda op: next((v for o, v in reversed(ops) if o == op), None)  # noqa: E731
    entrypoint = json.loads(last("ENTRYPOINT"))
    paths = PathMap({entrypoint[0]: binary})
    for m in args.map:
        src, _, dst = m.partition("=")
        os.makedirs(dst, exist_ok=True)
        paths.add(src, os.path.abspath(dst))

    # 1. The model stage, as the image build runs it.
    for op, rest in stages.get("model", []):
        if op != "RUN":
            continue
        cmd = shlex.split(paths(rest))
        if cmd[0] == os.path.basename(entrypoint[0]):
            cmd[0] = binary
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if not result(f"model stage: {' '.join(cmd)}", None if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr[-2000:]}"):
            return finish()

    # 2. The pod.
    docs = [d for d in yaml.safe_load_all(open(args.rendered, encoding="utf-8")) if d]
    pod, c = pod_of(docs)
    root = tempfile.mkdtemp(prefix="agentrt-pod.")
    for m in c.get("volumeMounts", []):
        paths.add(m["mountPath"], os.path.join(root, m["mountPath"].lstrip("/")))
    try:
        volumes = make_volumes(docs, pod, c, root, paths, None)
    except ValueError as e:
        result("volumes", str(e))
        shutil.rmtree(root, ignore_errors=True)
        return finish()

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": root}
    for op, rest in ops:
        if op == "ENV":
            env.update({k: paths(v) for k, v in env_pairs(rest).items()})
    env.update(container_env(c, env, paths))
    metrics_port = free_port()
    env["AGENTRT_LISTEN"] = "127.0.0.1:0"
    env["AGENTRT_METRICS_LISTEN"] = f"127.0.0.1:{metrics_port}"
    argv = [binary] + [paths(a) for a in c.get("args", json.loads(last("CMD") or "[]"))]
    if c.get("command"):
        argv = [paths(a) for a in c["command"]] + argv[1:]
    print(f"run_like_pod: starting {' '.join(shlex.quote(a) for a in argv)} in {root}", flush=True)
    out_path, err_path = os.path.join(root, "stdout"), os.path.join(root, "stderr")
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(argv, env=env, cwd=root, stdout=out, stderr=err)
    try:
        serve_checks(proc, lambda: proc.pid, out_path, err_path, volumes, metrics_port, pod)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if any(why for _, why in RESULTS):
        print(f"----- stderr of the server -----\n{read(err_path)[-6000:]}----- end -----")
    shutil.rmtree(root, ignore_errors=True)
    return finish()


def run_image(args):
    """The pod's start command inside the built image (buildah run)."""
    image = Image(args.image, args.buildah_root)
    docs = [d for d in yaml.safe_load_all(open(args.rendered, encoding="utf-8")) if d]
    pod, c = pod_of(docs)
    root = tempfile.mkdtemp(prefix="agentrt-pod.")
    try:
        try:
            volumes = make_volumes(docs, pod, c, root, lambda text: text, (image.uid, image.gid))
        except ValueError as e:
            result("volumes", str(e))
            return finish()
        env = container_env(c, image.env, lambda text: text)
        metrics_port = free_port()
        env["AGENTRT_LISTEN"] = "127.0.0.1:0"
        env["AGENTRT_METRICS_LISTEN"] = f"127.0.0.1:{metrics_port}"
        argv = list(c.get("command") or image.entrypoint) + list(c.get("args", image.cmd))
        print(f"run_like_pod: starting {' '.join(shlex.quote(a) for a in argv)} in image {args.image} "
              f"as {image.uid}:{image.gid}", flush=True)
        out_path, err_path = os.path.join(root, "stdout"), os.path.join(root, "stderr")
        with open(out_path, "w") as out, open(err_path, "w") as err:
            proc = image.popen(argv, env, volumes.mounts, out, err)
        server = os.path.basename(argv[0])[:15]
        try:
            serve_checks(proc, lambda: descendant(proc.pid, server), out_path, err_path, volumes,
                         metrics_port, pod)
        finally:
            if proc.poll() is None:
                pid = descendant(proc.pid, server)
                if pid:
                    os.kill(pid, signal.SIGKILL)
                proc.kill()
                proc.wait()
        if any(why for _, why in RESULTS):
            print(f"----- stderr of the server -----\n{read(err_path)[-6000:]}----- end -----")
    finally:
        image.remove()
        shutil.rmtree(root, ignore_errors=True)
    return finish()


def pod_of(docs):
    """The workload's pod spec and its agentrt container."""
    workload = next(d for d in docs if d["kind"] in ("StatefulSet", "Deployment"))
    pod = workload["spec"]["template"]["spec"]
    return pod, next(c for c in pod["containers"] if c["name"] == "agentrt")


class Volumes:
    """What make_volumes made: (local, mountPath, read-only) triples, the
    API keys by Secret item, and the TLS CA when the pod serves TLS."""

    def __init__(self):
        self.mounts, self.keys, self.ca = [], {}, None


def make_volumes(docs, pod, c, root, rewrite, owner):
    """Every volume mount of the container recreated at root + its mountPath: ConfigMap
    files as rendered (through rewrite), a key Secret's items as fresh
    random keys, a TLS Secret (no items: cert-manager's tls.crt, tls.key,
    ca.crt) as a test CA's certificate, claims and emptyDirs empty. owner
    (uid, gid) owns them all when given, as fsGroup would."""
    workload = next(d for d in docs if d["kind"] in ("StatefulSet", "Deployment"))
    claims = {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    certificates = {d["spec"]["secretName"]: d for d in docs if d["kind"] == "Certificate"}
    made = Volumes()
    for m in c.get("volumeMounts", []):
        local = os.path.join(root, m["mountPath"].lstrip("/"))
        vol = volumes.get(m["name"])
        read_only = bool(vol and ("configMap" in vol or "secret" in vol))
        if m["name"] in claims or (vol and "emptyDir" in vol):
            os.makedirs(local, exist_ok=True)
        elif vol and "configMap" in vol:
            data = configmaps[vol["configMap"]["name"]]["data"]
            files = {m["subPath"]: local} if "subPath" in m else {k: os.path.join(local, k) for k in data}
            for key, dest in files.items():
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                with open(dest, "w", encoding="utf-8") as f:
                    f.write(rewrite(data[key]))
        elif vol and "secret" in vol:
            name = vol["secret"]["secretName"]
            items = vol["secret"].get("items")
            os.makedirs(local, exist_ok=True)
            if name in certificates:
                made.ca = make_tls(local, certificates[name]["spec"]["dnsNames"], *(owner or (os.getuid(), os.getgid())))
            elif not items:
                raise ValueError(f"secret volume {m['name']}: no items, cannot tell which files the pod gets")
            else:
                for item in items:
                    value = "k-" + secrets.token_hex(16)
                    made.keys[item["path"]] = value
                    with open(os.path.join(local, item["path"]), "w", encoding="utf-8") as f:
                        f.write(value)
        else:
            raise ValueError(f"volume {m['name']}: no local stand-in for {vol}")
        made.mounts.append((local, m["mountPath"], read_only))
    if owner:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                os.chown(os.path.join(dirpath, name), *owner)
    return made


def container_env(c, env, rewrite):
    """The container's env over the image's (env): values with $(VAR)
    references expanded, fieldRefs as for pod agentrt-0."""
    out = dict(env)
    fields = {"metadata.name": "agentrt-0", "metadata.namespace": "agentrt"}
    for e in c.get("env", []):
        if "value" in e:
            value = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda g: out.get(g.group(1), g.group(0)), e["value"])
        else:
            value = fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
        out[e["name"]] = rewrite(value)
    return out


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def http_get(port, path):
    """(status, body) of GET path on the metrics listener."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return None, str(e)


def serve_checks(proc, server_pid, out_path, err_path, volumes, metrics_port, pod):
    addr, deadline = None, time.monotonic() + START_TIMEOUT
    while addr is None and time.monotonic() < deadline and proc.poll() is None:
        m = re.search(r"^agentrt-server listening on (\S+)$", read(out_path), re.M)
        addr = m.group(1) if m else None
        if addr is None:
            time.sleep(0.1)
    if not result("listening line", None if addr else f"none (exit {proc.poll()}): {read(err_path)[-3000:]}"):
        return
    if volumes.ca:
        # The certificate names localhost and 127.0.0.1 beside the Service's names.
        channel = grpc.secure_channel(addr, grpc.ssl_channel_credentials(root_certificates=volumes.ca))
        with grpc.insecure_channel(addr) as plain:
            try:
                health_check(plain, "liveness")
                result("a plaintext call to the TLS port fails", "it succeeded")
            except grpc.RpcError as e:
                result("a plaintext call to the TLS port fails",
                       None if e.code() == grpc.StatusCode.UNAVAILABLE else f"{e.code()}")
    else:
        channel = grpc.insecure_channel(addr)
    status, deadline = 0, time.monotonic() + READY_TIMEOUT
    while status != 1 and time.monotonic() < deadline:
        try:
            status = health_check(channel, "readiness")
        except grpc.RpcError:
            status = 0
        if status != 1:
            time.sleep(0.2)
    result("health readiness SERVING", None if status == 1 else f"status {status}")
    try:
        result("health liveness SERVING", None if health_check(channel, "liveness") == 1 else "not SERVING")
    except grpc.RpcError as e:
        result("health liveness SERVING", f"{e.code()}: {e.details()}")
    for path in ("/readyz", "/livez"):
        code, body = http_get(metrics_port, path)
        result(f"GET {path} 200", None if code == 200 else f"{code}: {body[:200]}")

    keys = list(volumes.keys.values())
    raw = lambda method: channel.unary_unary(method, request_serializer=lambda b: b,  # noqa: E731
                                             response_deserializer=lambda b: b)
    list_sessions = raw("/agentrt.v1.SessionService/ListSessions")
    try:
        list_sessions(b"", timeout=10, metadata=[("authorization", f"Bearer {keys[0]}")])
        result("a key from the Secret files authenticates")
    except grpc.RpcError as e:
        result("a key from the Secret files authenticates", f"{e.code()}: {e.details()}")
    try:
        list_sessions(b"", timeout=10)
        result("a call without a key is refused", "it succeeded")
    except grpc.RpcError as e:
        result("a call without a key is refused",
               None if e.code() == grpc.StatusCode.UNAUTHENTICATED else f"{e.code()}")
    code, body = http_get(metrics_port, "/metrics")
    result("metrics endpoint serves Prometheus text", None if code == 200 and "# TYPE" in body else f"{code}")
    result("the local model loaded", None if "local model loaded" in read(err_path) else "no 'local model loaded' line")

    # A drain flips readiness (HTTP and gRPC), not liveness; Undrain flips it back.
    admin = [("authorization", f"Bearer {volumes.keys.get('admin', '')}")]
    try:
        raw("/agentrt.v1.RuntimeAdmin/Drain")(b"", timeout=60, metadata=admin)
        code, _ = http_get(metrics_port, "/readyz")
        result("draining: GET /readyz 503", None if code == 503 else f"{code}")
        code, _ = http_get(metrics_port, "/livez")
        result("draining: GET /livez 200", None if code == 200 else f"{code}")
        serving = health_check(channel, "readiness")
        result("draining: health readiness NOT_SERVING", None if serving == 2 else f"status {serving}")
        raw("/agentrt.v1.RuntimeAdmin/Undrain")(b"", timeout=10, metadata=admin)
        code, _ = http_get(metrics_port, "/readyz")
        result("undrained: GET /readyz 200", None if code == 200 else f"{code}")
    except grpc.RpcError as e:
        result("RuntimeAdmin.Drain/Undrain with the admin key", f"{e.code()}: {e.details()}")

    channel.close()
    pid = server_pid()
    if not result("the server process found", None if pid else "no process"):
        return
    os.kill(pid, signal.SIGTERM)
    grace = pod.get("terminationGracePeriodSeconds", 30)
    try:
        rc = proc.wait(timeout=grace)
        result("SIGTERM: exit status 0 within the grace period", None if rc == 0 else f"exit status {rc}")
    except subprocess.TimeoutExpired:
        result("SIGTERM: exit status 0 within the grace period", f"still running after {grace}s")
    err = read(err_path)
    bad = [line for line in err.splitlines() if line.strip() and not is_json(line)]
    result("every stderr line is JSON", None if not bad else f"{len(bad)} not: {bad[:3]}")
    leaked = [k for k in keys if k in err or k in read(out_path)]
    result("no key appears in the output", None if not leaked else f"{len(leaked)} keys printed")


def is_json(line):
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def finish():
    passed = sum(1 for _, why in RESULTS if why is None)
    failed = len(RESULTS) - passed
    print(f"run_like_pod: {passed} passed, {failed} failed")
    return 1 if failed or not RESULTS else 0


if __name__ == "__main__":
    sys.exit(main())
