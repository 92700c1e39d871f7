"""A fake NVML with pynvml's function names, settable readings and failure modes.

Theory of operation: `proxy.runtime.gpu.GpuSampler` takes the NVML module as an
injected dependency and only calls the handful of functions below, so a
`FakeNvml` instance can stand in for the `pynvml` module (from nvidia-ml-py).
Exceptions are pynvml's own classes (`pynvml.NVMLError(code)` builds the
subclass for a code, e.g. NVMLError_LibraryNotFound), so the sampler's error
handling is exercised against the real hierarchy; importing pynvml needs no
driver, only calling it does.

Failure modes:
- `FakeNvml(init_error=LIBRARY_NOT_FOUND)`: nvmlInit raises, as on a machine
  without the driver (use `FakeNvml.without_driver()`);
- `gpu.failures["nvmlDeviceGetPowerUsage"] = NOT_SUPPORTED`: one reading fails
  on one GPU (NOT_SUPPORTED is what a MIG slice or an old board says);
- `gpu.failures["*"] = GPU_IS_LOST`: a GPU that fell off the bus fails every reading;
- device calls before nvmlInit or after nvmlShutdown raise Uninitialized, as
  the real library does.
`calls` counts every call by name, so tests can check init/shutdown pairing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml

NVMLError = pynvml.NVMLError
LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
UNINITIALIZED = pynvml.NVML_ERROR_UNINITIALIZED
INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT

GIB = 1024**3


@dataclass
class FakeGpu:
    """One GPU's readings, in NVML's units (percent, bytes, Celsius, milliwatts)."""

    name: str = "NVIDIA H100 80GB HBM3"
    utilization_pct: int = 0
    memory_util_pct: int = 0
    memory_total: int = 80 * GIB
    memory_used: int = 0
    temperature_c: int = 35
    power_mw: int = 70_000
    failures: dict[str, int] = field(default_factory=dict)  # function name -> NVML error code


class FakeNvml:
    """Stands in for the `pynvml` module."""

    NVMLError = pynvml.NVMLError
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = pynvml.NVMLError_DriverNotLoaded
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_GpuIsLost = pynvml.NVMLError_GpuIsLost
    NVMLError_Uninitialized = pynvml.NVMLError_Uninitialized
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU

    def __init__(self, gpus: list[FakeGpu] | None = None, *, init_error: int | None = None) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.init_error = init_error
        self.initialized = 0  # nvmlInit is reference-counted, as in the real library
        self.calls: Counter[str] = Counter()

    @classmethod
    def without_driver(cls) -> FakeNvml:
        return cls([], init_error=LIBRARY_NOT_FOUND)

    def __repr__(self) -> str:
        return f"<FakeNvml gpus={len(self.gpus)} initialized={self.initialized} init_error={self.init_error}>"

    # --- library ------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown"] += 1
        self._require_init()
        self.initialized -= 1

    def nvmlDeviceGetCount(self) -> int:
        self.calls["nvmlDeviceGetCount"] += 1
        self._require_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self.calls["nvmlDeviceGetHandleByIndex"] += 1
        self._require_init()
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(INVALID_ARGUMENT)
        return self.gpus[index]

    # --- readings -----------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return self._read("nvmlDeviceGetName", handle, lambda g: g.name)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> SimpleNamespace:
        return self._read(
            "nvmlDeviceGetUtilizationRates",
            handle,
            lambda g: SimpleNamespace(gpu=g.utilization_pct, memory=g.memory_util_pct),
        )

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu, version: int | None = None) -> SimpleNamespace:
        return self._read(
            "nvmlDeviceGetMemoryInfo",
            handle,
            lambda g: SimpleNamespace(total=g.memory_total, used=g.memory_used, free=g.memory_total - g.memory_used),
        )

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        if sensor != self.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError(INVALID_ARGUMENT)
        return self._read("nvmlDeviceGetTemperature", handle, lambda g: g.temperature_c)

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        return self._read("nvmlDeviceGetPowerUsage", handle, lambda g: g.power_mw)

    def _read(self, name: str, gpu: FakeGpu, value):
        self.calls[name] += 1
        self._require_init()
        code = gpu.failures.get(name, gpu.failures.get("*"))
        if code is not None:
            raise pynvml.NVMLError(code)
        return value(gpu)

    def _require_init(self) -> None:
        if self.initialized <= 0:
            raise pynvml.NVMLError(UNINITIALIZED)
