"""Scaling curves of one agentrt-bench run, as PNG files.

    python plot.py BENCH_JSON OUT_DIR

Reads the JSON that `agentrt-bench --json FILE` wrote and draws, from that
one run only, agentrt beside the minimal relay (the floor: SSE in, gRPC
out, no storage) and, when the run had the `langgraph` part, LangGraph's
Agent Server:

  s2-latency.png   S2 (paced turns) at each session count: Chat → upstream
                   request and time to first event, p50 and p99
  s2-bursts.png    N Chats released at once, on new and on warm sessions:
                   Chat → upstream request and first token → first event
  s6-turns.png     S6 durable short turns per second at each session count
  saturation.png   tokens/s of unpaced streams, and server CPU per token

A figure whose data the run did not produce is skipped with a line on
stderr. Prints the files written, one per line.
"""

import json
import sys
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

COLORS = {
    "agentrt": "#1f77b4",
    "relay": "#2ca02c",
    "direct": "#7f7f7f",
    "langgraph": "#d62728",
    "langgraph-jobs": "#ff7f0e",
}


def ms(lat, key):
    return lat[key] / 1000.0


def plain_ticks(ax):
    """Log axes ticked at 1, 2, 5 × 10^k and labelled plainly (0.5, 20,
    1000, not 10^0)."""
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() == "log":
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(plain)
            axis.set_minor_formatter(NullFormatter())


def latency_axes(ax, xlabel, title, ncol):
    """Log-log latency (ms) axes with the legend below them."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("ms")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    plain_ticks(ax)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=ncol)


def subtitle(run):
    m = run.get("machine", {})
    return (
        f"agentrt {run.get('git_commit', '?')} · {m.get('nproc', '?')} cores "
        f"{m.get('cpu_model', '')} · {run.get('mode', '')} run"
    )


def finish(fig, run, out, name, written):
    fig.suptitle(subtitle(run), fontsize=8, y=0.01, va="bottom", color="#555")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path = out / name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)


def langgraph_series(run):
    """{runtime label: [(sessions, load)]} of the LangGraph part's paced
    levels, agentrt's own rows left out (the S2 sweep draws agentrt)."""
    part = run.get("langgraph")
    if not part:
        return {}, {}
    series, direct = {}, {}
    for level in part.get("levels", []):
        direct[level["sessions"]] = level["direct"]
        for r in level.get("runs", []):
            if r["runtime"] == "agentrt":
                continue
            series.setdefault(r["runtime"], []).append((level["sessions"], r["load"]))
    return series, direct


def lg_color(label):
    return COLORS["langgraph"] if "stock" in label else COLORS["langgraph-jobs"]


def s2_latency(run, out, written):
    rows = [r for r in run.get("s2") or [] if r.get("relay")]
    if not rows:
        print("plot: no S2 sweep with the relay in this run; s2-latency.png skipped", file=sys.stderr)
        return
    xs = [r["sessions"] for r in rows]
    lg, _ = langgraph_series(run)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 6.2))
    for ax, field, title in (
        (left, "admission", "Chat → upstream request"),
        (right, "ttfe", "time to first event"),
    ):
        for who, style in (("agentrt", "-"), ("relay", "--")):
            for q, marker in (("p50_us", "o"), ("p99_us", "^")):
                ax.plot(
                    xs,
                    [ms(r[who][field], q) for r in rows],
                    style,
                    marker=marker,
                    color=COLORS[who],
                    label=f"{who} {q[:3]}",
                )
        if field == "ttfe":
            ax.plot(
                xs,
                [ms(r["direct"]["ttfe"], "p50_us") for r in rows],
                ":",
                color=COLORS["direct"],
                label="upstream read directly p50",
            )
        for label, points in lg.items():
            px = [s for s, _ in points]
            for q, marker in (("p50_us", "o"), ("p99_us", "^")):
                ax.plot(
                    px,
                    [ms(load[field], q) for _, load in points],
                    "-.",
                    marker=marker,
                    color=lg_color(label),
                    label=f"{label} {q[:3]}",
                )
        latency_axes(ax, "concurrent sessions (paced turns)", f"S2: {title}", ncol=3)
    finish(fig, run, out, "s2-latency.png", written)


def s2_bursts(run, out, written):
    rows = run.get("s2_burst") or []
    if not rows:
        print("plot: no S2 bursts in this run; s2-bursts.png skipped", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 5.6))
    for ax, field, title in (
        (axes[0], "admission", "Chat → upstream request"),
        (axes[1], "first_relay", "upstream first token → first event"),
    ):
        for kind, style in (("new", "-"), ("warm", "--")):
            part = sorted((r for r in rows if r["kind"] == kind), key=lambda r: r["sessions"])
            if not part:
                continue
            xs = [r["sessions"] for r in part]
            for who in ("agentrt", "relay"):
                for q, marker in (("p50_us", "o"), ("p99_us", "^")):
                    ax.plot(
                        xs,
                        [ms(r[who][field], q) for r in part],
                        style,
                        marker=marker,
                        color=COLORS[who],
                        alpha=1.0 if kind == "new" else 0.6,
                        label=f"{who}, {kind} sessions, {q[:3]}",
                    )
        latency_axes(ax, "Chats released at the same instant", f"S2 bursts: {title}", ncol=2)
    finish(fig, run, out, "s2-bursts.png", written)


def s6_turns(run, out, written):
    rows = sorted(run.get("s6") or [], key=lambda r: r["sessions"])
    if not rows:
        print("plot: no S6 in this run; s6-turns.png skipped", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    xs = [r["sessions"] for r in rows]
    ax.plot(xs, [r["turns_per_s"] for r in rows], "-o", color=COLORS["agentrt"], label="agentrt on sled")
    ax.axhline(2000, color="#999", linestyle=":", label="target 2,000/s (8+ sessions)")
    ax.set_xscale("log")
    ax.set_xlabel("sessions, each a loop of short turns")
    ax.set_ylabel("durable turns/s")
    ax.set_ylim(bottom=0)
    ax.set_title("S6: durable short turns (user message and answer flushed)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    plain_ticks(ax)
    ax.legend(fontsize=8)
    finish(fig, run, out, "s6-turns.png", written)


def saturation(run, out, written):
    s3 = run.get("s3")
    if not s3 or not s3.get("relay"):
        print("plot: no S3 with the relay in this run; saturation.png skipped", file=sys.stderr)
        return
    bars = []

    def best(loads):
        loads = [l for l in loads if l]
        return max(loads, key=lambda l: l["tokens_per_s"]) if loads else None

    for label, load in (
        ("relay", best(s3["relay"])),
        ("agentrt", best(s3.get("agentrt") or [])),
        ("agentrt,\nnew session\nper turn", best(s3.get("new_session") or [])),
    ):
        if load:
            bars.append((label, load, COLORS["relay" if label == "relay" else "agentrt"]))
    for p in (run.get("langgraph") or {}).get("probes", []):
        if p["runtime"] != "agentrt":
            bars.append((p["runtime"], p["saturation"], lg_color(p["runtime"])))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = [textwrap.fill(b[0].replace("\n", " "), 12) for b in bars]
    tokens = [b[1]["tokens_per_s"] for b in bars]
    cpu = [b[1]["server_cpu_us"] / max(b[1]["tokens"], 1) for b in bars]
    left.bar(labels, tokens, color=[b[2] for b in bars])
    for i, v in enumerate(tokens):
        left.annotate(f"{v:,.0f}", (i, v), ha="center", va="bottom", fontsize=7)
    left.set_ylabel("tokens/s (best level; linear)")
    left.set_title("Saturation: unpaced streams", fontsize=10)
    right.bar(labels, cpu, color=[b[2] for b in bars])
    for i, v in enumerate(cpu):
        right.annotate(f"{v:.3g}", (i, v), ha="center", va="bottom", fontsize=7)
    right.set_ylabel("server CPU µs per token")
    right.set_title("CPU per token at saturation", fontsize=10)
    for ax in (left, right):
        ax.tick_params(axis="x", labelsize=7)
        ax.set_ylim(bottom=0)
        ax.grid(True, axis="y", alpha=0.3)
    finish(fig, run, out, "saturation.png", written)


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    run = json.loads(Path(argv[1]).read_text())
    out = Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for figure in (s2_latency, s2_bursts, s6_turns, saturation):
        figure(run, out, written)
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
