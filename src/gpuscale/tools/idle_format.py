"""``gpuscale idle``'s report as text: a table for people, CSV for spreadsheets (one row per
namespace, workload, the total and each idle device), JSON for programs. Pure: strings and
dicts from a Report.

A cost is the priced part; when some allocation has no price the table shows ``+?`` after
it (``?`` alone when none is priced) and the JSON says how many GPU-hours are unpriced.
"""

from __future__ import annotations

import csv
import io
import time
from typing import Any

from gpuscale.tools.idle import AdvisoryPlan, IdleDevice, Report, Usage

CSV_COLUMNS = ("kind", "namespace", "workload", "node", "device", "model", "pods",
               "gpu_hours_allocated", "gpu_hours_measured", "gpu_hours_used", "idle_share",
               "coverage", "cost_allocated", "cost_idle", "unpriced_gpu_hours",
               "idle_minutes", "utilization")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _money(u: Usage, cost: float) -> str:
    if not u.priced:
        return "?"
    return f"{cost:.2f}" + ("+?" if u.unpriced_h > 0 else "")


def _span(s: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:.3g} {unit}"
    return f"{s:.0f} s"


def _clock(t: float) -> str:
    return time.strftime("%H:%M", time.gmtime(t))


def table(report: Report, source: str) -> str:
    o = report.options
    lines = [f"GPU use from {source}, {_clock(report.now - o.window_s)}-{_clock(report.now)} "
             f"UTC ({_span(o.window_s)} of wall-clock time)"
             f"{f', namespace {o.namespace}' if o.namespace else ''}"
             f": {report.devices} devices, data for {_pct(report.data_coverage)} of their time",
             ""]
    head = ("NAMESPACE", "WORKLOAD", "GPU-H ALLOC", "GPU-H USED", "IDLE", "COVERAGE",
            "COST ALLOC", "COST IDLE")
    rows: list[tuple[str, ...]] = []
    for ns in report.namespaces:
        rows.append(_row(ns, ns.namespace, "(all)"))
        rows += [_row(w, "", w.workload) for w in report.workloads
                 if w.namespace == ns.namespace]
    rows.append(_row(report.total, "TOTAL", ""))
    lines += _columns(head, rows, 2)
    lines += ["", f"IDLE NOW: allocated, under {o.threshold:g}% for {o.idle_for_s / 60:g} "
                  f"minutes or more"]
    if report.idle:
        lines += _columns(("NODE", "DEVICE", "MODEL", "PODS", "IDLE MIN", "UTIL", "COST/H"),
                          [_idle_row(i) for i in report.idle], 4)
    else:
        lines.append("  none")
    if report.advisory:
        lines += ["", "ADVISORY PLANS: gpuscale's plan beside the replicas run, last 24 h "
                      "(the seconds both were known)"]
        lines += _columns(("NAMESPACE", "WORKLOAD", "PLANNED NOW", "RUNNING NOW",
                           "GPU-H PLANNED", "GPU-H RUN", "SAVED", "COVERAGE"),
                          [_advisory_row(a) for a in report.advisory], 2)
        lines += [f"  {a.namespace}/{a.name}: not known now: {a.why}"
                  for a in report.advisory if a.why]
    lines += ["", *notes(report)]
    return "\n".join(lines).rstrip() + "\n"


def notes(report: Report) -> list[str]:
    out = ["USED = allocated x utilization. IDLE: the measured allocation not used.",
           "COVERAGE: the allocation with a utilization reading (the rest is neither used nor",
           "idle). Time without data is not counted at all."]
    if not report.options.prices:
        out.append("No prices: pass --price 'MODEL=PRICE,...' or --prices FILE.yaml (per "
                   "GPU-hour) for the cost columns.")
    elif report.unpriced_models:
        out.append(f"No price for: {', '.join(report.unpriced_models)} (its cost shows as ?).")
    return out


def _row(u: Usage, ns: str, workload: str) -> tuple[str, ...]:
    return (ns, workload, f"{u.allocated_h:.2f}", f"{u.used_h:.2f}", _pct(u.idle_share),
            _pct(u.coverage), _money(u, u.cost_allocated), _money(u, u.cost_idle))


def _advisory_row(a: AdvisoryPlan) -> tuple[str, ...]:
    return (a.namespace, a.name, "?" if a.planned is None else str(a.planned),
            "?" if a.actual is None else str(a.actual), f"{a.planned_h:.2f}",
            f"{a.actual_h:.2f}", f"{a.saved_h:+.2f}", _pct(a.coverage))


def _idle_row(i: IdleDevice) -> tuple[str, ...]:
    gpu = f" ({i.fraction:.2f} GPU)" if i.fraction < 1 else ""
    return (i.node, i.device, i.model + gpu, ",".join(i.pods), f"{i.idle_s / 60:.0f}",
            f"{i.utilization:.1f}%", "?" if i.rate is None else f"{i.rate * i.fraction:.2f}")


def _columns(head: tuple[str, ...], rows: list[tuple[str, ...]], left: int) -> list[str]:
    """Aligned columns: the first ``left`` to the left, numbers to the right."""
    widths = [max(len(r[c]) for r in (head, *rows)) for c in range(len(head))]
    return ["  ".join(v.ljust(w) if c < left else v.rjust(w)
                      for c, (v, w) in enumerate(zip(r, widths, strict=True))).rstrip()
            for r in (head, *rows)]


def to_json(report: Report, source: str) -> dict[str, Any]:
    o = report.options
    return {
        "source": source, "now": report.now, "window_s": o.window_s,
        "threshold_percent": o.threshold, "idle_for_s": o.idle_for_s,
        "namespace": o.namespace or None, "prices": dict(o.prices),
        "devices": report.devices, "data_coverage": report.data_coverage,
        "namespaces": [_usage(u) for u in report.namespaces],
        "workloads": [_usage(u) for u in report.workloads],
        "total": _usage(report.total),
        "idle_now": [_idle(i) for i in report.idle],
        "timeline": [{"start": p.start, "allocated_gpus": p.allocated, "used_gpus": p.used,
                      "measured_gpus": p.measured} for p in report.timeline],
        "unpriced_models": list(report.unpriced_models),
        "advisory": [{"namespace": a.namespace, "name": a.name, "planned_now": a.planned,
                      "running_now": a.actual, "gpu_hours_planned": a.planned_h,
                      "gpu_hours_run": a.actual_h, "gpu_hours_saved": a.saved_h,
                      "known_seconds": a.known_s, "unknown_seconds": a.unknown_s,
                      "why_unknown": a.why or None} for a in report.advisory],
    }


def _usage(u: Usage) -> dict[str, Any]:
    return {"namespace": u.namespace or None, "workload": u.workload or None,
            "gpu_hours_allocated": u.allocated_h, "gpu_hours_measured": u.measured_h,
            "gpu_hours_used": u.used_h, "idle_share": u.idle_share, "coverage": u.coverage,
            "cost_allocated": u.cost_allocated if u.priced else None,
            "cost_idle": u.cost_idle if u.priced else None,
            "unpriced_gpu_hours": u.unpriced_h}


def _idle(i: IdleDevice) -> dict[str, Any]:
    return {"node": i.node, "device": i.device, "model": i.model, "fraction": i.fraction,
            "pods": list(i.pods), "owners": list(i.owners), "idle_minutes": i.idle_s / 60,
            "utilization": i.utilization,
            "cost_per_hour": i.rate * i.fraction if i.rate is not None else None}


def to_csv(report: Report) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)

    def usage(kind: str, u: Usage) -> None:
        d = _usage(u)
        w.writerow([kind, u.namespace, u.workload, "", "", "", "",
                    *(_num(d[k]) for k in ("gpu_hours_allocated", "gpu_hours_measured",
                                           "gpu_hours_used", "idle_share", "coverage",
                                           "cost_allocated", "cost_idle",
                                           "unpriced_gpu_hours")), "", ""])

    for u in report.namespaces:
        usage("namespace", u)
    for u in report.workloads:
        usage("workload", u)
    usage("total", report.total)
    for i in report.idle:
        ns = sorted({p.partition("/")[0] for p in i.pods})
        w.writerow(["idle_device", ";".join(ns), ";".join(i.owners), i.node, i.device,
                    i.model, ";".join(i.pods), *[""] * 8, _num(i.idle_s / 60),
                    _num(i.utilization)])
    return buf.getvalue()


def _num(x: object) -> str:
    """A CSV cell: "" for unknown (never 0), numbers to 6 significant digits."""
    if x is None:
        return ""
    if isinstance(x, float):
        return f"{x:.6g}"
    return str(x)
