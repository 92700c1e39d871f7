"""GPU signals from NVML: utilisation, memory, temperature and power, as gauges and a pressure input.

Theory of operation: `GpuSampler.run` initialises NVML once, then every
`gpu.sample_interval_s` reads each watched GPU in a worker thread
(`trio.to_thread.run_sync`: NVML calls block, sometimes for milliseconds, and
must never stall the event loop) and publishes the readings as
`rampmeter_gpu_*{gpu="i"}` gauges. `memory_fraction()` is the highest
used/total over the GPUs, the input of the shedding rule `gpu_pressure`; it is
None whenever there is nothing trustworthy to report, and None means that
rule is off.

NVML is the `pynvml` module of nvidia-ml-py (not the deprecated `pynvml`
distribution), injected so tests can pass `proxy.testing.fake_nvml.FakeNvml`.

Failure handling, each said once in the log, never per sample:
- no driver (NVMLError_LibraryNotFound, DriverNotLoaded, any NVML error at
  init) or `gpu.enabled = false`: one line at start-up, no GPU gauges at all
  (every gpu gauge is labelled, so with no children nothing is exported), and
  `memory_fraction()` stays None;
- a reading a board does not support (NotSupported: power on some MIG slices)
  is skipped quietly; any other error (GpuIsLost) is logged once per GPU and
  error, counted in `rampmeter_gpu_sample_errors_total`, and that reading's
  gauge is removed rather than left stale.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import trio

from proxy.metrics import Metrics
from proxy.policy.warmup import Gpu

log = logging.getLogger("rampmeter.gpu")


@dataclass(frozen=True)
class GpuReading:
    index: int
    utilization: float | None  # 0-1
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    temperature_c: float | None
    power_w: float | None

    @property
    def memory_fraction(self) -> float | None:
        if self.memory_used_bytes is None or not self.memory_total_bytes:
            return None
        return self.memory_used_bytes / self.memory_total_bytes


@dataclass(frozen=True)
class GpuStatistics:
    available: bool
    reason: str  # why not, when not available
    samples: int
    errors: int
    memory_fraction: float | None
    devices: tuple[GpuReading, ...]


class GpuSampler:
    def __init__(self, policy: Gpu, *, metrics: Metrics | None = None, nvml: Any = None) -> None:
        self.policy = policy
        self.metrics = metrics if metrics is not None else Metrics()
        self._nvml = nvml
        self.available = False
        self.reason = "not started"
        self._handles: list[tuple[int, Any]] = []
        self._readings: tuple[GpuReading, ...] = ()
        self._said: set[tuple[int, str]] = set()  # (gpu, error) already logged
        self._samples = self._errors = 0

    def __repr__(self) -> str:
        state = f"{len(self._handles)} GPUs" if self.available else f"off: {self.reason}"
        return f"<GpuSampler {state} samples={self._samples} memory_fraction={self.memory_fraction()}>"

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Sample until cancelled; `started(available)` once NVML is up or known absent."""
        available = await trio.to_thread.run_sync(self.start)
        task_status.started(available)
        if not available:
            return
        try:
            while True:
                await self.sample_once()
                await trio.sleep(self.policy.sample_interval_s)
        finally:
            self._stop()

    def start(self) -> bool:
        """Initialise NVML and find the GPUs (blocking: call it in a thread). Says why not, once."""
        if not self.policy.enabled:
            return self._off("gpu.enabled = false in the policy")
        nvml = self._nvml
        if nvml is None:
            try:
                import pynvml  # nvidia-ml-py; importing needs no driver, nvmlInit does
            except ImportError as exc:
                return self._off(f"nvidia-ml-py is not installed ({exc})")
            self._nvml = nvml = pynvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, NoPermission...
            return self._off(f"NVML unavailable ({type(exc).__name__}: {exc}); no NVIDIA driver here?")
        try:
            count = nvml.nvmlDeviceGetCount()
            wanted = self.policy.devices or list(range(count))
            self._handles = [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in wanted if i < count]
        except nvml.NVMLError as exc:
            nvml.nvmlShutdown()
            return self._off(f"NVML could not list GPUs ({exc})")
        if not self._handles:
            nvml.nvmlShutdown()
            return self._off(f"no GPU to watch ({count} visible, gpu.devices = {self.policy.devices})")
        self.available, self.reason = True, ""
        log.info("GPU sampling on for GPUs %s every %gs", [i for i, _ in self._handles], self.policy.sample_interval_s)
        return True

    def _off(self, why: str) -> bool:
        self.available, self.reason = False, why
        log.warning("GPU signals off: %s; no GPU gauges exported, gpu_pressure shedding disabled", why)
        return False

    def _stop(self) -> None:
        if self.available:
            self.available, self.reason = False, "stopped"
            self._nvml.nvmlShutdown()

    async def sample_once(self) -> tuple[GpuReading, ...]:
        readings = await trio.to_thread.run_sync(self._read_all)
        self._publish(readings)
        return readings

    # --- in the worker thread -------------------------------------------------------

    def _read_all(self) -> tuple[GpuReading, ...]:
        return tuple(self._read(i, h) for i, h in self._handles)

    def _read(self, index: int, handle: Any) -> GpuReading:
        nvml = self._nvml
        util = self._try(index, nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = self._try(index, nvml.nvmlDeviceGetMemoryInfo, handle)
        temperature = self._try(index, nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        power_mw = self._try(index, nvml.nvmlDeviceGetPowerUsage, handle)
        return GpuReading(
            index=index,
            utilization=None if util is None else util.gpu / 100.0,
            memory_used_bytes=None if memory is None else int(memory.used),
            memory_total_bytes=None if memory is None else int(memory.total),
            temperature_c=None if temperature is None else float(temperature),
            power_w=None if power_mw is None else power_mw / 1000.0,
        )

    def _try(self, index: int, fn, *args):
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            name = type(exc).__name__
            if name != "NVMLError_NotSupported":
                self._errors += 1
                self.metrics.gpu_sample_errors.labels(str(index), name).inc()
            if (index, name) not in self._said:
                self._said.add((index, name))
                level = logging.DEBUG if name == "NVMLError_NotSupported" else logging.WARNING
                log.log(level, "GPU %d: %s failed: %s: %s (said once per GPU and error)", index, fn.__name__, name, exc)
            return None

    # --- back in trio -----------------------------------------------------------------------

    def _publish(self, readings: tuple[GpuReading, ...]) -> None:
        self._readings = readings
        self._samples += 1
        m = self.metrics
        for r in readings:
            label = str(r.index)
            _set(m.gpu_utilization_ratio, label, r.utilization)
            _set(m.gpu_memory_used_bytes, label, r.memory_used_bytes)
            _set(m.gpu_memory_total_bytes, label, r.memory_total_bytes)
            _set(m.gpu_temperature_celsius, label, r.temperature_c)
            _set(m.gpu_power_watts, label, r.power_w)

    def memory_fraction(self) -> float | None:
        """Highest used/total memory over the watched GPUs; None: unknown, gpu_pressure off."""
        if not self.available:
            return None
        fractions = [f for r in self._readings if (f := r.memory_fraction) is not None]
        return max(fractions) if fractions else None

    def statistics(self) -> GpuStatistics:
        return GpuStatistics(
            self.available, self.reason, self._samples, self._errors, self.memory_fraction(), self._readings
        )


def _set(gauge, label: str, value: float | None) -> None:
    if value is not None:
        gauge.labels(label).set(value)
    else:
        try:
            gauge.remove(label)  # a stale value is worse than none
        except KeyError:
            pass
