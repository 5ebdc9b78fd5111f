#!/usr/bin/env python3
"""Charts of a headway_bench run.

    tools/report.py [results/bench.json] [--out-dir DIR]

Reads Google Benchmark's JSON output of headway_bench and
- writes DIR/roofline.svg and .png: arithmetic intensity (flop/byte) against
  GFLOP/s, log-log, with the machine's measured ceilings as lines (FMA peak
  per target, flat; DRAM and L2 read bandwidth, slanted) and one point per
  benchmark row, a marker per kernel family and KV cache type (bytes as
  stored, so a bf16 cache's decode sits at about 3x the float32 row's
  intensity), the rows in bf16 or int8 compute (matmul packed:4-7;
  attention compute:1, 2) marked apart;
- writes DIR/speedup.svg and .png: the speed-up over SCALAR of each
  instruction set, per kernel.
DIR defaults to the JSON file's folder. The charts need matplotlib (Debian:
python3-matplotlib). The summary table is headway_bench's own, printed at the
end of its run (bench/harness/reporter.cc). docs/BENCHMARKS.md explains the
figures.
"""

import argparse
import json
import math
import os
import sys

# Highway's x86 targets, best first (the context's headway_targets, if
# present, says which this machine supports).
KNOWN_TARGETS = ["AVX3_ZEN4", "AVX3_SPR", "AVX3_DL", "AVX3", "AVX2", "SSE4",
                 "SSSE3", "SSE2", "EMU128", "SCALAR"]
# Run settings in a benchmark's name, not part of its shape.
SETTINGS = ("min_time:", "min_warmup_time:", "repeats:", "iterations:")
TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
# The KV cache's stored type in a "dtype:N" argument (N: the KvDtype value),
# as the summary table names it.
DTYPES = {"0": "f32", "1": "bf16", "2": "f16", "3": "int8"}
# The rows in a compute mode other than float32, by the argument that says so:
# matmul's bf16 (bench/matmul_bench.cc: packed:4 native kernel allowed,
# packed:5 fallback, packed:6 A given as bf16, packed:7 int8 weights; oneDNN's
# bf16 matmul is packed:4) and attention's AttentionCompute (compute:1
# kBFloat16, compute:2 kInt8).
COMPUTE = {"packed:4": "bf16", "packed:5": "bf16", "packed:6": "bf16",
           "packed:7": "bf16", "compute:1": "bf16", "compute:2": "int8"}


class Row:
    """One benchmark row, parsed from its name
    (family/TARGET/arg:value/.../threads:N/real_time; a peer without a target
    has its kernel's name in place of TARGET, and no target here)."""

    def __init__(self, entry, targets):
        parts = entry.get("run_name", entry["name"]).split("/")
        self.family = parts[0]
        self.target = parts[1] if len(parts) > 1 and parts[1] in targets else ""
        shape = []
        self.threads = 0
        self.dtype = ""  # "bf16", ...; "" for float32 storage or no cache
        compute = ""
        for arg in parts[2:]:
            if arg.startswith("threads:"):
                self.threads = int(arg[len("threads:"):])
            elif ":" in arg and not arg.startswith(SETTINGS):
                shape.append(arg)
                compute = COMPUTE.get(arg, compute)
                if arg.startswith("dtype:"):
                    name = DTYPES.get(arg[len("dtype:"):], arg)
                    self.dtype = "" if name == "f32" else name
        # The roofline's marker: one per kernel family and stored type, so the
        # bf16, f16 and int8 rows stand apart from the float32 ones, and the
        # rows in a compute mode (bf16 above the float32 FMA peak where
        # native) apart from the float32 products.
        self.kind = self.family + (" " + self.dtype if self.dtype else "") + (
            " " + compute + " compute" if compute else "")
        self.shape = "/".join(shape)
        self.error = entry.get("error_message", "") if entry.get(
            "error_occurred") else ""
        self.seconds = entry.get("real_time", 0.0) * TIME_UNITS.get(
            entry.get("time_unit", "ns"), 1e-9)
        self.gflops = entry.get("GFLOP/s", 0.0)
        self.gbps = entry.get("GB/s", 0.0)


def load(path):
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as error:
        sys.exit("report: cannot read %s: %s" % (path, error))
    context = data.get("context", {})
    targets = context.get("headway_targets", "")
    targets = targets.split(",") if targets else KNOWN_TARGETS
    # One row per benchmark: the median if repeated, else the run.
    chosen = {}
    for entry in data.get("benchmarks", []):
        name = entry.get("run_name", entry["name"])
        if entry.get("run_type") == "aggregate":
            if entry.get("aggregate_name") == "median":
                chosen[name] = entry
        elif name not in chosen:
            chosen[name] = entry
    rows = [Row(entry, targets) for entry in chosen.values()]
    return context, targets, rows


def ceilings(context, targets):
    """FMA peaks {(target, threads): GFLOP/s} and bandwidths
    {(name, threads): GB/s} from the JSON context."""
    fma, bandwidth = {}, {}
    for key, value in context.items():
        if not key.startswith("headway_") or not key.endswith("t"):
            continue
        stem, _, count = key.rpartition("_")
        try:
            threads, number = int(count[:-1]), float(value)
        except ValueError:
            continue
        if stem.startswith("headway_fma_gflops_"):
            fma[(stem[len("headway_fma_gflops_"):], threads)] = number
        elif stem.endswith("_gbps"):
            bandwidth[(stem[len("headway_"):-len("_gbps")], threads)] = number
    return fma, bandwidth


def colours(targets):
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
               "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"]
    return {t: palette[i % len(palette)] for i, t in enumerate(targets)}


def save(fig, out_dir, name):
    paths = []
    for ext in ("svg", "png"):
        path = os.path.join(out_dir, name + "." + ext)
        fig.savefig(path, dpi=110)
        paths.append(path)
    return paths


def roofline_chart(plt, rows, context, targets, out_dir):
    from matplotlib.lines import Line2D

    points = [r for r in rows if not r.error and r.gflops > 0 and r.gbps > 0]
    if not points:
        print("report: no row reports both GFLOP/s and GB/s: no roofline")
        return []
    fma, bandwidth = ceilings(context, targets)
    colour = colours(targets)
    all_threads = max([t for _, t in fma] + [r.threads for r in rows] + [1])
    families = []
    for r in points:
        if r.kind not in families:
            families.append(r.kind)
    markers = "os^vDPX*hp<>dH8+x1234"
    marker = {f: markers[i % len(markers)] for i, f in enumerate(families)}

    fig, ax = plt.subplots(figsize=(15, 8.5))
    fig.subplots_adjust(left=0.07, right=0.66, top=0.95, bottom=0.08)
    ax.set_xscale("log")
    ax.set_yscale("log")
    intensity = [r.gflops / r.gbps for r in points]
    peak = max(list(fma.values()) + [r.gflops for r in points])
    x_lo = min(intensity + [0.1]) / 2
    x_hi = max(intensity + [100.0]) * 2
    y_lo = min(r.gflops for r in points) / 2
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, peak * 2)

    # Flat lines: each target's FMA peak, solid on all threads, dashed on one;
    # one label for the targets whose peaks are within 3% of each other.
    labels = []
    for (target, threads), gflops in sorted(fma.items(),
                                            key=lambda kv: -kv[1]):
        style = "-" if threads == all_threads else "--"
        ax.axhline(gflops, color=colour.get(target, "grey"), lw=1, ls=style,
                   alpha=0.7)
        name = "%s %dt" % (target, threads)
        if labels and labels[-1][0] / gflops < 1.03:
            labels[-1][1].append(name)
        else:
            labels.append((gflops, [name], colour.get(target, "grey")))
    for gflops, names, c in labels:
        ax.text(x_hi / 1.05, gflops * 1.02, "%s: %.0f GFLOP/s" % (
            ", ".join(names), gflops), ha="right", va="bottom", fontsize=7,
                color=c)
    # Slanted lines: bandwidth x intensity, up to the best FMA peak of the
    # same thread count, labelled along the line.
    fig.canvas.draw()
    for (name, threads), gbps in sorted(bandwidth.items()):
        if name not in ("read", "l2_read"):
            continue
        style = "-" if threads == all_threads else "--"
        shade = "black" if name == "read" else "#888888"
        top = max([g for (_, t), g in fma.items() if t == threads] + [peak])
        xs = [x_lo, top / gbps]
        ax.plot(xs, [x * gbps for x in xs], color=shade, lw=1.2, ls=style)
        # Where the line crosses a height near the bottom of the chart.
        y_text = y_lo * (3 if threads == all_threads else 1.6)
        x_text = y_text / gbps
        if x_text < x_lo * 1.2:
            x_text = x_lo * 1.2
            y_text = x_text * gbps
        a = ax.transData.transform((x_text, y_text))
        b = ax.transData.transform((x_text * 10, y_text * 10))
        angle = math.degrees(math.atan2(b[1] - a[1], b[0] - a[0]))
        ax.text(x_text * 1.15, y_text, "%s %dt: %.0f GB/s" % (
            "DRAM read" if name == "read" else "L2 read", threads, gbps),
                fontsize=7, color=shade, rotation=angle,
                rotation_mode="anchor", ha="left", va="top")

    # Rows of one intensity (the same kernel and shape) would hide each
    # other: each target's points sit slightly to the side, by up to +-15%.
    slots = [t for t in targets if any(r.target == t for r in points)] + [""]
    for r in points:
        filled = r.threads == all_threads
        c = colour.get(r.target, "black")
        shift = 1.06 ** (slots.index(r.target) - (len(slots) - 1) / 2)
        m = marker[r.kind]
        if m in "+x1234|_":
            # Line markers have no face: the all-threads points are bolder.
            ax.scatter([r.gflops / r.gbps * shift], [r.gflops], marker=m,
                       s=36, linewidths=1.8 if filled else 0.9, color=c,
                       alpha=0.85, zorder=3)
        else:
            ax.scatter([r.gflops / r.gbps * shift], [r.gflops], marker=m,
                       s=36, linewidths=1.1, edgecolors=c,
                       facecolors=c if filled else "none", alpha=0.85,
                       zorder=3)

    ax.set_xlabel("arithmetic intensity (flop / byte moved)")
    ax.set_ylabel("GFLOP/s (float32, 1e9 flop / s)")
    ax.set_title("Headway roofline: measured ceilings (lines) and benchmark "
                 "rows (points,\nspread sideways by target at a given "
                 "intensity)", fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", alpha=0.1)
    family_handles = [Line2D([], [], ls="", marker=marker[f], color="black",
                             markerfacecolor="black", label=f)
                      for f in families]
    target_handles = [Line2D([], [], ls="-", marker="o", color=colour[t],
                             label=t)
                      for t in targets if any(r.target == t for r in points)]
    if any(not r.target for r in points):
        target_handles.append(Line2D([], [], ls="", marker="o", color="black",
                                     label="peer (own kernel)"))
    thread_handles = [
        Line2D([], [], ls="", marker="o", color="grey", label="1 thread",
               markerfacecolor="none"),
        Line2D([], [], ls="", marker="o", color="grey",
               label="%d threads" % all_threads)]
    # The legends stacked right of the axes, each below the one before (its
    # drawn height, in axes units); the kernels in two columns past 20 of them.
    def below(legend):
        fig.canvas.draw()
        box = legend.get_window_extent().transformed(ax.transAxes.inverted())
        return box.y0 - 0.02

    first = ax.legend(handles=family_handles,
                      title="kernel (and KV dtype)", fontsize=7,
                      title_fontsize=8, loc="upper left",
                      ncol=2 if len(family_handles) > 20 else 1,
                      bbox_to_anchor=(1.01, 1.0))
    ax.add_artist(first)
    second = ax.legend(handles=target_handles, title="target (line: FMA peak)",
                       fontsize=7, title_fontsize=8, loc="upper left",
                       bbox_to_anchor=(1.01, below(first)))
    ax.add_artist(second)
    ax.legend(handles=thread_handles, title="threads (dashed: 1 thread)",
              fontsize=7, title_fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, below(second)))
    paths = save(fig, out_dir, "roofline")
    plt.close(fig)
    return paths


def speedup_chart(plt, rows, targets, out_dir):
    """Bars: per kernel family and thread count, each target's speed-up over
    SCALAR, the geometric mean over the shapes that every target ran."""
    ok = [r for r in rows if not r.error and r.target and r.seconds > 0]
    if not any(r.target == "SCALAR" for r in ok):
        print("report: no SCALAR rows: no speed-up chart")
        return []
    thread_counts = sorted({r.threads for r in ok})
    families = []
    for r in ok:
        if r.family not in families and any(
                s.family == r.family and s.target == "SCALAR" for s in ok):
            families.append(r.family)
    vector_targets = [t for t in targets if t != "SCALAR"
                      and any(r.target == t for r in ok)]
    colour = colours(targets)
    fig, axes = plt.subplots(len(thread_counts), 1, squeeze=False,
                             figsize=(max(8, 1.6 * len(families) + 3),
                                      3.8 * len(thread_counts)))
    width = 0.8 / max(1, len(vector_targets))
    for ax, threads in zip(axes[:, 0], thread_counts):
        labels = []
        for fi, family in enumerate(families):
            time = {(r.target, r.shape): r.seconds for r in ok
                    if r.family == family and r.threads == threads}
            ran = [t for t in vector_targets
                   if any(k[0] == t for k in time)]
            shapes = {k[1] for k in time if k[0] == "SCALAR"}
            for t in ran:
                shapes &= {k[1] for k in time if k[0] == t}
            labels.append("%s\n(%d shape%s)" % (
                family.replace("_", "\n", 1), len(shapes),
                "" if len(shapes) == 1 else "s"))
            for ti, t in enumerate(vector_targets):
                if t not in ran or not shapes:
                    continue
                logs = [math.log(time[("SCALAR", s)] / time[(t, s)])
                        for s in shapes]
                speedup = math.exp(sum(logs) / len(logs))
                x = fi + (ti - (len(vector_targets) - 1) / 2) * width
                ax.bar(x, speedup, width, color=colour[t],
                       label=t if fi == 0 or t not in
                       ax.get_legend_handles_labels()[1] else None)
                ax.text(x, speedup, "%.1f" % speedup, ha="center",
                        va="bottom", fontsize=6)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks(range(len(families)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("speed-up over SCALAR (x)")
        ax.set_title("%d thread%s: geometric mean over the shapes that every "
                     "target ran" % (threads, "" if threads == 1 else "s"),
                     fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        handles, names = ax.get_legend_handles_labels()
        ax.legend(handles, names, title="target", fontsize=7,
                  title_fontsize=8, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("Headway: speed-up of each instruction set over SCALAR")
    fig.tight_layout()
    paths = save(fig, out_dir, "speedup")
    plt.close(fig)
    return paths


def main():
    parser = argparse.ArgumentParser(
        description="Roofline and speed-up charts of a headway_bench JSON "
                    "file.")
    parser.add_argument("json", nargs="?", default="results/bench.json",
                        help="Google Benchmark JSON output "
                             "(default: results/bench.json)")
    parser.add_argument("--out-dir",
                        help="where the charts go (default: the JSON's "
                             "folder)")
    args = parser.parse_args()
    context, targets, rows = load(args.json)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: matplotlib is missing, so no charts; "
              "`sudo apt-get install python3-matplotlib` gets them "
              "(for /usr/bin/python3).")
        return 0
    out_dir = args.out_dir or os.path.dirname(os.path.abspath(args.json))
    os.makedirs(out_dir, exist_ok=True)
    written = roofline_chart(plt, rows, context, targets, out_dir)
    written += speedup_chart(plt, rows, targets, out_dir)
    for path in written:
        print("report: wrote " + path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
