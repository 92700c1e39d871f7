"""The NVML sampler against the fake NVML, and the real no-driver path of this machine."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

import pytest
import trio
from prometheus_client import generate_latest

from proxy.metrics import Metrics
from proxy.policy.warmup import Gpu
from proxy.runtime.gpu import GpuSampler
from proxy.testing.fake_nvml import GIB, GPU_IS_LOST, NOT_SUPPORTED, FakeGpu, FakeNvml
from tests.runtime.threaded import poll_until

POLICY = Gpu(sample_interval_s=1.0)


def value(metrics: Metrics, name: str, gpu: str) -> float | None:
    return metrics.registry.get_sample_value("rampmeter_" + name, {"gpu": gpu})


def gpu_series(metrics: Metrics) -> list[str]:
    """Exported sample lines of any rampmeter_gpu_* metric (HELP/TYPE lines are not series)."""
    text = generate_latest(metrics.registry).decode()
    return [line for line in text.splitlines() if line.startswith("rampmeter_gpu_")]


def two_gpus() -> FakeNvml:
    return FakeNvml(
        [
            FakeGpu(utilization_pct=87, memory_used=60 * GIB, temperature_c=71, power_mw=612_500),
            FakeGpu(utilization_pct=10, memory_used=20 * GIB, temperature_c=40, power_mw=90_000),
        ]
    )


async def test_readings_become_gauges_and_the_pressure_input():
    metrics, nvml = Metrics(), two_gpus()
    sampler = GpuSampler(POLICY, metrics=metrics, nvml=nvml)
    assert sampler.start() is True
    await sampler.sample_once()
    assert value(metrics, "gpu_utilization_ratio", "0") == pytest.approx(0.87)
    assert value(metrics, "gpu_memory_used_bytes", "0") == 60 * GIB
    assert value(metrics, "gpu_memory_total_bytes", "1") == 80 * GIB
    assert value(metrics, "gpu_temperature_celsius", "0") == 71
    assert value(metrics, "gpu_power_watts", "0") == pytest.approx(612.5)
    assert sampler.memory_fraction() == pytest.approx(0.75)  # the fuller GPU counts
    nvml.gpus[1].memory_used = 76 * GIB
    await sampler.sample_once()
    assert sampler.memory_fraction() == pytest.approx(0.95)
    stats = sampler.statistics()
    assert stats.available and stats.samples == 2 and len(stats.devices) == 2


async def test_without_a_driver_one_line_no_gauges_no_pressure(caplog):
    metrics = Metrics()
    sampler = GpuSampler(POLICY, metrics=metrics, nvml=FakeNvml.without_driver())
    with caplog.at_level(logging.INFO, logger="rampmeter.gpu"):
        async with trio.open_nursery() as nursery:
            assert await nursery.start(sampler.run) is False
    lines = [r for r in caplog.records if r.name == "rampmeter.gpu"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "NVMLError_LibraryNotFound" in lines[0].getMessage()
    assert "gpu_pressure shedding disabled" in lines[0].getMessage()
    assert gpu_series(metrics) == []
    assert sampler.memory_fraction() is None and not sampler.available
    assert "LibraryNotFound" in repr(sampler)


def _nvml_library_loads() -> bool:
    """Independently of pynvml: can this machine load the NVML shared library at all?"""
    for name in ("libnvidia-ml.so.1", ctypes.util.find_library("nvidia-ml")):
        if not name:
            continue
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return True
    return False


async def test_real_nvml_on_this_machine(caplog):
    """No injected fake: whatever this machine has. Without a driver (the dev machines),
    the no-driver path; with one (a GPU box), real readings."""
    metrics = Metrics()
    sampler = GpuSampler(POLICY, metrics=metrics)
    with caplog.at_level(logging.INFO, logger="rampmeter.gpu"):
        async with trio.open_nursery() as nursery:
            available = await nursery.start(sampler.run)
            if available:
                await sampler.sample_once()
            nursery.cancel_scope.cancel()
    if not _nvml_library_loads():
        assert available is False
        (line,) = [r.getMessage() for r in caplog.records if r.name == "rampmeter.gpu"]
        assert "NVMLError_LibraryNotFound" in line and "no GPU gauges exported" in line
        assert gpu_series(metrics) == [] and sampler.memory_fraction() is None
    else:
        assert available is True
        reading = sampler.statistics().devices[0]
        assert reading.memory_total_bytes and reading.memory_total_bytes > GIB
        assert 0.0 <= sampler.memory_fraction() <= 1.0
        assert value(metrics, "gpu_memory_total_bytes", str(reading.index)) == reading.memory_total_bytes


async def test_disabled_by_policy(caplog):
    nvml = two_gpus()
    sampler = GpuSampler(Gpu(enabled=False), nvml=nvml)
    with caplog.at_level(logging.INFO, logger="rampmeter.gpu"):
        assert sampler.start() is False
    assert "gpu.enabled = false" in caplog.text and nvml.calls["nvmlInit"] == 0


async def test_unsupported_reading_is_skipped_quietly():
    metrics, nvml = Metrics(), two_gpus()
    nvml.gpus[0].failures["nvmlDeviceGetPowerUsage"] = NOT_SUPPORTED
    sampler = GpuSampler(POLICY, metrics=metrics, nvml=nvml)
    sampler.start()
    await sampler.sample_once()
    assert value(metrics, "gpu_power_watts", "0") is None
    assert value(metrics, "gpu_power_watts", "1") == 90.0
    assert value(metrics, "gpu_memory_used_bytes", "0") == 60 * GIB
    assert sampler.statistics().errors == 0


async def test_lost_gpu_drops_its_gauges_counts_and_logs_once(caplog):
    metrics, nvml = Metrics(), two_gpus()
    sampler = GpuSampler(POLICY, metrics=metrics, nvml=nvml)
    sampler.start()
    await sampler.sample_once()
    assert sampler.memory_fraction() == pytest.approx(0.75)
    nvml.gpus[0].failures["*"] = GPU_IS_LOST
    with caplog.at_level(logging.WARNING, logger="rampmeter.gpu"):
        for _ in range(3):
            await sampler.sample_once()
    assert value(metrics, "gpu_memory_used_bytes", "0") is None  # not left stale
    assert value(metrics, "gpu_memory_used_bytes", "1") == 20 * GIB
    assert sampler.memory_fraction() == pytest.approx(0.25)  # only the GPU we can still see
    lost = [r for r in caplog.records if "GpuIsLost" in r.getMessage()]
    assert len(lost) == 1  # once per GPU and error, not per reading or sample
    errors = metrics.registry.get_sample_value(
        "rampmeter_gpu_sample_errors_total", {"gpu": "0", "error": "NVMLError_GpuIsLost"}
    )
    assert errors == 12


async def test_devices_filter_and_missing_index():
    metrics, nvml = Metrics(), two_gpus()
    sampler = GpuSampler(Gpu(devices=[1, 5]), metrics=metrics, nvml=nvml)
    assert sampler.start() is True
    await sampler.sample_once()
    assert [d.index for d in sampler.statistics().devices] == [1]
    assert value(metrics, "gpu_memory_used_bytes", "0") is None


async def test_no_visible_gpu_turns_off():
    nvml = FakeNvml([])
    sampler = GpuSampler(POLICY, nvml=nvml)
    assert sampler.start() is False and "no GPU to watch" in sampler.reason
    assert nvml.initialized == 0  # init and shutdown paired


async def test_run_samples_on_its_interval_and_shuts_nvml_down_once(autojump_clock):
    metrics, nvml = Metrics(), two_gpus()
    sampler = GpuSampler(POLICY, metrics=metrics, nvml=nvml)
    async with trio.open_nursery() as nursery:
        assert await nursery.start(sampler.run) is True
        # Readings happen in a worker thread, which the autojump clock does not wait for: poll,
        # bounded in real time (virtual time races ahead while that thread waits for a CPU).
        await poll_until(lambda: sampler.statistics().samples >= 3, POLICY.sample_interval_s)
        nvml.gpus[0].memory_used = 79 * GIB
        await poll_until(lambda: (sampler.memory_fraction() or 0.0) >= 0.98, POLICY.sample_interval_s)
        nursery.cancel_scope.cancel()
    assert nvml.calls["nvmlInit"] == 1 and nvml.calls["nvmlShutdown"] == 1 and nvml.initialized == 0
    assert sampler.memory_fraction() is None  # stopped: no longer a trustworthy input
