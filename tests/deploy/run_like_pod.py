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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dockerfile", required=True)
    ap.add_argument("--rendered", required=True)
    ap.add_argument("--binary", required=True)
    ap.add_argument("--map", action="append", default=[], metavar="IMAGE_PATH=LOCAL_PATH")
    args = ap.parse_args()

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
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    c = next(c for c in pod["containers"] if c["name"] == "agentrt")
    claims = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    root = tempfile.mkdtemp(prefix="agentrt-pod.")
    keys = []
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    for m in c.get("volumeMounts", []):
        local = os.path.join(root, m["mountPath"].lstrip("/"))
        paths.add(m["mountPath"], local)
    for m in c.get("volumeMounts", []):
        local = os.path.join(root, m["mountPath"].lstrip("/"))
        vol = volumes.get(m["name"])
        if m["name"] in claims or (vol and "emptyDir" in vol):
            os.makedirs(local, exist_ok=True)
        elif vol and "configMap" in vol:
            data = configmaps[vol["configMap"]["name"]]["data"]
            files = {m["subPath"]: local} if "subPath" in m else {k: os.path.join(local, k) for k in data}
            for key, dest in files.items():
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                with open(dest, "w", encoding="utf-8") as f:
                    f.write(paths(data[key]))
        elif vol and "secret" in vol:
            items = vol["secret"].get("items")
            if not items:
                result(f"secret volume {m['name']}", "no items: cannot tell which files the pod gets")
                shutil.rmtree(root, ignore_errors=True)
                return finish()
            os.makedirs(local, exist_ok=True)
            for item in items:
                value = "k-" + secrets.token_hex(16)
                keys.append(value)
                with open(os.path.join(local, item["path"]), "w", encoding="utf-8") as f:
                    f.write(value)
        else:
            result(f"volume {m['name']}", f"no local stand-in for {vol}")
            shutil.rmtree(root, ignore_errors=True)
            return finish()

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": root}
    for op, rest in ops:
        if op == "ENV":
            env.update({k: paths(v) for k, v in env_pairs(rest).items()})
    fields = {"metadata.name": "agentrt-0", "metadata.namespace": "agentrt"}
    for e in c.get("env", []):
        if "value" in e:
            value = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda g: env.get(g.group(1), g.group(0)), e["value"])
        else:
            value = fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
        env[e["name"]] = paths(value)
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
        serve_checks(proc, out_path, err_path, keys, metrics_port, pod)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if any(why for _, why in RESULTS):
        print(f"----- stderr of the server -----\n{read(err_path)[-6000:]}----- end -----")
    shutil.rmtree(root, ignore_errors=True)
    return finish()


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def serve_checks(proc, out_path, err_path, keys, metrics_port, pod):
    addr, deadline = None, time.monotonic() + START_TIMEOUT
    while addr is None and time.monotonic() < deadline and proc.poll() is None:
        m = re.search(r"^agentrt-server listening on (\S+)$", read(out_path), re.M)
        addr = m.group(1) if m else None
        if addr is None:
            time.sleep(0.1)
    if not result("listening line", None if addr else f"none (exit {proc.poll()}): {read(err_path)[-3000:]}"):
        return
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

    list_sessions = channel.unary_unary("/agentrt.v1.SessionService/ListSessions",
                                        request_serializer=lambda b: b, response_deserializer=lambda b: b)
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
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            body = r.read().decode()
        result("metrics endpoint serves Prometheus text", None if "# TYPE" in body else "no # TYPE line")
    except OSError as e:
        result("metrics endpoint serves Prometheus text", str(e))
    result("the local model loaded", None if "local model loaded" in read(err_path) else "no 'local model loaded' line")

    channel.close()
    proc.send_signal(signal.SIGTERM)
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
