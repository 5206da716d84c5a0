"""Run a command and report the CPU seconds every process on the machine spent meanwhile,
summed by what the process is (the Spark Connect server, a Kafka broker, an Airflow
scheduler, pytest's workers, ...), so a suite that grew shows which component grew.

    python scripts/cpu_by_process.py [--top 20] -- COMMAND [ARG ...]

`scripts/test.sh` runs pytest under it. Each process's user+system time is read from
/proc every half second; a process that lives less than that is missed, and the report
gives the machine's own total beside the processes' sum so the gap shows. The exit code
is the command's. Sampling costs about 10 CPU seconds over a 30-minute suite."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict

TICK = os.sysconf("SC_CLK_TCK")

# (substring of the command line, what the process is), first match wins.
JVMS = (
    ("SparkConnectServer", "Spark Connect server"),
    ("CoarseGrainedExecutorBackend", "Spark executor"),
    ("deploy.master.Master", "Spark standalone master"),
    ("deploy.worker.Worker", "Spark standalone worker"),
    ("slicewise-class-archive", "class-archive driver"),
    ("pyspark-shell", "in-process Spark driver (PySpark)"),
    ("SparkSubmit", "spark-submit driver"),
    ("kafka.Kafka", "Kafka broker"),
    ("s3proxy", "s3proxy"),
    ("quarkus", "schema registry (Apicurio)"),
    ("kafka.", "Kafka command-line tool"),
)
OTHERS = (
    ("sys.stdin.readline", "pytest workers (tests, dag.test, clients)"),
    ("pytest-xdist", "pytest workers (tests, dag.test, clients)"),
    ("/.venv-py3", "other Pythons' unit tiers"),
    ("-m pytest", "pytest controller"),
    ("preloaded_scheduler", "Airflow scheduler"),
    ("airflow scheduler", "Airflow scheduler"),
    ("airflow api-server", "Airflow api-server"),
    ("airflow dag-processor", "Airflow dag-processor"),
    ("airflow triggerer", "Airflow triggerer"),
    ("celery", "Airflow Celery worker"),
    ("airflow", "Airflow tasks and command-line"),
    ("attempts", "chaos attempts"),
    ("spark_jobs/", "spark-submit Python"),
    ("pyspark.daemon", "spark-submit Python"),
    ("slicewise", "slicewise command-line"),
    ("chrom", "Chromium"),
    ("playwright", "Chromium"),
    ("postgres", "PostgreSQL"),
    ("redis", "Redis"),
    ("uv ", "uv (installs)"),
    ("pip", "pip (installs)"),
)


def kind(cmdline: str) -> str:
    program = os.path.basename(cmdline.split(" ", 1)[0])
    if program == "java" or "spark-class" in cmdline:
        return next((name for mark, name in JVMS if mark in cmdline), "other JVM")
    found = next((name for mark, name in OTHERS if mark in cmdline), None)
    if found:
        return found
    return "other Python" if program.startswith("python") else f"other ({program})"


def machine_cpu() -> float:
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    busy = sum(int(v) for i, v in enumerate(fields) if i not in (3, 4))  # idle, iowait
    return busy / TICK


class Sampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.done = threading.Event()
        # (pid, start) -> [comm, cmdline, cpu then, cpu now]: a process running before the
        # command started counts only what it spent after
        self.seen: dict[tuple[str, str], list] = {}
        self.sample(baseline=True)

    def sample(self, baseline: bool = False) -> None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
                comm = stat[stat.index("(") + 1 : stat.rindex(")")]
                fields = stat[stat.rindex(")") + 2 :].split()
                cpu = (int(fields[11]) + int(fields[12])) / TICK
                entry = self.seen.get((pid, fields[19]))
                if entry is None or entry[0] != comm:  # new, or exec'd another program
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
                    entry = self.seen.setdefault(
                        (pid, fields[19]), [comm, cmdline, cpu if baseline else 0.0, cpu]
                    )
                    entry[0], entry[1] = comm, cmdline
                entry[3] = cpu
            except (OSError, ValueError, IndexError):
                pass  # ended between the listing and the read

    def run(self) -> None:
        while not self.done.wait(0.5):
            self.sample()


def report(seen: dict, machine: float, wall: float, top: int) -> str:
    by_kind: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for _comm, cmdline, then, now in seen.values():
        if now == then:
            continue
        row = by_kind[kind(cmdline) if cmdline else "kernel"]
        row[0] += now - then
        row[1] += 1
    total = sum(cpu for cpu, _ in by_kind.values())
    lines = [
        f"CPU seconds by process over {wall:.0f} s of wall time: machine {machine:.0f} s "
        f"({machine / wall:.2f} cores busy of {os.cpu_count()}), sampled processes {total:.0f} s"
    ]
    for name, (cpu, n) in sorted(by_kind.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"  {cpu:7.0f} s {100 * cpu / max(total, 1):5.1f} %  {n:5d} processes  {name}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("name the command to run after --")
    began, cpu0 = time.monotonic(), machine_cpu()
    sampler = Sampler()
    sampler.start()
    child = subprocess.Popen(command)
    # Ctrl-C or a CI timeout reaches the command; the report still prints.
    signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    while True:
        try:
            code = child.wait()
            break
        except KeyboardInterrupt:
            child.send_signal(signal.SIGINT)
    sampler.done.set()
    sampler.join()
    sampler.sample()
    print(report(sampler.seen, machine_cpu() - cpu0, time.monotonic() - began, args.top))
    return code


if __name__ == "__main__":
    sys.exit(main())
