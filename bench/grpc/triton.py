"""bench.grpc's optional real Triton (`--triton`): PyTriton, the recipe in ../shared/servers.

Theory of operation: `PyTriton(delay_s)` runs the shared recipe as it is (pytriton_setup.sh once
when its venv is missing, pytriton_start.sh: Triton 2.51 inside PyTriton, KServe v2 gRPC on
127.0.0.1:8001, model "tiny" = INPUT x 2 after TINY_DELAY_S of simulated compute per *batch*,
dynamic batching up to 16, 20 ms queue delay) and stops it on exit by its process group
(SIGTERM, then SIGKILL), never leaving it running. Its ports are fixed by the recipe: if
something already listens on 8000-8002 (another engineer's Triton) it refuses to start rather
than measure someone else's server.

The load is the same grpc.aio generator as the rest of bench.grpc (bench/grpc/load.py), calling
`/inference.GRPCInferenceService/ModelInfer` with a serialized ModelInferRequest (raw bytes, as
tritonclient sends them). `identical()` uses tritonclient[grpc] itself: server metadata, a
ModelInfer per input, and an unknown model's error, compared direct and through the sidecar
(status, message, output tensors).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np

SERVICE = "inference.GRPCInferenceService"
METHOD = "ModelInfer"
MODEL = "tiny"
GRPC_TARGET = "127.0.0.1:8001"
PORTS = (8000, 8001, 8002)
MAX_BATCH = 16  # the recipe's ModelConfig(max_batch_size=16)
RECIPES = Path(os.environ.get("RAMPMETER_SERVERS_RECIPES", "/work/shared/servers"))  # as bench/real_servers
_SHARED_VENV = Path.home() / ".cache" / "rampmeter-servers" / "pytriton"


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class PyTriton:
    """The recipe's PyTriton with `delay_s` of compute per batch; a context manager."""

    def __init__(self, delay_s: float, work: Path) -> None:
        self.delay_s = delay_s
        self.work = work
        self.pid: int | None = None

    def __enter__(self) -> PyTriton:
        busy = [p for p in PORTS if _listening(p)]
        if busy:
            raise SystemExit(f"bench.grpc --triton: ports {busy} are in use (another Triton?); not starting")
        env = {**os.environ, "SERVERS_DIR": str(self.work), "TINY_DELAY_S": f"{self.delay_s:g}"}
        venv = Path(os.environ.get("VENV", _SHARED_VENV))
        if not (venv / "bin" / "python").exists():
            venv = self.work / "pytriton"
            subprocess.run(["bash", str(RECIPES / "pytriton_setup.sh")], env={**env, "VENV": str(venv)}, check=True)
        env["VENV"] = str(venv)
        started = subprocess.run(
            ["bash", str(RECIPES / "pytriton_start.sh")], env=env, capture_output=True, text=True, timeout=180
        )
        pid_file = self.work / "pytriton.pid"
        if pid_file.exists():
            self.pid = int(pid_file.read_text())
        if started.returncode != 0:
            self.__exit__()
            raise SystemExit(f"bench.grpc --triton: PyTriton did not start: {started.stdout[-2000:]}")
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM)  # the recipe's `kill -TERM -- -PID` (setsid: its own group)
        until = time.monotonic() + 20
        while time.monotonic() < until and (_alive(self.pid) or any(_listening(p) for p in PORTS)):
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.pid = None


def wait_idle(timeout_s: float = 90.0) -> float:
    """Until Triton has no request pending (its :8002 metrics), then one batch more; the seconds waited.

    Triton keeps computing a call whose client gave up (docs/real-servers.md): after an overload
    run its queue still holds the calls that ended DEADLINE_EXCEEDED, and the next case would
    wait behind them."""
    import httpx

    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            text = httpx.get("http://127.0.0.1:8002/metrics", timeout=5).text
        except httpx.HTTPError:
            break
        pending = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("nv_inference_pending_request_count{")
        )
        if pending == 0:
            break
        time.sleep(0.25)
    time.sleep(0.5)
    return time.monotonic() - started


def _alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def infer_request(value: float = 1.0, width: int = 4) -> bytes:
    """A serialized ModelInferRequest for "tiny": INPUT FP32 [1, width] of `value`."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="INPUT", datatype="FP32", shape=[1, width])
    request.raw_input_contents.append(np.full((1, width), value, np.float32).tobytes())
    return request.SerializeToString()


def identical(direct: str, via: str) -> tuple[bool, list]:
    """tritonclient[grpc] calls direct and through the sidecar: (all the same, what was seen direct)."""
    seen = [_outcome(direct), _outcome(via)]
    return seen[0] == seen[1], seen[0]


def _outcome(target: str) -> list:
    import tritonclient.grpc as tg
    from tritonclient.utils import InferenceServerException

    out: list = []
    client = tg.InferenceServerClient(url=target)
    try:
        metadata = client.get_model_metadata(MODEL)
        out.append(("metadata", metadata.name, [(t.name, t.datatype) for t in metadata.outputs]))
        for value in (0.0, 1.5, -3.0, 1e6):
            x = np.full((1, 4), value, np.float32)
            tensor = tg.InferInput("INPUT", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            result = client.infer(MODEL, [tensor], client_timeout=30)
            out.append(("infer", value, result.as_numpy("OUTPUT").tolist()))
        try:
            client.infer("no-such-model", [tensor], client_timeout=30)
            out.append(("unknown model", "answered"))
        except InferenceServerException as exc:
            out.append(("unknown model", exc.status(), exc.message()))
    finally:
        client.close()
    return out
