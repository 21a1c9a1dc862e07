"""Roofline of one device from a results JSON (run.py or gpu.py): every kernel of the suite,
tilec and each peer, placed by arithmetic intensity against the peak compute and bandwidth.

    python benchmarks/roofline.py benchmarks/results-cpu.json -o benchmarks/roofline-cpu.png
    python benchmarks/roofline.py benchmarks/results-gpu.json -o benchmarks/roofline-gpu.png \\
        --peak-tflops 66.9 --bandwidth-gbs 4800      # H200 (an H100 SXM: 66.9 and 3350)

Intensity is the suite's conventional FLOP over the least traffic the operation needs (inputs
read once, output written once), so a kernel's point sits under the roof only as far as it
wastes compute or moves data more than once; a point above the bandwidth line ran from cache."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

MARKERS = {"tilec": ("o", "#d62728"), "numpy": ("s", "#1f77b4"),
           "numpy (OPENBLAS_* unset)": ("D", "#17becf"), "onnxruntime": ("^", "#2ca02c"),
           "PlaidML": ("v", "#9467bd"), "torch": ("s", "#1f77b4")}


def short(kernel: str) -> str:
    """A label that fits beside a point: 'seed conv 3x3 + ReLU, N=1 56x56 64->64' -> 'conv
    N=1 56x56'."""
    k = kernel.replace("seed conv 3x3 + ReLU, ", "conv ").replace(" 64->64", "")
    k = k.replace(" (MxNxK)", "").replace(" (rows)", "").replace("depthwise 3x3, ", "dw ")
    return k.replace("max pool 2x2/2, ", "maxpool ")


def plot(results: Path, out: Path, peak_flops: float | None = None,
         bandwidth: float | None = None, title: str | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(Path(results).read_text())
    meta = data["meta"]
    peak = peak_flops or meta["peak_flops"]
    bw = bandwidth or meta["peak_bytes"]
    order = ["matmul", "conv", "depthwise", "maxpool", "softmax"]
    rows = sorted((r for r in data["results"] if r.get("tilec_s") or r.get("peers")),
                  key=lambda r: (order.index(r["op"]) if r["op"] in order else 9, r["flops"]))
    ai = [r["intensity"] for r in rows]
    lo, hi = min(ai + [1.0]) / 2, max(ai + [peak / bw]) * 3
    gpu = peak > 5e12
    scale, unit = (1e12, "TFLOP/s") if gpu else (1e9, "GFLOP/s")

    fig, ax = plt.subplots(figsize=(11.5, 6.5), dpi=110)
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [min(peak, x * bw) / scale for x in xs], color="black", lw=1.5)
    ridge = peak / bw
    ax.annotate(f"peak {peak / scale:.3g} {unit}", (hi, peak / scale), ha="right",
                va="bottom", fontsize=9)
    ax.annotate(f"{bw * 1e-9:.0f} GB/s", (lo * 1.1, lo * 1.1 * bw / scale), rotation=0,
                va="bottom", fontsize=9)
    ax.axvline(ridge, color="grey", lw=0.6, ls=":")
    seen = set()
    key: list[str] = []
    for r in rows:
        x = r["intensity"]
        entries = [("tilec", r.get("tilec_s"))]
        entries += [(p, e.get("s")) for p, e in r.get("peers", {}).items()]
        for who, secs in entries:
            if not secs:
                continue
            marker, color = MARKERS.get(who, ("x", "#7f7f7f"))
            y = r["flops"] / secs / scale
            big = who == "tilec"
            ax.scatter([x], [y], marker=marker, color=color, s=60 if big else 30,
                       zorder=3 if big else 2, alpha=1.0 if big else 0.75,
                       edgecolors="black" if big else "none", linewidths=0.5,
                       label=None if who in seen else who)
            seen.add(who)
        # Clusters (the matmuls and convs sit at 40-700 FLOP/B) leave no room for names: a
        # number beside tilec's point, the names in a key beside the plot, and a thin line
        # joining one kernel's points (peers share its intensity).
        ys = [r["flops"] / s / scale for _, s in entries if s]
        if len(ys) > 1:
            ax.plot([x, x], [min(ys), max(ys)], color="grey", lw=0.5, zorder=1)
        if ys:
            key.append(f"{len(key) + 1:>2}  {short(r['kernel'])}")
            y = r["flops"] / r["tilec_s"] / scale if r.get("tilec_s") else max(ys)
            ax.annotate(str(len(key)), (x, y), xytext=(6, 0), va="center",
                        textcoords="offset points", fontsize=8, fontweight="bold",
                        color="#d62728")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ymin = min([r["flops"] / s / scale for r in rows
                for s in [r.get("tilec_s")] + [e.get("s") for e in r.get("peers", {}).values()]
                if s] + [peak / scale / 100])
    ax.set_ylim(ymin / 2, peak / scale * 2)
    ax.set_xlabel("arithmetic intensity (FLOP / minimal byte)")
    ax.set_ylabel(f"achieved {unit}")
    # "OpenCL 3.0 PoCL 3.1+debian  Linux, ..." -> "PoCL 3.1+debian"
    driver = meta.get("platform_version", "").split("  ")[0].replace("OpenCL 3.0 ", "")
    ax.set_title(title or f"{meta['device']} ({driver}), {meta['date']}", fontsize=10)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    # Above the bandwidth line left of the ridge nothing can sit: room for the legend.
    ax.legend(loc="upper left", fontsize=8)
    fig.text(0.01, 0.005, f"peaks: {meta.get('peak_note', '')}", fontsize=7, color="grey")
    fig.text(0.80, 0.92, "\n".join(key), fontsize=8, va="top", family="monospace")
    fig.tight_layout(rect=(0, 0.02, 0.79, 1))
    fig.savefig(out)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="results JSON from run.py or gpu.py")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    ap.add_argument("--peak-tflops", type=float, help="peak fp32 (default: the JSON's)")
    ap.add_argument("--bandwidth-gbs", type=float, help="peak bandwidth (default: the JSON's)")
    ap.add_argument("--title")
    args = ap.parse_args()
    plot(Path(args.results), Path(args.output),
         args.peak_tflops * 1e12 if args.peak_tflops else None,
         args.bandwidth_gbs * 1e9 if args.bandwidth_gbs else None, args.title)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
