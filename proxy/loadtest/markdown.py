"""The Markdown report: what a person reads first, rendered from the JSON document only.

Theory of operation: `render(doc)` writes the knee sentence first, then the
cost, one table row per step (invalid steps flagged "INVALID" with their
reasons listed under the table, never dropped), and whole-run tables per class
and per shape. Figures are rounded for reading; the JSON holds them exact.
"""

from __future__ import annotations


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v / 1000:.2f} s" if v >= 1000 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _lat(fig: dict, q: str) -> str:
    lat = fig.get("latency_ms")
    return _ms(lat[q]) if lat else "-"


def _rej(fig: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in fig["reasons"].items()) or "-"


def _errs(fig: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in fig["errors"].items()) or "-"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _group_table(groups: dict[str, dict], title: str) -> list[str]:
    out = [
        f"### {title}",
        "",
        (
            "| group | requests | goodput/s | good | p50 ms | p99 ms | p99.9 ms | TTFT p50 ms "
            "| TPOT p50 ms | rejections | errors |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for name, f in groups.items():
        ttft, tpot = f.get("ttft_ms"), f.get("tpot_ms")
        out.append(
            f"| {name} | {f['requests']} | {f['goodput_rps']:.1f} | {_pct(f['good_fraction'])} | "
            f"{_lat(f, 'p50')} | {_lat(f, 'p99')} | {_lat(f, 'p99.9')} | {_ms(ttft['p50']) if ttft else '-'} | "
            f"{_ms(tpot['p50']) if tpot else '-'} | {_rej(f)} | {_errs(f)} |"
        )
    return out + [""]


def render(doc: dict, plots: dict[str, str] | None = None) -> str:
    target, plan, unit = doc["target"], doc["plan"], doc["plan"]["unit"]
    load_name = "rate (req/s)" if unit == "rps" else "users"
    lines = [f"# Load test: {target['name']}", "", f"**{doc['knee']['summary']}**", ""]
    if not doc["valid"]:
        lines += [
            ("> **Some steps are INVALID** (see below): their figures describe the generator as much as the target."),
            "",
        ]
    if doc.get("interrupted"):
        lines += ["> The run was interrupted before the end.", ""]
    cost = doc.get("cost")
    if cost:
        usd = f", ${cost['usd_per_million_good']:.2f}" if cost.get("usd_per_million_good") is not None else ""
        lines += [
            (
                f"Cost at rated capacity: {cost['gpu_hours_per_million_good']:.3g} GPU-hours per million good "
                f"requests{usd} ({cost['gpus']:g} GPU(s), goodput {cost['goodput_rps']:.1f} req/s)."
            ),
            "",
        ]
    mix = ", ".join(f"{m['name']}{'@' + m['class'] if m['class'] else ''} {m['share']:.0%}" for m in doc["mix"][:12])
    lines += [
        f"- target: `{target['url']}` over {target['protocol']}, client timeout {target['timeout_ms']:g} ms",
        f"- plan: {plan['mode']} loop"
        + (f", {plan['arrival']} arrivals" if plan["mode"] == "open" else f", think {plan['think_ms']:g} ms")
        + f", seed {plan['seed']}, {len(plan['steps'])} steps",
        f"- mix: {mix}{' ...' if len(doc['mix']) > 12 else ''}",
        (
            f"- SLA: {doc['sla']['text']} (at most {doc['sla']['max_failed_fraction']:.1%} failed); "
            f"step invalid past p99 sender lateness {doc['max_lateness_ms']:g} ms"
        ),
        f"- started {doc['started_at']}, {doc['wall_s']:.1f} s",
        "",
    ]
    lines += [
        "## Steps",
        "",
        (
            f"| # | {load_name} | offered/s | achieved/s | goodput/s | p50 ms | p95 ms | p99 ms "
            "| p99.9 ms | max ms | 2xx | rejections | errors | lateness p99 ms | SLA | valid |"
        ),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---|---|",
    ]
    notes = []
    for s in doc["steps"]:
        f = s["overall"]
        ok = f["ok"] / f["requests"] if f["requests"] else None
        late = s["lateness_ms"]["p99"] if s["lateness_ms"] else None
        sla = "-" if s["within_sla"] is None else "met" if s["within_sla"] else "missed"
        mark = "**knee**" if doc["knee"]["step"] == s["index"] else ""
        lines.append(
            f"| {s['index']} {mark} | {s['load']:g} | {f['offered_rps']:.1f} | {f['achieved_rps']:.1f} | "
            f"{f['goodput_rps']:.1f} | {_lat(f, 'p50')} | {_lat(f, 'p95')} | {_lat(f, 'p99')} | "
            f"{_lat(f, 'p99.9')} | {_lat(f, 'max')} | {_pct(ok)} | {_rej(f)} | {_errs(f)} | {_ms(late)} | "
            f"{sla} | {'yes' if s['valid'] else '**INVALID**'} |"
        )
        if not s["valid"]:
            notes.append(f"- step {s['index']} INVALID: {'; '.join(s['invalid_reasons'])}")
        if s["sla_misses"]:
            notes.append(f"- step {s['index']} missed the SLA: {'; '.join(s['sla_misses'])}")
    lines += [""] + notes + ([""] if notes else [])
    lines += ["## Whole run", ""]
    lines += _group_table(doc["by_class"], "Per class")
    lines += _group_table(doc["by_shape"], "Per shape")
    for title, path in (plots or {}).items():
        lines += [f"![{title}]({path})", ""]
    return "\n".join(lines)
