#!/usr/bin/env python3
"""Checks that binaries hold CUDA device code for an architecture.

    scripts/check_device_code.py --arch 80 [--no-constant-memory-launch] FILE...

Reads each file's .nv_fatbin section (extracted with objcopy: this machine kind has no cuobjdump)
and walks its fat binaries: a 16-byte header (magic 0xBA55ED50, header size, size of the
entries), then entries of (kind: 1 PTX, 2 ELF; entry header size; payload size; ...; arch at
byte 28). Exits 1 unless every file holds machine code (ELF) for sm_ARCH; prints what each holds.

--no-constant-memory-launch also reads each file's symbols (nm): Kokkos names the host stub of
every CUDA kernel after its launch mechanism, and no kpa functor may be launched through constant
memory (the host waits for the previous such launch, and a CUDA graph cannot capture it); each
file must hold some kpa kernel launched with its functor as a kernel argument (local memory).
"""

import argparse
import collections
import os
import struct
import subprocess
import sys
import tempfile

FATBIN_MAGIC = 0xBA55ED50
KINDS = {1: "PTX", 2: "ELF"}


def fatbin_section(path):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "fatbin")
        subprocess.run(["objcopy", "-O", "binary", "--only-section=.nv_fatbin", path, out], check=True)
        with open(out, "rb") as f:
            return f.read()


def entries(data):
    """(kind, arch) of every entry of every fat binary in `data`."""
    found = []
    offset = 0
    while offset + 16 <= len(data):
        magic, _version, header_size, size = struct.unpack_from("<IHHQ", data, offset)
        if magic != FATBIN_MAGIC:
            offset += 8  # fat binaries are 8-byte aligned in the section
            continue
        entry = offset + header_size
        end = entry + size
        while entry + 32 <= end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            (arch,) = struct.unpack_from("<I", data, entry + 28)
            found.append((KINDS.get(kind, f"kind{kind}"), arch))
            if entry_header == 0:
                break
            entry += entry_header + payload
        offset = max(end, offset + 16)
    return found


def kpa_launches(path):
    """How many kpa functors the file launches through constant memory and as kernel arguments."""
    symbols = subprocess.run(["nm", "-C", path], check=True, capture_output=True, text=True).stdout.splitlines()
    kpa = [line for line in symbols if "kpa::" in line]
    return (sum("cuda_parallel_launch_constant_memory<" in line for line in kpa),
            sum("cuda_parallel_launch_local_memory<" in line for line in kpa))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, required=True, help="SM version, e.g. 80 for sm_80")
    parser.add_argument("--no-constant-memory-launch", action="store_true",
                        help="fail on a kpa kernel launched through constant memory")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    ok = True
    for path in args.files:
        if args.no_constant_memory_launch:
            constant, local = kpa_launches(path)
            print(f"{os.path.basename(path)}: kpa kernels launched through constant memory: {constant}, "
                  f"as kernel arguments: {local}")
            ok = ok and constant == 0 and local > 0
        found = entries(fatbin_section(path))
        counts = collections.Counter(found)
        summary = ", ".join(f"{kind} sm_{arch} x{n}" for (kind, arch), n in sorted(counts.items())) or "none"
        has_machine_code = counts[("ELF", args.arch)] > 0
        print(f"{os.path.basename(path)}: device code {summary}{'' if has_machine_code else '  <- no ELF for sm_%d' % args.arch}")
        ok = ok and has_machine_code
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
