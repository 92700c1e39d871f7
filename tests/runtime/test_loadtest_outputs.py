"""JSON document, Markdown, plots, compare and progress, from real (virtual-time) runs."""

from __future__ import annotations

import io

import msgspec
import pytest
import trio

from proxy.loadtest import Mix, Plan, Target, build_trace, markdown, report, run
from proxy.loadtest import compare as compare_mod
from proxy.loadtest.inproc import HandlerTransport
from proxy.loadtest.outputs import write_outputs
from proxy.loadtest.progress import PlainProgress, make
from proxy.loadtest.verdict import SLA

PNG = b"\x89PNG\r\n\x1a\n"
FIGURE_KEYS = {
    "requests",
    "responses",
    "ok",
    "good",
    "offered_rps",
    "achieved_rps",
    "goodput_rps",
    "good_fraction",
    "failed_fraction",
    "latency_ms",
    "ttft_ms",
    "tpot_ms",
    "status",
    "reasons",
    "errors",
}


def queueing(capacity_rps: float):
    """A single-server queue: service 1/capacity each, FIFO."""
    lock = trio.Lock()

    async def handler(request, sink) -> None:
        async with lock:
            await trio.sleep(1.0 / capacity_rps)
        await sink.respond(200, [(b"content-type", b"application/json")], b'{"ok": true}')

    return handler


async def sweep(nursery, capacity: float, progress=None, records: bool = False, name: str = "A") -> dict:
    trace = build_trace(
        Plan.sweep([20, 40, 60, 80], step_s=5, warmup_s=1),
        Mix.parse("short_chat@interactive=1,short_chat_stream@batch=1"),
        1,
        idempotency="unique",
    )
    transport = HandlerTransport(queueing(capacity), trace.mix.shapes, nursery)
    result = await run(trace, Target("http://pod:80", name=name), transport=transport, progress=progress)
    analysis = result.analyze(SLA.parse("p99=200ms"), gpus=2, usd_per_gpu_hour=3.0)
    return report.document(result, analysis, command="rampmeter loadtest test", records=records)


async def test_document_follows_the_schema(nursery, autojump_clock):
    doc = await sweep(nursery, 70.0, records=True)
    assert doc["schema"] == "rampmeter.loadtest/1"
    assert set(doc) >= {
        "tool",
        "command",
        "started_at",
        "wall_s",
        "interrupted",
        "target",
        "plan",
        "mix",
        "sla",
        "max_lateness_ms",
        "valid",
        "steps",
        "overall",
        "by_shape",
        "by_class",
        "knee",
        "cost",
        "transport",
        "records",
    }
    assert doc["plan"]["unit"] == "rps" and [s["load"] for s in doc["plan"]["steps"]] == [20, 40, 60, 80]
    step = doc["steps"][0]
    assert set(step) >= {
        "index",
        "load",
        "valid",
        "invalid_reasons",
        "within_sla",
        "sla_misses",
        "lateness_ms",
        "overall",
        "by_shape",
        "by_class",
        "measured_s",
        "backlogged",
    }
    assert set(step["overall"]) == FIGURE_KEYS
    assert set(step["overall"]["latency_ms"]) == {"count", "mean", "p50", "p95", "p99", "p99.9", "max"}
    assert set(step["by_class"]) == {"interactive", "batch"}
    assert doc["knee"]["load"] == 60 and doc["knee"]["unit"] == "rps"
    assert doc["cost"]["gpus"] == 2 and doc["cost"]["usd_per_million_good"] > 0
    recs = doc["records"]
    measured = sum(s["overall"]["requests"] for s in doc["steps"])
    assert len({len(column) for column in recs.values()}) == 1  # columnar: every column one entry per request
    assert len(recs["step"]) > measured  # warm-up rows are recorded too, only left out of the figures
    assert set(recs["error"]) == {"ok"} and len(set(recs["shape"])) == 2
    again = msgspec.json.decode(report.dumps(doc))
    assert again == msgspec.json.decode(msgspec.json.encode(doc))


async def test_markdown_plots_and_files(nursery, autojump_clock, tmp_path):
    doc = await sweep(nursery, 70.0)
    doc["steps"][1]["valid"] = False  # as a late generator would leave it
    doc["steps"][1]["invalid_reasons"] = ["generator behind schedule: p99 lateness 30.0 ms > 10 ms"]
    doc["valid"] = False
    written = write_outputs(doc, tmp_path / "out")
    assert set(written) == {"json", "markdown", "latency_plot", "goodput_plot"}
    for key in ("latency_plot", "goodput_plot"):
        assert written[key].read_bytes()[:8] == PNG
    text = written["markdown"].read_text()
    assert text.startswith("# Load test: A\n\n**Rated capacity 60 req/s")
    assert "**INVALID**" in text and "step 1 INVALID: generator behind schedule" in text
    assert "Some steps are INVALID" in text and "](latency.png)" in text
    assert "| interactive |" in text and "GPU-hours per million good requests" in text
    assert report.load(written["json"]) == msgspec.json.decode(written["json"].read_bytes())


async def test_compare_two_runs(nursery, autojump_clock, tmp_path):
    slow, fast = await sweep(nursery, 50.0, name="slow"), await sweep(nursery, 90.0, name="fast")
    for name, doc in (("slow", slow), ("fast", fast)):
        (tmp_path / f"{name}.json").write_bytes(report.dumps(doc))
    text, plot = compare_mod.compare([str(tmp_path / "slow.json"), str(tmp_path / "fast.json")], tmp_path / "cmp")
    lines = text.splitlines()
    head = [cell.strip() for cell in lines[0].split("|")]
    assert head == ["load (req/s)", "slow p99 ms / goodput req/s", "fast p99 ms / goodput req/s"]
    assert any(line.startswith("80 ") for line in lines)
    assert "fast: Rated capacity 80 req/s" in text and "(200% of slow)" in text
    assert plot.read_bytes()[:8] == PNG
    with pytest.raises(ValueError, match="not a rampmeter loadtest result"):
        bad = tmp_path / "bad.json"
        bad.write_text('{"hello": 1}')
        compare_mod.compare([str(bad), str(tmp_path / "fast.json")], tmp_path)


async def test_plain_progress_prints_one_line_pair_per_step(nursery, autojump_clock):
    out = io.StringIO()
    await sweep(nursery, 70.0, progress=PlainProgress(out))
    lines = out.getvalue().splitlines()
    assert len(lines) == 8 and lines[0] == "step 0: 20 req/s for 5 s (warm-up 1 s)"
    assert lines[1].startswith("  done: sent ") and "sender lateness p99" in lines[1]
    assert make("none") is None and isinstance(make("auto", io.StringIO()), PlainProgress)


async def test_rich_progress_draws_a_table(nursery, autojump_clock):
    out = io.StringIO()
    shown = make("rich", out)
    shown.console.width = 160  # not a terminal: rich would wrap at 80 columns
    await sweep(nursery, 70.0, progress=shown)
    shown.close()
    text = out.getvalue()
    assert "rampmeter loadtest" in text and "lateness p99" in text and "80 req/s" in text


def test_markdown_renders_without_an_sla():
    doc = {
        "target": {"name": "x", "url": "http://x", "protocol": "http1", "timeout_ms": 1000.0},
        "plan": {"unit": "users", "mode": "closed", "think_ms": 0, "seed": 0, "steps": []},
        "knee": {"summary": "No SLA given (--sla or --class-sla): no knee computed.", "step": None},
        "valid": True,
        "mix": [],
        "sla": {"text": "none", "max_failed_fraction": 0.01},
        "max_lateness_ms": 10,
        "started_at": "t",
        "wall_s": 1.0,
        "steps": [],
        "by_class": {},
        "by_shape": {},
    }
    text = markdown.render(doc)
    assert "No SLA given" in text and "| users |" in text


def test_compare_labels_are_one_kind_of_name():
    same = [{"target": {"name": "http://127.0.0.1:8000"}}] * 2
    assert compare_mod.labels_for(same, ["before/loadtest.json", "after/loadtest.json"]) == ["before", "after"]
    assert compare_mod.labels_for(same, ["x/a.json", "y/b.json"]) == ["a", "b"]
    assert compare_mod.labels_for(same, ["x/r/a.json", "y/r/a.json"]) == ["x/r", "y/r"]
    named = [{"target": {"name": "slow"}}, {"target": {"name": "fast"}}]
    assert compare_mod.labels_for(named, ["a.json", "b.json"]) == ["slow", "fast"]
