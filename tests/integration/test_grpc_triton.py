"""A Triton-shaped case (issue 17): tritonclient[grpc] against a small KServe v2 servicer built from
tritonclient's own generated stubs, direct and through the sidecar running policies/triton-grpc.toml.

The servicer serves one model, `add_one` (FP32 [1, N] -> INPUT0 + 1), with raw tensor contents as
tritonclient sends them, plus the standard gRPC health service the policy asks.
"""

from __future__ import annotations

import time
from concurrent import futures
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from proxy.testing.stack import sidecar

POLICY = Path(__file__).resolve().parents[2] / "policies" / "triton-grpc.toml"
MODEL = "add_one"


class KServe(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self) -> None:
        self.infers = 0

    def ServerLive(self, request, context):
        return service_pb2.ServerLiveResponse(live=True)

    def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=True)

    def ModelReady(self, request, context):
        return service_pb2.ModelReadyResponse(ready=request.name == MODEL)

    def ModelMetadata(self, request, context):
        self._known(request.name, context)
        tensor = service_pb2.ModelMetadataResponse.TensorMetadata
        return service_pb2.ModelMetadataResponse(
            name=MODEL,
            versions=["1"],
            platform="python",
            inputs=[tensor(name="INPUT0", datatype="FP32", shape=[1, -1])],
            outputs=[tensor(name="OUTPUT0", datatype="FP32", shape=[1, -1])],
        )

    def ModelInfer(self, request, context):
        self._known(request.model_name, context)
        self.infers += 1
        values = np.frombuffer(request.raw_input_contents[0], dtype=np.float32)
        out = service_pb2.ModelInferResponse.InferOutputTensor(
            name="OUTPUT0", datatype="FP32", shape=list(request.inputs[0].shape)
        )
        return service_pb2.ModelInferResponse(
            model_name=MODEL,
            model_version="1",
            id=request.id,
            outputs=[out],
            raw_output_contents=[(values + 1).astype(np.float32).tobytes()],
        )

    def _known(self, name: str, context) -> None:
        if name != MODEL:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{name}' is not found")


@pytest.fixture(scope="module")
def kserve():
    servicer = KServe()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    checker = health.HealthServicer()
    checker.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with sidecar(f"http://127.0.0.1:{port}", policy=str(POLICY), protocol="h2c") as car:
            yield servicer, f"127.0.0.1:{port}", car.url("data").removeprefix("http://")
    finally:
        server.stop(grace=None).wait(5)


def infer(url: str, data: np.ndarray, **kwargs):
    client = triton.InferenceServerClient(url=url)
    try:
        tensor = triton.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        result = client.infer(MODEL, [tensor], request_id="r1", client_timeout=10, **kwargs)
        return result.as_numpy("OUTPUT0"), result.get_response()
    finally:
        client.close()


def test_a_triton_client_gets_the_same_answers_through_the_sidecar(kserve) -> None:
    servicer, direct, via = kserve
    data = np.arange(1024, dtype=np.float32).reshape(1, -1)
    out_direct, response_direct = infer(direct, data)
    out_via, response_via = infer(via, data)
    np.testing.assert_array_equal(out_via, data + 1)
    np.testing.assert_array_equal(out_via, out_direct)
    assert response_via == response_direct
    assert servicer.infers == 2
    for url in (direct, via):
        client = triton.InferenceServerClient(url=url)
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(MODEL)
        assert client.get_model_metadata(MODEL).inputs[0].name == "INPUT0"
        client.close()


def test_an_unknown_model_is_the_same_error_through_the_sidecar(kserve) -> None:
    _, direct, via = kserve
    seen = []
    for url in (direct, via):
        client = triton.InferenceServerClient(url=url)
        with pytest.raises(InferenceServerException) as info:
            client.get_model_metadata("nope")
        client.close()
        seen.append((info.value.status(), info.value.message()))
    assert seen[0] == seen[1]
    assert seen[0][0] == "StatusCode.NOT_FOUND"


def test_a_model_infer_warm_up_probe_from_a_body_file(tmp_path) -> None:
    """The shipped policy with its commented probe switched on: body_file holds a serialized
    ModelInferRequest written as docs/grpc.md shows, the sidecar frames it and calls ModelInfer before
    it is ready, and a probe answered with an error status keeps it out of service."""
    servicer = KServe()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    checker = health.HealthServicer()
    checker.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        for model, ready in ((MODEL, True), ("nope", False)):
            request = service_pb2.ModelInferRequest(model_name=model)
            request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
            request.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
            probe = tmp_path / f"{model}.bin"
            probe.write_bytes(request.SerializeToString())
            policy = tmp_path / f"{model}.toml"
            policy.write_text(
                POLICY.read_text().replace("[scheduling]", "[slow_start]\nwindow_s = 0\n\n[scheduling]", 1)
                + '\n[[warmup.probes]]\nname = "infer"\ngrpc = true\n'
                + 'path = "/inference.GRPCInferenceService/ModelInfer"\n'
                + f'body_file = "{probe}"\ncount = 6\n'
            )
            before = servicer.infers
            with sidecar(f"http://127.0.0.1:{port}", policy=str(policy), protocol="h2c", ready=ready) as car:
                if ready:
                    assert servicer.infers - before >= 3, (
                        "the probes were ModelInfer calls (warmup.stable_last_n of them at least)"
                    )
                else:
                    time.sleep(1.0)  # the probe's verdict is in: NOT_FOUND
                    assert httpx.get(car.url("admin") + "/readyz", timeout=5).status_code == 503
    finally:
        server.stop(grace=None).wait(5)
