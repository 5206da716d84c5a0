"""Turn one benchmark run's numbers (bench/run.py) into the markdown report and the plot."""

from __future__ import annotations

import statistics
from pathlib import Path

# Seconds a scheduled run may add to its Spark work (issue: a warm engine).
OVERHEAD_TARGET = 10


def isolation_costs(r: dict) -> list[float]:
    """read_committed's cost over read_uncommitted, per repetition (paired in time)."""
    by = r["isolation"]["by_isolation"]
    return [c / u - 1 for c, u in zip(by["read_committed"], by["read_uncommitted"], strict=True)]


def ratios(r: dict) -> dict[str, float]:
    """The figures the targets are about, from the raw results: per slice size, the
    throughput ratios (same rows, so a ratio of seconds); on the first size, the gate's
    share and the MERGE's growth."""
    out: dict[str, float] = {}
    for size in r["slices"]:
        label = f"{size['records'] / 1e6:g} M"
        if "w1" in size:  # not in make bench-quick
            out[f"W2/W1 ({label})"] = size["w1"]["seconds"] / size["w2"]["seconds"]
            if size["w1"].get("warm_seconds") and size["w2"].get("warm_seconds"):
                out[f"W2/W1 warm ({label})"] = statistics.median(
                    size["w1"]["warm_seconds"]
                ) / statistics.median(size["w2"]["warm_seconds"])
            out[f"W2/W1 peak memory ({label})"] = size["w2"]["peak_rss"] / size["w1"]["peak_rss"]
        if "w0" in size:
            out[f"W2/W0 ({label})"] = size["w0"]["seconds"] / size["w2"]["seconds"]
        out[f"W2 peak memory, GiB ({label})"] = size["w2"]["peak_rss"] / 2**30
        if "w1plus" in size:  # the same guarantees by hand
            out[f"W2/W1+ ({label})"] = size["w1plus"]["seconds"] / size["w2"]["seconds"]
            out[f"W2/W1+ peak memory ({label})"] = (
                size["w2"]["peak_rss"] / size["w1plus"]["peak_rss"]
            )
        if "w2avro" in size:  # the same records in Avro: the decode's cost
            out[f"W2 on JSON / W2 on Avro ({label})"] = (
                size["w2"]["seconds"] / size["w2avro"]["seconds"]
            )
    for baseline, name in (
        ("w1_airflow", "W2/W1 via Airflow"),
        ("w1plus_airflow", "W2/W1+ via Airflow"),
    ):
        if baseline in r and "w2_airflow" in r:
            out[name] = r[baseline]["seconds"] / r["w2_airflow"]["seconds"]
    if "minute" in r:
        out["one-minute slice, plan to publish, seconds"] = r["minute"]["seconds"]
        if "w1plus" in r["minute"]:
            out["one-minute slice, W2/W1+"] = (
                r["minute"]["w1plus"]["seconds"] / r["minute"]["seconds"]
            )
    if "cli" in r:
        out["a step by hand in its own driver, slowest step's median, seconds"] = max(
            r["cli"]["steps"].values()
        )
    first = r["slices"][0]["w2"]
    out["gate share of slice time"] = first["steps"]["gate"] / first["seconds"]
    merges = [m for m in r.get("w3", {}).get("merges", []) if m["horizon"]]
    scales = sorted({m["scale"] for m in merges})
    if len(scales) > 1:
        for dup in sorted({m["dup_rate"] for m in merges}):
            at = {m["scale"]: m["seconds"] for m in merges if m["dup_rate"] == dup}
            out[f"MERGE {scales[-1]}x / {scales[0]}x, {dup:.0%} re-sent"] = (
                at[scales[-1]] / at[scales[0]]
            )
    return out


def _steps(steps: dict[str, float], digits: int) -> str:
    """`ingest 6.1, gate 2.5, ...`: a workload's seconds per step."""
    return ", ".join(f"{k} {v:.{digits}f}" for k, v in steps.items())


def _median_and_range(w: dict) -> str:
    runs = w.get("runs") or [w["seconds"]]
    text = f"{w['seconds']:.1f}" + (f" ({min(runs):.1f}-{max(runs):.1f})" if len(runs) > 1 else "")
    if w.get("warm_seconds"):
        text += f"; warm {statistics.median(w['warm_seconds']):.1f}"
    return text


def _repeats(r: dict) -> int:
    return len(r["slices"][0]["w2"].get("runs") or [1])


def target_of(name: str, targets: dict[str, tuple[str, float]]) -> tuple[str, float]:
    """A figure's target: its name without the size or duplicate rate it was measured at."""
    key = name.split(" (")[0]
    return targets["MERGE 100x / 1x" if key.startswith("MERGE") else key]


def render(r: dict, targets: dict[str, tuple[str, float]]) -> str:
    cores = r["cores"]
    sizes = ", ".join(f"{s['records']:,}" for s in r["slices"])
    aborted = ", ".join(f"{s['produced']['aborted']:,}" for s in r["slices"])
    quick = r["args"].get("quick") == "True"  # make bench-quick: W2 and W1+ only
    workloads = "W1+ and W2" if quick else "W0, W1 and W2"
    lines = [
        f"# Benchmark{' (make bench-quick)' if quick else ''}, {r['when']}",
        "",
        f"Machine: {r['machine']}.",
        f"Slices: {sizes} committed records in 3 partitions (~1 % re-sent ids, ~0.1 % "
        f"malformed), plus {aborted} aborted. Command: `.venv/bin/python bench/run.py"
        + "".join(
            f" --{k.replace('_', '-')} {v.strip('[]').replace(',', '')}"
            for k, v in r["args"].items()
            if k in ("records", "w3_slice") and v and not quick
        )
        + (" --quick" if quick else "")
        + "`.",
        "",
        f"{workloads} ran {_repeats(r)} times per size in alternating order, each in a "
        "fresh process: seconds are the median (range); they then ran again in the same "
        "process on fresh tables (warm).",
        "",
        "| slice | workload | what | seconds | rows/s per core | peak memory |",
        "|---:|---|---|---:|---:|---:|",
    ]
    what = {
        "w0": ("W0", "batch read of the offsets -> Parquet, no dedup (ceiling)"),
        "w1": ("W1", "Structured Streaming AvailableNow, foreachBatch bronze + MERGE"),
        "w1plus": ("W1+", "our guarantees by hand: W1 + quarantine, survivor MERGE, GX, gold"),
        "w2": ("W2", "ours: plan, ingest (bronze + silver), gate, publish, one session"),
        "w2avro": ("W2 on Avro", "W2 on the same records in Avro (wire format, a registry)"),
    }
    for size in r["slices"]:
        rows = size["w2"]["rows"]
        for key, (name, text) in what.items():
            if key not in size:
                continue
            w = size[key]
            lines.append(
                f"| {size['records']:,} | {name} | {text} | {_median_and_range(w)} "
                f"| {rows / w['seconds'] / cores:,.0f} | {w['peak_rss'] / 2**20:,.0f} MiB |"
            )
    scheduled = {
        "w2_airflow": "W2 via Airflow | one scheduled run (a backfill through our scheduler, "
        "LocalExecutor), steps on a warm Spark Connect server",
        "w1_airflow": "W1 via Airflow | one scheduled run of a DAG whose one task "
        "spark-submits W1's job, on the same Airflow set-up",
        "w1plus_airflow": "W1+ via Airflow | the same for W1+'s job",
    }
    for key, text in scheduled.items():
        if key in r:
            w, first = r[key], r["slices"][0]
            lines.append(
                f"| {first['records']:,} | {text} | {w['seconds']:.1f} "
                f"| {first['w2']['rows'] / w['seconds'] / cores:,.0f} "
                f"| {w['peak_rss'] / 2**20:,.0f} MiB |"
            )
    lines += ["", "| figure | measured | target | met |", "|---|---:|---:|---|"]
    for name, value in ratios(r).items():
        key = name.split(" (")[0]
        if key not in targets and not key.startswith("MERGE"):  # reported, no target of its own
            lines.append(f"| {name} | {value:.2f} | - | - |")
            continue
        op, goal = target_of(name, targets)
        met = value >= goal if op == ">=" else value <= goal
        shown, goal_shown = (
            (f"{value:.0%}", f"{goal:.0%}") if "share" in name else (f"{value:.2f}", f"{goal}")
        )
        lines.append(f"| {name} | {shown} | {op} {goal_shown} | {'yes' if met else '**no**'} |")
    if "w2_airflow" in r:
        overhead = r["w2_airflow"]["seconds"] - r["slices"][0]["w2"]["seconds"]
        met = "yes" if overhead <= OVERHEAD_TARGET else "**no**"
        lines.append(
            "| fixed overhead per scheduled run (the DAG run's span - W2 Spark work) "
            f"| {overhead:.1f} s | <= {OVERHEAD_TARGET} s | {met} |"
        )
        if "run_seconds" not in r["w2_airflow"]:  # runs through `airflow dags test` had it
            from_command = r["w2_airflow"]["wall"] - r["slices"][0]["w2"]["seconds"]
            lines.append(
                "| from the `airflow backfill create` command to the run's end - W2 work "
                f"| {from_command:.0f} s | - | - |"
            )
    for size in r["slices"]:
        steps = size["w2"]["steps"]
        lines += [
            "",
            f"W2 steps on {size['records']:,} records (seconds): {_steps(steps, 1)}.",
        ]
    if "minute" in r:
        m = r["minute"]
        lines += [
            "",
            f"One-minute slices of ~{m['rows']:,.0f} records on a warm engine, medians of "
            f"{len(m['runs'])} after 3 (seconds): {_steps(m['steps'], 2)}; plan to publish "
            f"{m['seconds']:.2f} ({min(m['runs']):.2f}-{max(m['runs']):.2f}).",
        ]
        if "w1plus" in m:
            h = m["w1plus"]
            lines[-1] += (
                f" W1+ run once a minute on the same schedule, right after (~{h['rows']:,.0f} "
                f"records a run): {_steps(h['steps'], 2)}; in all {h['seconds']:.2f} "
                f"({min(h['runs']):.2f}-{max(h['runs']):.2f})."
            )
    if "cli" in r:
        c = r["cli"]
        lines += [
            "",
            f"Steps run by hand (`slicewise <step> --slice-id`), each in a driver of its own, "
            f"on {len(c['runs'])} slices of {c['records']} records, medians (seconds): "
            f"{_steps(c['steps'], 1)}"
            + (
                f", after `slicewise class-archive` ({c['class_archive_seconds']:.0f} s, once)."
                if "class_archive_seconds" in c
                else "."
            ),
        ]
    if "isolation" in r:
        costs = isolation_costs(r)
        by = r["isolation"]["by_isolation"]
        lines += [
            "",
            f"read_committed against read_uncommitted, W0's read of the "
            f"{r['isolation']['records']:,}-record slice, {len(costs)} repetitions in "
            f"alternating order: cost median {statistics.median(costs):+.1%}, "
            f"range {min(costs):+.1%} to {max(costs):+.1%} "
            f"(read_committed {_seconds(by['read_committed'])} s; "
            f"read_uncommitted {_seconds(by['read_uncommitted'])} s).",
        ]
    if "w3" not in r:  # make bench-quick
        return "\n".join(lines)
    lines += [
        "",
        "MERGE as silver grows (W3: synthetic slice of "
        f"{r['args']['w3_slice']} rows; history over {r['args']['history_days']} days):",
        "",
        "| silver | duplicates | horizon | MERGE s | files scanned | files rewritten | rows inserted |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    for m in r["w3"]["merges"]:
        lines.append(
            f"| {m['scale']}x ({m['silver_rows']:,}) | {m['dup_rate']:.0%} "
            f"| {'7 days' if m['horizon'] else 'none'} | {m['seconds']:.1f} "
            f"| {m['files_scanned']} of {m['files_total']} | {m['files_rewritten']} | {m['inserted']:,} |"
        )
    if r["w3"].get("replacing"):
        lines += [
            "",
            "A MERGE whose re-sent copies replace 1% of the slice's keys in silver, with the "
            "definition's `deletion_vectors` on (the default) and off:",
            "",
            "| silver | deletion vectors | MERGE s | rows replaced | files rewritten | vectors written |",
            "|---:|---|---:|---:|---:|---:|",
        ]
        for m in r["w3"]["replacing"]:
            lines.append(
                f"| {m['scale']}x ({m['silver_rows']:,}) | {'on' if m['deletion_vectors'] else 'off'} "
                f"| {m['seconds']:.1f} | {m['replaced']:,} | {m['files_rewritten']} "
                f"| {m['deletion_vectors_added']} |"
            )
    return "\n".join(lines)


def _seconds(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cores = r["cores"]
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.2))
    first = r["slices"][0]
    rows = first["w2"]["rows"]
    names = ["W0", "W1", "W2"] + (["W2 via\nAirflow"] if "w2_airflow" in r else [])
    seconds = [first["w0"]["seconds"], first["w1"]["seconds"], first["w2"]["seconds"]]
    seconds += [r["w2_airflow"]["seconds"]] if "w2_airflow" in r else []
    left.bar(
        names,
        [rows / s / cores for s in seconds],
        color=["#888", "#4a7", "#36c", "#9bd"][: len(names)],
    )
    left.set_ylabel("rows/s per core")
    left.set_title(f"throughput, one slice of {rows:,} records")
    for key, color in (("w0", "#888"), ("w1", "#4a7"), ("w2", "#36c")):
        pts = sorted((s["records"], s[key]["seconds"]) for s in r["slices"])
        middle.plot(
            [p[0] for p in pts], [p[1] for p in pts], marker="o", color=color, label=key.upper()
        )
    middle.set_xlabel("records in the slice")
    middle.set_ylabel("seconds")
    middle.set_title("cost against slice size")
    middle.legend(fontsize=7)
    for dup in sorted({m["dup_rate"] for m in r["w3"]["merges"]}):
        for horizon, style in ((True, "-"), (False, "--")):
            pts = sorted(
                (m["scale"], m["seconds"])
                for m in r["w3"]["merges"]
                if m["dup_rate"] == dup and m["horizon"] == horizon
            )
            right.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                style,
                marker="o",
                label=f"{dup:.0%} dup, {'7-day horizon' if horizon else 'no horizon'}",
            )
    right.set_xscale("log")
    right.set_xlabel("silver size (x slice)")
    right.set_ylabel("MERGE seconds")
    right.set_title("MERGE cost as silver grows")
    right.legend(fontsize=7)
    fig.suptitle(f"{r['when']} · {r['machine'][:110]}", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
