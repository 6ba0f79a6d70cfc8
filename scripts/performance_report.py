#!/usr/bin/env python3
"""kpa's performance report: measurements kept with the machine, command and commit that made them
(docs/measurements/*.json), and docs/performance.md written from them alone.

    scripts/performance_report.py bench [KPA_BENCH_ARGS...]
        runs kpa-bench (KPA_BENCH, default build/perf_tests/kpa-bench; no arguments: its default
        suite) with --json, keeps its records as docs/measurements/bench-DATE-MACHINE.json, and
        writes the report
    scripts/performance_report.py gates [GATES_MD]
        keeps the machine-code gates' table and model (default build-cuda/device-gates/gates.md,
        written by scripts/device-gates.sh) as docs/measurements/device-gates.json, and writes
        the report
    scripts/performance_report.py vllm [SIDE_BY_SIDE_ARGS...]
        runs python/benchmarks/vllm_cpu_side_by_side.py (KPA_VLLM_PYTHON, default
        .deps/vllm-0.32.0/bin/python: scripts/vllm.sh installs it), kpa and vLLM's own CPU kernels
        on the same decode steps, prefill chunks and cache writes, and keeps its tables as
        docs/measurements/vllm-DATE-MACHINE.json
    scripts/performance_report.py throughput [THROUGHPUT_ARGS...]
        runs python/benchmarks/vllm_throughput.py in the same environment: vLLM end to end with its
        own CPU attention backend and with kpa's (a prefill-heavy and a decode-heavy run), and
        keeps its table as docs/measurements/throughput-DATE-MACHINE.json
    scripts/performance_report.py render
        writes docs/performance.md from docs/measurements/ (nothing is measured)

A new measurement is a new file in docs/measurements/ and a regenerated report; the README links
the report and quotes no figure of it.
"""

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MEASUREMENTS = REPO / "docs" / "measurements"
REPORT = REPO / "docs" / "performance.md"


def git(*args):
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout.strip()


def commit():
    """The commit measured, marked when the working tree differs from it (outside docs/, which
    this script writes)."""
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs")
    return git("rev-parse", "--short", "HEAD") + ("+changes" if dirty else "")


def cpu_machine():
    """The CPU's model name, its core count and the widest vector instructions it has."""
    model, flags = "unknown CPU", set()
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    sets = [name for name, flag in (("AMX-BF16", "amx_bf16"), ("AVX-512 BF16", "avx512_bf16"),
                                    ("AVX-512 VBMI", "avx512vbmi"), ("AVX-512", "avx512f"), ("AVX2", "avx2"))
            if flag in flags]
    return f"{model}, {os.cpu_count()} cores, {', '.join(sets) if sets else 'no AVX2'}"


def gpu_machine():
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], check=True,
                               capture_output=True, text=True).stdout.split("\n")
        return names[0].strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def slug(text):
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:48]


def keep(kind, machine, command, payload):
    now = datetime.datetime.now(datetime.timezone.utc)
    entry = {"kind": kind, "machine": machine, "command": command, "commit": commit(),
             "date": now.strftime("%Y-%m-%d %H:%M UTC"), **payload}
    MEASUREMENTS.mkdir(parents=True, exist_ok=True)
    name = "device-gates.json" if kind == "gates" else f"{kind}-{now:%Y%m%d-%H%M}-{slug(machine)}.json"
    run = 2
    while kind != "gates" and (MEASUREMENTS / name).exists():  # another run in the same minute
        name = f"{kind}-{now:%Y%m%d-%H%M}-{slug(machine)}-{run}.json"
        run += 1
    (MEASUREMENTS / name).write_text(json.dumps(entry, indent=1) + "\n")
    print(f"kept {MEASUREMENTS.relative_to(REPO) / name}")


def record_bench(args):
    bench = os.environ.get("KPA_BENCH", str(REPO / "build" / "perf_tests" / "kpa-bench"))
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "records.json"
        subprocess.run([bench, *args, "--json", str(out)], check=True)
        records = json.loads(out.read_text())
    on_gpu = any(r.get("execution_space") == "Cuda" for r in records)
    machine = (gpu_machine() if on_gpu else None) or cpu_machine()
    environment = " ".join(f"{v}={os.environ[v]}" for v in ("OMP_NUM_THREADS", "OMP_PROC_BIND") if v in os.environ)
    command = " ".join(filter(None, [environment, shlex.join([os.path.relpath(bench, REPO), *args])]))
    keep("bench", machine, command, {"records": records})


def record_vllm(kind, script_name, args):
    """Runs one of the benchmarks beside vLLM (vLLM's environment: KPA_VLLM_PYTHON) and keeps its output."""
    python = os.environ.get("KPA_VLLM_PYTHON", str(REPO / ".deps" / "vllm-0.32.0" / "bin" / "python"))
    script = REPO / "python" / "benchmarks" / script_name
    out = subprocess.run([python, str(script), *args], check=True, stdout=subprocess.PIPE, text=True).stdout
    print(out, end="")
    environment = " ".join(f"{v}={os.environ[v]}" for v in ("OMP_NUM_THREADS", "VLLM_CPU_KVCACHE_SPACE")
                           if v in os.environ)
    command = " ".join(filter(None, [environment, shlex.join([os.path.relpath(python, REPO),
                                                              os.path.relpath(script, REPO), *args])]))
    keep(kind, cpu_machine(), command, {"output": out})


def record_gates(path):
    text = Path(path).read_text()
    if not text.startswith("| arch | rows |"):
        sys.exit(f"{path} is not the gates' markdown (scripts/device-gates.sh writes it)")
    build = Path(path).resolve().parent.parent
    keep("gates", f"no GPU: machine code read by cuobjdump; {cuda_build(build)}",
         f"scripts/device-gates.sh {build.name}/libkpa.so", {"markdown": text})


def cuda_build(build):
    """The Kokkos and nvcc a CUDA build directory was configured with."""
    kokkos, nvcc = "Kokkos unknown", "nvcc unknown"
    cache = build / "CMakeCache.txt"
    if cache.exists():
        values = dict(re.findall(r"^(Kokkos_DIR|CMAKE_CUDA_COMPILER):\w+=(.*)$", cache.read_text(), re.M))
        version = Path(values.get("Kokkos_DIR", "")) / "KokkosConfigVersion.cmake"
        if version.exists():
            found = re.search(r'set\(PACKAGE_VERSION "([^"]+)"\)', version.read_text())
            kokkos = f"Kokkos {found.group(1)}" if found else kokkos
        try:
            out = subprocess.run([values.get("CMAKE_CUDA_COMPILER", "nvcc"), "--version"], capture_output=True,
                                 text=True).stdout
            found = re.search(r"release ([0-9.]+)", out)
            nvcc = f"nvcc {found.group(1)}" if found else nvcc
        except OSError:
            pass
    return f"{kokkos}, {nvcc}"


def percent(value):
    return "-" if value is None else f"{value:.1f}"


def workload(r):
    cache = r["kv_cache_dtype"] if r["kv_cache_dtype"] != "auto" else r["dtype"]
    return (f"{r['name']} ({r['batch_size']} x {r['seq_len']}, {r['num_query_heads']}/{r['num_kv_heads']} heads, "
            f"d{r['head_size']}, {cache} cache, blocks of {r['block_size']})")


def bench_section(entry):
    records = entry["records"]
    first = records[0] if records else {}
    lines = [f"### {entry['machine']}", "",
             f"{entry['date']}, commit `{entry['commit']}`, kpa {first.get('kpa_version', '?')} on "
             f"Kokkos::{first.get('execution_space', '?')}:", "", "```sh", entry["command"], "```", ""]
    if first.get("machine_read_gbps"):
        amx = f", AMX {first['machine_amx_gflops']:.0f} GFLOP/s" if first.get("machine_amx_gflops") else ""
        lines += [f"Limits measured in the same run: read {first['machine_read_gbps']:.1f} GB/s, FMA "
                  f"{first['machine_fma_gflops']:.0f} GFLOP/s ({first.get('machine_probes', '?')} probes){amx}. "
                  "The roofline's compute limit is that of the instructions doing the multiply-adds "
                  "(AMX for prefill rows on the AMX level, FMA otherwise).", ""]
    lines += ["| workload | median | % of read bandwidth | % of the paged read | % of roofline (limit) | plan |",
              "|---|---|---|---|---|---|"]
    for r in records:
        median = r["median_us"]
        time = f"{median / 1000:.2f} ms" if median >= 1000 else f"{median:.0f} us"
        limit = f" ({r['compute_limit']})" if r.get("compute_limit") else ""
        lines.append(f"| {workload(r)} | {time} | {percent(r.get('bandwidth_pct'))} | {percent(r.get('paged_pct'))} | "
                     f"{percent(r.get('roofline_pct'))}{limit} | `{r.get('plan', '')}` |")
    return lines + [""]


def output_section(entry):
    return [f"### {entry['machine']}", "", f"{entry['date']}, commit `{entry['commit']}`:", "", "```sh",
            entry["command"], "```", "", entry["output"].rstrip(), ""]


def gates_section(entry):
    table, _, model = entry["markdown"].partition("\n\n")
    rows = [line for line in table.splitlines() if line.startswith("| sm_")]
    failing = sum(1 for line in rows if not line.rstrip(" |").split("|")[-1].strip().startswith("pass"))
    lines = [f"{entry['date']}, commit `{entry['commit']}` ({entry['machine']}):", "", "```sh", entry["command"], "```",
             "", f"{len(rows)} instantiations, {failing} failing.", "", table.rstrip(), ""]
    if model.strip():
        lines += ["The bytes-in-flight model's prediction for the default suite (a model, not a measurement; its",
                  "plans come from the launch planner):", "", model.rstrip(), ""]
    return lines


def render():
    entries = [json.loads(p.read_text()) for p in sorted(MEASUREMENTS.glob("*.json"))]
    benches = sorted((e for e in entries if e["kind"] == "bench"), key=lambda e: e["date"], reverse=True)
    gates = [e for e in entries if e["kind"] == "gates"]
    side_by_side = sorted((e for e in entries if e["kind"] == "vllm"), key=lambda e: e["date"], reverse=True)
    end_to_end = sorted((e for e in entries if e["kind"] == "throughput"), key=lambda e: e["date"], reverse=True)
    lines = ["# kpa performance", "",
             "Generated by `scripts/performance_report.py render` from `docs/measurements/`; do not edit. Each",
             "run is one invocation on one machine (machines are shared, so compare within a table);",
             "`scripts/performance_report.py bench` adds one. Columns as `kpa-bench --help` defines them:",
             "% of read bandwidth = K/V bytes per second / the read bandwidth measured in the same run;",
             "% of the paged read = against a plain loop reading the same blocks in the same order;",
             "% of roofline = the larger of bytes / bandwidth and FLOP / the throughput of what does the",
             "multiply-adds (AMX tiles or FMA, named in the column where the run records it), / the time.", ""]
    sections = [
        ("## kpa-bench", [], benches, bench_section),
        ("## kpa and vLLM's own CPU kernels",
         ["`python/benchmarks/vllm_cpu_side_by_side.py`: the same steps (each checked against float64 first)",
          "and cache writes through both kernels in one process; ratio = vLLM time / kpa time (above 1: kpa",
          "is faster)."],
         side_by_side, output_section),
        ("## vLLM end to end, with its own CPU attention and with kpa's",
         ["`python/benchmarks/vllm_throughput.py`: seconds of vLLM's generate call with each backend, each in",
          "a fresh process, alternating which goes first; kpa / vLLM throughput above 1: kpa is faster."],
         end_to_end, output_section),
        ("## Machine-code gates of the device kernel",
         ["Every CUDA instantiation of the attention kernel, read from the CUDA build's machine code",
          "(see the README's CUDA section for what each gate requires)."],
         gates, gates_section),
    ]
    for title, preamble, kept, section in sections:
        lines += [title, ""] + (preamble + [""] if preamble else [])
        for entry in kept:
            lines += section(entry)
        if not kept:
            lines += ["No run kept yet.", ""]
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text("\n".join(lines).rstrip() + "\n")
    print(f"wrote {REPORT.relative_to(REPO)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("bench", help="run kpa-bench and keep its records (any further arguments are kpa-bench's)")
    sub.add_parser("gates", help="keep the gates' table").add_argument(
        "path", nargs="?", default=str(REPO / "build-cuda" / "device-gates" / "gates.md"))
    sub.add_parser("vllm", help="run the side-by-side with vLLM's CPU attention and keep its tables (any further "
                                "arguments are the script's)")
    sub.add_parser("throughput", help="run vLLM end to end with either backend and keep the table (any further "
                                      "arguments are the script's)")
    sub.add_parser("render", help="write docs/performance.md")
    options, bench_args = parser.parse_known_args()
    if bench_args and options.action not in ("bench", "vllm", "throughput"):
        parser.error(f"unrecognized arguments: {' '.join(bench_args)}")
    if options.action == "bench":
        record_bench(bench_args)
    elif options.action == "vllm":
        record_vllm("vllm", "vllm_cpu_side_by_side.py", bench_args)
    elif options.action == "throughput":
        record_vllm("throughput", "vllm_throughput.py", bench_args)
    elif options.action == "gates":
        record_gates(options.path)
    render()


if __name__ == "__main__":
    main()
