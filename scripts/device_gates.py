#!/usr/bin/env python3
"""Machine-code gates of the device kernel, read from compiled CUDA binaries (no GPU).

    scripts/device_gates.py --tools DIR [--markdown FILE] [--model PLANNER] sm_80=LIBKPA sm_90=OBJECT ...

Reads every CUDA instantiation of the attention kernel (PartitionKernel<Kokkos::Cuda, DevicePath<H,
Cache>, ...>) in each binary, with NVIDIA's cuobjdump (DIR holds cuobjdump; the test command
installs it from the Python package index), and fails where a binary holds an attention kernel of
another kind (every CUDA instantiation is gated) and unless each one has:
  - no stack frame, no local memory and no spill instruction (LDL / STL);
  - registers that let at least 8 warps share an SM (65,536 registers, allocated per warp in
    units of 256);
  - a step loop (the innermost loop holding both the cache copies and the arithmetic) that copies
    with asynchronous 16-byte copies (LDGSTS) and waits on them (LDGDEPBAR / DEPBAR);
  - no generic load or store (LD / ST) in that loop: team scratch is read as shared memory (LDS);
  - no team barrier (BAR) in that loop: the team meets once per pass, not per step;
  - on 16-bit float caches, hardware widening (HADD2.F32) and none of the software one (its
    multiplication by 2^112);
  - at most 64 instructions per 8 cache elements in each arithmetic loop of the step (the
    innermost loops with 16-byte shared loads and FFMAs) for up to 4 rows per pass, 110 for 8:
    per 16 bytes of a 16-bit cache. A cache element feeds one FFMA per row, so the loop's
    elements per iteration are its FFMAs / rows. Not applied to E4M3 caches before sm_89, which
    have no conversion instruction for them (their figure is printed);
  - a launch with the functor as a kernel argument (cuda_parallel_launch_local_memory), not
    through constant memory.
It prints one row per instantiation and binary and, with --markdown, writes the table.
"""

import argparse
import collections
import os
import re
import subprocess
import sys

REGISTERS_PER_SM = 65536
MAX_WARPS_PER_SM = 64
MIN_WARPS_PER_SM = 8
SOFTWARE_HALF_WIDENING = "5.1922968585348276285e+33"  # 2^112: to_float(half)'s rebias on hosts

Instruction = collections.namedtuple("Instruction", "address opcode text")


def run(tool, *args):
    return subprocess.run([tool, *args], check=True, capture_output=True, text=True).stdout


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), check=True, capture_output=True, text=True).stdout
    return dict(zip(names, out.splitlines()))


def resource_usage(cuobjdump, path):
    usage, name = {}, None
    for line in run(cuobjdump, "--dump-resource-usage", path).splitlines():
        line = line.strip()
        if line.startswith("Function "):
            name = line[len("Function "):].rstrip(":")
        elif name and line.startswith("REG:"):
            usage[name] = {k: int(v) for k, v in re.findall(r"(\w+):(\d+)", line)}
            name = None
    return usage


def sass_functions(cuobjdump, path):
    functions, current = {}, None
    pattern = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);")
    for line in run(cuobjdump, "-sass", path).splitlines():
        if "Function :" in line:
            current = functions.setdefault(line.split("Function :", 1)[1].strip(), [])
            if current:  # the same function again (another fat binary): keep the first
                current = []
            continue
        match = pattern.search(line)
        if match and current is not None:
            current.append(Instruction(int(match.group(1), 16), match.group(3), match.group(3) + match.group(4)))
    return functions


def loops(code):
    """(first, last) indices of each loop: a branch back to an earlier instruction."""
    index = {ins.address: i for i, ins in enumerate(code)}
    found = []
    for i, ins in enumerate(code):
        if ins.opcode != "BRA":
            continue
        target = re.search(r"0x([0-9a-f]+)", ins.text)
        if target and int(target.group(1), 16) < ins.address and int(target.group(1), 16) in index:
            found.append((index[int(target.group(1), 16)], i))
    return found


def count(code, first, last, predicate):
    return sum(1 for ins in code[first:last + 1] if predicate(ins))


def is_generic_memory(ins):
    return re.fullmatch(r"(LD|ST)(\..*)?", ins.opcode) is not None


def analyse(name, code, usage, rows, cache, arch_number):
    row = {"regs": usage.get("REG", -1), "stack": usage.get("STACK", -1), "local": usage.get("LOCAL", -1)}
    per_warp = -(-row["regs"] * 32 // 256) * 256
    row["warps"] = min(MAX_WARPS_PER_SM, REGISTERS_PER_SM // per_warp) if per_warp > 0 else 0
    row["spills"] = count(code, 0, len(code) - 1, lambda i: i.opcode.startswith(("LDL", "STL")))
    row["local_memory_launch"] = "cuda_parallel_launch_local_memory" in name
    all_loops = loops(code)

    def has(span, prefix):
        return count(code, span[0], span[1], lambda i: i.opcode.startswith(prefix)) > 0

    steps = [span for span in all_loops if has(span, "LDGSTS") and has(span, "FFMA")]
    step = min(steps, key=lambda s: s[1] - s[0]) if steps else None
    row["step_loop"] = step is not None
    if step:
        first, last = step
        row["async_copies"] = count(code, first, last, lambda i: i.opcode.startswith("LDGSTS"))
        row["waits"] = count(code, first, last, lambda i: i.opcode.startswith(("LDGDEPBAR", "DEPBAR")))
        row["generic"] = count(code, first, last, is_generic_memory)
        row["barriers"] = count(code, first, last, lambda i: i.opcode.startswith("BAR"))
        row["hadd2_f32"] = count(code, first, last, lambda i: i.opcode.startswith("HADD2.F32"))
        inner = [s for s in all_loops if first <= s[0] and s[1] <= last and s != step
                 and not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in all_loops)
                 and has(s, "LDS.128") and has(s, "FFMA")]
        ratios = []
        for s in inner:
            ffma = count(code, s[0], s[1], lambda i: i.opcode.startswith("FFMA"))
            ratios.append((s[1] - s[0] + 1) * 8 * rows / ffma)
        row["per_8_elements"] = max(ratios) if ratios else None
    row["software_half"] = sum(SOFTWARE_HALF_WIDENING in ins.text for ins in code)
    budget = 64 if rows <= 4 else 110
    failures, notes = [], []
    if row["stack"] != 0 or row["local"] != 0 or row["spills"] != 0:
        failures.append("stack, local memory or spills")
    if row["warps"] < MIN_WARPS_PER_SM:
        failures.append(f"{row['warps']} warps per SM by registers")
    if not row["local_memory_launch"]:
        failures.append("launched through constant memory")
    if not step:
        failures.append("no step loop with asynchronous copies")
    else:
        if row["waits"] == 0:
            failures.append("no wait on the copies in the step loop")
        if row["generic"]:
            failures.append(f"{row['generic']} generic loads/stores in the step loop")
        if row["barriers"]:
            failures.append(f"{row['barriers']} barriers in the step loop")
        if cache == "half" and (row["hadd2_f32"] == 0 or row["software_half"]):
            failures.append("software half widening")
        if row["per_8_elements"] is None:
            failures.append("no arithmetic loop with 16-byte shared loads")
        elif cache == "fp8_e4m3" and arch_number < 89:
            notes.append("no E4M3 conversion instruction before sm_89: budget not applied")
        elif row["per_8_elements"] > budget:
            failures.append(f"{row['per_8_elements']:.0f} instructions per 8 elements (budget {budget})")
    row["failures"], row["notes"] = failures, notes
    return row


KERNEL = re.compile(r"PartitionKernel<Kokkos::Cuda, kpa::detail::DevicePath<(\d+), (?:kpa::)?(\w+)>, (?:kpa::)?(\w+), "
                    r"(?:kpa::)?(\w+)>")
ANY_KERNEL = re.compile(r"PartitionKernel<Kokkos::Cuda, (kpa::detail::\w+)<")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", required=True, help="folder holding cuobjdump")
    parser.add_argument("--markdown", help="write the table here")
    parser.add_argument("--model", metavar="PLANNER",
                        help="print the bytes-in-flight model of the default suite, with the launch planner's "
                             "plans from PLANNER (scripts/device_gate_plans.cu built against libkpa)")
    parser.add_argument("binaries", nargs="+", help="ARCH=FILE, e.g. sm_90=c_api.o")
    args = parser.parse_args()
    cuobjdump = os.path.join(args.tools, "cuobjdump")
    table, ok = [], True
    for spec in args.binaries:
        arch, path = spec.split("=", 1)
        usage = resource_usage(cuobjdump, path)
        functions = sass_functions(cuobjdump, path)
        names = demangle(list(functions))
        found = 0
        for mangled, code in functions.items():
            match = KERNEL.search(names[mangled])
            if not match:
                other = ANY_KERNEL.search(names[mangled])
                if other:
                    print(f"{arch}: {path} holds an attention kernel on {other.group(1)}, which no gate reads",
                          file=sys.stderr)
                    ok = False
                continue
            found += 1
            rows, cache, out, tmp = int(match.group(1)), match.group(2), match.group(3), match.group(4)
            row = analyse(names[mangled], code, usage.get(mangled, {}), rows, cache, int(arch.split("_")[-1]))
            row.update(arch=arch, rows=rows, cache=cache, out=out, tmp=tmp)
            table.append(row)
            ok = ok and not row["failures"]
        if found == 0:
            print(f"{arch}: no device-path attention kernel in {path}", file=sys.stderr)
            ok = False
    header = ("| arch | rows | cache | out | regs | warps/SM | stack+spills | async copies / waits in step loop "
              "| generic ld/st | barriers | HADD2.F32 | instr / 8 elements | gates |")
    lines = [header, "|" + "---|" * 13]
    for r in sorted(table, key=lambda r: (r["arch"], r["rows"], r["cache"], r["out"], r["tmp"])):
        per = f"{r['per_8_elements']:.0f}" if r.get("per_8_elements") else "-"
        lines.append(f"| {r['arch']} | {r['rows']} | {r['cache']} | {r['out']}/{r['tmp']} | {r['regs']} | {r['warps']} "
                     f"| {r['stack'] + r['local'] + r['spills']} | {r.get('async_copies', 0)} / {r.get('waits', 0)} "
                     f"| {r.get('generic', '-')} | {r.get('barriers', '-')} | {r.get('hadd2_f32', '-')} | {per} "
                     f"| {verdict(r)} |")
    print("\n".join(lines))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
    print(f"{len(table)} instantiations, {sum(1 for r in table if r['failures'])} failing", file=sys.stderr)
    if args.model:
        model_lines = model(table, args.model)
        print("\n".join(model_lines))
        if args.markdown:
            with open(args.markdown, "a") as f:
                f.write("\n" + "\n".join(model_lines) + "\n")
    return 0 if ok and table else 1


def verdict(row):
    if row["failures"]:
        return "FAIL: " + "; ".join(row["failures"])
    return "; ".join(["pass"] + row["notes"])


# The bytes-in-flight model. GPUs: SMs, shared memory per SM (bytes a kernel may use), issue
# clock (GHz), HBM peak and a read probe's bandwidth (bytes/s), loaded latency (s).
GPUS = {
    "H200": dict(arch="sm_90", sms=132, smem=227 * 1024, ghz=1.98, peak=4.8e12, probe=3.6e12, latency=0.7e-6),
    "A100": dict(arch="sm_80", sms=108, smem=163 * 1024, ghz=1.41, peak=2.0e12, probe=1.7e12, latency=0.7e-6),
}
# The default suite's f16 and fp8 rows (its bf16 rows move the same bytes): (name, sequences, tokens,
# query heads, kv heads, head size, block size, cache type, element bytes).
SUITE = [
    ("llama_32x4096", 32, 4096, 32, 8, 128, 16, "half", 2),
    ("long_context_1x100k", 1, 100000, 24, 4, 256, 16, "half", 2),
    ("single_tile_64x512", 64, 512, 32, 8, 128, 16, "half", 2),
    ("llama_32x4096_fp8", 32, 4096, 32, 8, 128, 16, "fp8_e4m3", 1),
]
KOKKOS_TEAM_SHARED = 1024  # Kokkos' own shared memory per team (its reduce buffer) and the driver's


def device_plan(planner, gpu, g, workload):
    """The launch planner's device-path plan for a workload, asked of libkpa through PLANNER
    (scripts/device_gate_plans.cu): (rows per pass, step tokens, warps, team scratch bytes), or
    None where the planner picks another path."""
    _, seqs, tokens, heads, kv_heads, head, block, _, elem = workload
    out = run(planner, f"{gpu}:{g['sms']}:1:1", *(str(v) for v in (seqs, tokens, heads, kv_heads, head, block, elem)))
    path, rows, step, warps, scratch = out.split()
    return None if path != "device" else (int(rows), int(step), int(warps), int(scratch))


def model(table, planner):
    lines = ["| GPU | workload | step tokens x warps | team scratch | regs | teams/SM | in flight/SM | "
             "bound | predicted | % of probe |", "|" + "---|" * 10]
    for gpu, g in GPUS.items():
        for workload in SUITE:
            name, seqs, tokens, heads, kv_heads, head, _, cache, elem = workload
            group = heads // kv_heads
            plan = device_plan(planner, gpu, g, workload)
            if plan is None:
                continue
            rows, step, warps, scratch = plan
            row = next((r for r in table if r["arch"] == g["arch"] and r["rows"] == rows and r["cache"] == cache), None)
            if row is None:
                continue
            per_warp_regs = -(-row["regs"] * 32 // 256) * 256
            teams = min(g["smem"] // (scratch + KOKKOS_TEAM_SHARED), 65536 // (per_warp_regs * warps), 64 // warps, 32)
            stage = step * head * elem * 2
            in_flight = teams * warps * stage  # each warp's next step is in flight while it computes one
            kv_bytes = seqs * tokens * kv_heads * head * elem * 2
            passes = -(-group // rows)
            bandwidth = min(g["probe"], in_flight * g["sms"] / g["latency"])
            memory_s = kv_bytes * passes / bandwidth
            elements = seqs * tokens * kv_heads * head * 2 * passes
            issue_s = elements / 8 * (row.get("per_8_elements") or 0) / 32 / (g["sms"] * 4 * g["ghz"] * 1e9)
            predicted = max(memory_s, issue_s)
            lines.append(f"| {gpu} | {name} | {step} x {warps} | {scratch / 1024:.1f} KiB | {row['regs']} | {teams} "
                         f"| {in_flight / 1024:.0f} KiB | {'memory' if memory_s >= issue_s else 'issue'} "
                         f"| {predicted * 1e6:.0f} us | {kv_bytes / predicted / g['probe'] * 100:.0f}% |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
