"""bench.grpc's optional real KServe v2 servers (`--triton`, `--mlserver`): the recipes in ../shared/servers.

Theory of operation: `RealServer(recipe, delay_s, work)` runs a shared recipe as it is (NAME_setup.sh
once when its venv is missing, NAME_start.sh) and stops it on exit by its process group (SIGTERM,
then SIGKILL), never leaving it running. Two recipes, both serving model "tiny" = INPUT x 2 after
TINY_DELAY_S of simulated compute per *batch*, batches of up to 16 with a 20 ms window, over
KServe v2 gRPC (inference.GRPCInferenceService):
- PYTRITON: Triton 2.51 inside PyTriton 0.7.0, gRPC on 127.0.0.1:8001 (HTTP 8000, metrics 8002);
  it serves grpc.health.v1, so the sidecar runs policies/triton-grpc.toml as shipped.
- MLSERVER: MLServer 1.7.1, gRPC on 127.0.0.1:8081 (HTTP 8080, metrics 8082). It has no
  grpc.health.v1 (Check answers UNIMPLEMENTED), so the policy's other health choice is used:
  HTTP /v2/health/ready on its HTTP port (`health_port`), as docs/grpc.md describes. Its adaptive
  batcher cuts a batch max_batch_time after the batch's first arrival and queues it for the model
  whether or not the model is free, so calls let in one by one split its batches for good: the
  sidecar runs with limits.dispatch_batch = its max_batch_size (16).
Their ports are fixed by the recipes: if something already listens on one (someone else's
server) it refuses to start rather than measure that.

The load is the same grpc.aio generator as the rest of bench.grpc (bench/grpc/load.py), calling
`/inference.GRPCInferenceService/ModelInfer` with a serialized ModelInferRequest (raw bytes, as
tritonclient sends them). `identical()` uses tritonclient[grpc] itself: model metadata, a
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SERVICE = "inference.GRPCInferenceService"
METHOD = "ModelInfer"
MODEL = "tiny"
MAX_BATCH = 16  # both recipes: max_batch_size 16
RECIPES = Path(os.environ.get("RAMPMETER_SERVERS_RECIPES", "/work/shared/servers"))  # as bench/real_servers
_SHARED_VENVS = Path.home() / ".cache" / "rampmeter-servers"


def _triton_pending(metrics: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("nv_inference_pending_request_count{")
    )


@dataclass(frozen=True)
class Recipe:
    name: str  # the recipe's NAME in ../shared/servers (NAME_setup.sh, NAME_start.sh, NAME.pid)
    label: str
    ports: tuple[int, int, int]  # HTTP, gRPC, metrics
    warmup: str  # the [warmup] health lines of the sidecar's policy
    pending: Callable[[str], float] | None  # metrics text -> calls the server holds; None: ask by a call (`wait_idle`)
    dispatch_batch: int  # the policy's limits.dispatch_batch for it (docs/grpc.md)

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.ports[1]}"


PYTRITON = Recipe(
    "pytriton",
    "Triton 2.51 (PyTriton 0.7.0)",
    (8000, 8001, 8002),
    'health_check = "grpc"\ngrpc_health_service = ""',
    _triton_pending,
    1,  # its dynamic batcher forms a batch when the model is free: slots go as they free
)
MLSERVER = Recipe(
    "mlserver",
    "MLServer 1.7.1",
    (8080, 8081, 8082),
    'health_check = "http"\nhealth_path = "/v2/health/ready"\nhealth_port = 8080',
    None,  # its metrics count a call its client gave up on neither as handled nor as failed, ever
    MAX_BATCH,  # its adaptive batcher cuts a batch 20 ms after the first arrival: calls must come in groups
)
RECIPES_BY_NAME = {r.name: r for r in (PYTRITON, MLSERVER)}


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class RealServer:
    """A recipe's server with `delay_s` of compute per batch; a context manager."""

    def __init__(self, recipe: Recipe, delay_s: float, work: Path) -> None:
        self.recipe = recipe
        self.delay_s = delay_s
        self.work = work
        self.pid: int | None = None

    def __enter__(self) -> RealServer:
        name = self.recipe.name
        busy = [p for p in self.recipe.ports if _listening(p)]
        if busy:
            raise SystemExit(f"bench.grpc: ports {busy} are in use (another {name}?); not starting")
        env = {**os.environ, "SERVERS_DIR": str(self.work), "TINY_DELAY_S": f"{self.delay_s:g}"}
        env.pop("VIRTUAL_ENV", None)
        venv = _SHARED_VENVS / name
        if not (venv / "bin" / "python").exists():
            venv = self.work / name
            subprocess.run(["bash", str(RECIPES / f"{name}_setup.sh")], env={**env, "VENV": str(venv)}, check=True)
        env["VENV"] = str(venv)
        started = subprocess.run(
            ["bash", str(RECIPES / f"{name}_start.sh")], env=env, capture_output=True, text=True, timeout=180
        )
        pid_file = self.work / f"{name}.pid"
        if pid_file.exists():
            self.pid = int(pid_file.read_text())
        if started.returncode != 0:
            self.__exit__()
            raise SystemExit(f"bench.grpc: {name} did not start: {started.stdout[-2000:]}")
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM)  # the recipe's `kill -TERM -- -PID` (setsid: its own group)
        until = time.monotonic() + 20
        while time.monotonic() < until and (_alive(self.pid) or any(_listening(p) for p in self.recipe.ports)):
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.pid = None

    def wait_idle(self, timeout_s: float = 120.0) -> float:
        """Until the server holds no call, then one batch more; the seconds waited.

        Both recipes keep computing a call whose client gave up (docs/real-servers.md): after an
        overload run their queue still holds the calls that ended DEADLINE_EXCEEDED, and the next
        case would wait behind them. Triton says how many it holds (its :8002 metrics); MLServer
        does not, so a ModelInfer call is made until one answers within two batch times (its
        batches run one after another in one worker: a call waits behind all it holds)."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if self._idle():
                break
            time.sleep(0.25)
        time.sleep(0.5)
        return time.monotonic() - started

    def _idle(self) -> bool:
        import grpc
        import httpx

        if self.recipe.pending is not None:
            try:
                text = httpx.get(f"http://127.0.0.1:{self.recipe.ports[2]}/metrics", timeout=5).text
            except httpx.HTTPError:
                return True
            return self.recipe.pending(text) <= 0
        with grpc.insecure_channel(self.recipe.grpc_target) as channel:
            call = channel.unary_unary(f"/{SERVICE}/{METHOD}")
            began = time.monotonic()
            try:
                call(infer_request(), timeout=30)
            except grpc.RpcError:
                return False
            return time.monotonic() - began < 2 * self.delay_s + 0.1


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
