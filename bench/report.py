"""Render a run: markdown report, JSON, PNG plots (matplotlib, Agg backend)."""

from __future__ import annotations

import json
import math
import os
from typing import Any

__all__ = ["write_all"]


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "–"
        a = abs(v)
        if a >= 1000:
            return f"{v:,.0f}"
        if a >= 10:
            return f"{v:.1f}"
        if a >= 0.01 or a == 0:
            return f"{v:.3f}"
        return f"{v:.2e}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def _plots(results: dict[str, Any], out: str, stem: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    save = results.get("save", {}).get("plots")
    if save:
        names = list(save["summary"])
        med = [save["summary"][n].get("mib_s", 0) for n in names]
        best = [save["summary"][n].get("mib_s_best", 0) for n in names]
        rss = [save["summary"][n].get("maxrss_mib", 0) for n in names]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
        a1.bar(names, med, color="#4477aa", label="median")
        a1.scatter(names, best, color="k", marker="_", s=200, label="best")
        if save.get("memcpy_mib_s"):
            a1.axhline(save["memcpy_mib_s"], color="#cc6677", ls="--", label="memcpy (fresh buffers)")
        a1.set_ylabel("MiB/s (incl. fsync)")
        a1.set_title(f"Save {save['bytes'] / 2**20:.0f} MiB, one process")
        a1.legend(fontsize=8)
        a1.tick_params(axis="x", rotation=20)
        a2.bar(names, rss, color="#228833")
        a2.set_ylabel("peak RSS of the process, MiB")
        a2.set_title("Memory per operation (state included)")
        a2.tick_params(axis="x", rotation=20)
        fig.tight_layout()
        p = f"{stem}-save.png"
        fig.savefig(os.path.join(out, p), dpi=110)
        plt.close(fig)
        made.append(p)
    ver = results.get("verify", {}).get("plots")
    if ver:
        fig, ax = plt.subplots(figsize=(7, 4))
        modes = [m for m in ("warm", "cold") if m in ver]
        names = list(ver[modes[0]])
        width = 0.8 / len(modes)
        for i, m in enumerate(modes):
            ax.bar([j + i * width for j in range(len(names))], [ver[m][n].get("mib_s", 0) for n in names], width,
                   label="page cache" if m == "warm" else "cold cache")
        ax.set_xticks([j + width * (len(modes) - 1) / 2 for j in range(len(names))], names)
        ax.set_ylabel("MiB/s")
        ax.set_title("verify --deep vs reading the same files")
        ax.legend()
        fig.tight_layout()
        p = f"{stem}-verify.png"
        fig.savefig(os.path.join(out, p), dpi=110)
        plt.close(fig)
        made.append(p)
    z = results.get("zstd", {}).get("plots")
    if z and z["rows"]:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for r in z["rows"]:
            ax.scatter(r["compress MiB/s"], r["ratio"], marker="o" if r["dtype"] == "bfloat16" else "s",
                       color={"normal": "#4477aa", "adam_v": "#ee6677", "sparse": "#228833"}[r["data"]])
            ax.annotate(f"{r['data']} {r['dtype'][:4]} L{r['level']}", (r["compress MiB/s"], r["ratio"]), fontsize=6)
        ax.set_xscale("log")
        ax.set_xlabel("compress MiB/s (one thread)")
        ax.set_ylabel("compression ratio")
        ax.set_title("zstd levels 1/3/9 (circle bf16, square fp32)")
        fig.tight_layout()
        p = f"{stem}-zstd.png"
        fig.savefig(os.path.join(out, p), dpi=110)
        plt.close(fig)
        made.append(p)
    sc = results.get("scale", {}).get("plots")
    if sc and sc["points"]:
        allp = sc["points"]
        fitted = sorted((p for p in allp if p.get("fitted")), key=lambda p: p["records"])
        others = [p for p in allp if not p.get("fitted")]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.8))
        xs = [p["records"] for p in fitted]
        for k, lab, style in (("commit_s", "commit", "-o"), ("open_s", "open (manifest + table)", "--s"),
                              ("plan_s", "plan (plan_read × all tensors)", "--^"),
                              ("open_plan_s", "open + plan", ":v")):
            a1.plot(xs, [p.get(k) or float("nan") for p in fitted], style, label=f"1.1 table: {lab}")
        for p in others:
            mk = "x" if p["form"] == "json" else "+"
            lab = "1.0 JSON" if p["form"] == "json" else "1.1 table"
            a1.scatter([p["records"]], [p["commit_s"]], marker=mk, color="k", s=60)
            a1.scatter([p["records"]], [p["open_plan_s"]], marker=mk, color="gray", s=60)
            a1.annotate(f"{lab} {p['writers']}×{p['tensors']}", (p["records"], p["commit_s"]), fontsize=6,
                        xytext=(4, 2), textcoords="offset points")
        if others:
            a1.scatter([], [], marker="x", color="k", label="commit, comparison points (× 1.0 JSON, + 1.1)")
            a1.scatter([], [], marker="x", color="gray", label="open + plan, comparison points")
        a1.axhline(10, color="r", ls=":", lw=1)
        a1.axhline(1, color="r", ls=":", lw=1)
        a1.set_xscale("log")
        a1.set_yscale("log")
        a1.set_xlabel("range records (" + ", ".join(f"W={p['writers']}" for p in fitted) + ")")
        a1.set_ylabel("seconds (median)")
        a1.set_title("Commit and one rank's load plan (targets dotted: 10 s, 1 s)")
        a1.legend(fontsize=7)
        for k, lab, style in (("commit_rss_mib", "commit peak RSS", "-o"), ("plan_rss_mib", "open+plan peak RSS", "--^"),
                              ("table_mib", "tensor table (zstd) MiB", "-s"), ("manifest_mib", "manifest.json MiB", ":s")):
            a2.plot(xs, [p.get(k) or float("nan") for p in fitted], style, label=lab)
        for p in (q for q in others if q["form"] == "json"):
            a2.scatter([p["records"]], [p["commit_rss_mib"]], marker="x", color="k", s=60)
            a2.scatter([p["records"]], [p["plan_rss_mib"]], marker="x", color="gray", s=60)
        if any(q["form"] == "json" for q in others):
            a2.scatter([], [], marker="x", color="k", label="1.0 JSON commit peak RSS")
            a2.scatter([], [], marker="x", color="gray", label="1.0 JSON open+plan peak RSS")
        a2.set_xscale("log")
        a2.set_yscale("log")
        a2.set_xlabel("range records")
        a2.set_ylabel("MiB")
        a2.set_title("Memory and metadata size")
        a2.legend(fontsize=7)
        fig.tight_layout()
        p = f"{stem}-scale.png"
        fig.savefig(os.path.join(out, p), dpi=110)
        plt.close(fig)
        made.append(p)
    rl = results.get("realistic", {}).get("plots")
    if rl and rl.get("models"):
        made += _realistic_plots(plt, rl["models"], out, stem)
    return made


def _bars(ax: Any, groups: dict[str, dict[str, float]], ylabel: str, title: str) -> None:
    order = ["portable_ckpt", "dcp", "dd", "streams"]
    names = sorted({c for g in groups.values() for c in g},
                   key=lambda c: (order.index(c) if c in order else len(order), c))
    width = 0.8 / max(1, len(names))
    colors = {"portable_ckpt": "#4477aa", "dcp": "#ee6677", "dd": "#bbbbbb", "streams": "#777777"}
    for i, n in enumerate(names):
        xs = [j + i * width for j in range(len(groups))]
        ax.bar(xs, [g.get(n, 0) for g in groups.values()], width, label=n, color=colors.get(n))
    ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(groups))], list(groups))
    ax.tick_params(axis="x", rotation=20, labelsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)


def _realistic_plots(plt: Any, models: list[dict[str, Any]], out: str, stem: str) -> list[str]:
    made = []
    for m in models:
        if "save" not in m:  # an --only-async run: no save or load phase to plot
            continue
        fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(15, 4.2), gridspec_kw={"width_ratios": [1, 3, 1.5]})
        _bars(a1, {"save": m["save"]}, "MiB/s (incl. fsync)", f"{m['name']}: save")
        _bars(a2, m["load"], "MiB/s of target bytes", f"{m['name']}: load (layout, page cache)")
        _bars(a3, m["bytes"], "bytes read per rank / target bytes", "rchar / target (worst rank)")
        a3.axhline(1.0, color="k", lw=0.5)
        fig.tight_layout()
        p = f"{stem}-realistic-{m['name']}.png"
        fig.savefig(os.path.join(out, p), dpi=110)
        plt.close(fig)
        made.append(p)
    return made


def write_all(results: dict[str, Any], machine: dict[str, Any], meta: dict[str, Any], out: str, stem: str) -> str:
    """Write ``<stem>.md``, ``<stem>.json`` and ``<stem>-*.png`` into ``out``; return the md path."""
    os.makedirs(out, exist_ok=True)
    try:
        plots = _plots(results, out, stem)
    except Exception as exc:  # the figures are kept either way; the report says why no plot
        plots = []
        meta["plot_error"] = repr(exc)
    with open(os.path.join(out, f"{stem}.json"), "w") as f:
        json.dump({"meta": meta, "machine": machine, "sections": results}, f, indent=1, default=str)
    md = [f"# portable_ckpt benchmark — {meta['mode']} mode, {meta['date']}", ""]
    md.append(f"Command: `{meta['command']}` · wall time {meta['wall_s']:.0f} s · sections: {', '.join(results)}")
    if meta.get("git"):
        md.append(f"\nMeasured at commit `{meta['git']}` with torch {meta.get('torch', '?')}.")
    if meta.get("rendered_by"):
        md.append(f"Re-rendered from the raw results by `{meta['rendered_by']}` (the machine "
                  "below is the one that measured).")
    md.append("")
    if meta.get("plot_error"):
        md += [f"No plots: {meta['plot_error']}", ""]
    md.append("## Machine")
    md.append("")
    v = machine["versions"]
    md.append(_table([
        {"item": "CPU", "value": f"{machine['cpu']}, {machine['cores']} logical cores"},
        {"item": "memory", "value": f"{machine['memory_gib']} GiB"},
        {"item": "disk (scratch)", "value": f"{machine['scratch']} on {machine['disk']}, {machine['disk_free_gib']} GiB free"},
        {"item": "kernel / OS", "value": f"{machine['kernel']} / {machine['os']}"},
        {"item": "Python", "value": machine["python"]},
        {"item": "libraries", "value": ", ".join(f"{k} {x}" for k, x in v.items())},
        {"item": "page cache control", "value": "can drop caches (cold-cache rows available)" if meta["cold"] else "cannot drop caches"},
    ]))
    md.append("")
    targets = [dict(t, section=k) for k, r in results.items() for t in r.get("targets", [])]
    if targets:
        md += ["## Targets", "", _table([{"section": t["section"], "target": t["name"], "measured": t["value"],
                                          "required": t["target"], "met": "MET" if t["met"] else "MISSED"}
                                         for t in targets]), ""]
    for p in plots:
        md += [f"![{p}]({p})", ""]
    for key, r in results.items():
        md += [f"## {r.get('title', key)} (`--only {key}`)", ""]
        if r.get("rows"):
            md += [_table(r["rows"]), ""]
        for cap, rows in r.get("tables", {}).items():
            md += [f"**{cap}**", "", _table(rows), ""]
        for n in r.get("notes", []):
            md += [f"- {n}"]
        ext = r.get("external")
        if ext:
            md += ["", "<details><summary>output</summary>", "", "```", ext["stdout"][-8000:].rstrip(), "```", "", "</details>"]
        md.append("")
    path = os.path.join(out, f"{stem}.md")
    with open(path, "w") as f:
        f.write("\n".join(md))
    return path
