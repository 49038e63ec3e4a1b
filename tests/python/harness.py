"""Helpers shared by the smoke stage's Python scripts (deadline_client.py,
busy_grpcurl.py, tls_client.py): a server process, a check counter and the
stub generator. The grpcio scenarios themselves live in the pytest suite,
tests/polyglot/python."""

from __future__ import annotations

import glob
import os
import queue
import subprocess
import sys
import threading

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
START_TIMEOUT = 60.0
LISTENING = "agentrt-server listening on "


class Server:
    """agentrt-server on 127.0.0.1:0 with a data dir under `work` and the
    given extra arguments; `addr` is the address from its "listening" line,
    or None when it exited or printed none within START_TIMEOUT. Its stdout
    is copied to WORK/NAME.out, its stderr goes to WORK/NAME.err."""

    def __init__(self, binary: str, work: str, name: str, args: list[str],
                 env: dict[str, str] | None = None) -> None:
        self.log = os.path.join(work, f"{name}.err")
        self.err = open(self.log, "w")
        self.proc = subprocess.Popen(
            [binary, "--listen", "127.0.0.1:0", "--data-dir", os.path.join(work, f"{name}-data"),
             *args],
            stdout=subprocess.PIPE,
            stderr=self.err,
            env=env,
            text=True,
        )
        lines: queue.Queue[str | None] = queue.Queue()
        self.copier = threading.Thread(
            target=self._copy, args=(os.path.join(work, f"{name}.out"), lines), daemon=True
        )
        self.copier.start()
        self.addr = None
        while self.addr is None:
            try:
                line = lines.get(timeout=START_TIMEOUT)
            except queue.Empty:
                break
            if line is None:  # stdout closed: the process exited
                break
            if line.startswith(LISTENING):
                self.addr = line.removeprefix(LISTENING).strip()

    def _copy(self, path: str, lines: queue.Queue) -> None:
        with open(path, "w") as out:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                out.write(line)
                out.flush()
                lines.put(line)
        lines.put(None)

    def log_text(self) -> str:
        """Everything the server wrote to stderr so far."""
        with open(self.log) as f:
            return f.read()

    def stderr(self) -> str:
        return self.log_text()[-2000:]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.copier.join(timeout=15)
        self.err.close()


class Checks:
    """Counts checks and prints one line per check."""

    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        if ok:
            self.passed += 1
            print(f"  ok   {name}", flush=True)
        else:
            self.failed += 1
            suffix = f": {detail}" if detail else ""
            print(f"  FAIL {name}{suffix}", flush=True)
        return ok


def generate_stubs(out_dir: str) -> None:
    """Generates the agentrt.v1 Python stubs from proto/ into out_dir."""
    protos = sorted(
        os.path.relpath(p, REPO_ROOT)
        for p in glob.glob(os.path.join(REPO_ROOT, "proto", "agentrt", "v1", "*.proto"))
    )
    if not protos:
        raise RuntimeError(f"no .proto files under {REPO_ROOT}/proto/agentrt/v1")
    cmd = [
        sys.executable, "-m", "grpc_tools.protoc", "-I", "proto",
        f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", *protos,
    ]
    result = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(
            f"grpc_tools.protoc failed ({result.returncode}):\n{result.stdout}{result.stderr}"
        )
