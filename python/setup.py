"""Builds kpa's PyTorch operators (kpa/_torch_ops) against the installed torch and a kpa library.

The kpa library comes from KPA_PREFIX (an installed kpa: include/kpa/kpa.h and lib/libkpa.so)
or, when that is not set, is built with CMake from the source tree around this folder (Kokkos
from Kokkos_ROOT, or the tree's .deps/install made by scripts/bootstrap-deps.sh). Its libkpa.so
is copied into the package, which finds it next to itself from any install location.

A CUDA build of kpa (a libkpa.so that needs the CUDA runtime) gives a CUDA extension: it runs
CUDA tensors on torch's current stream, needs a CUDA build of torch of the same CUDA major
version and the CUDA Toolkit's headers (CUDA_HOME, or nvcc on PATH), and runs CPU tensors on a
second, host-only libkpa that carries its own Kokkos (built with -DKPA_SELF_CONTAINED=ON against
a static Kokkos: scripts/build.sh --self-contained), from KPA_HOST_PREFIX, copied into kpa/host/.
So CPU tensors run whether or not the machine has a GPU or its driver.

    pip install --no-build-isolation ./python                 # torch from the environment
    KPA_PREFIX=/opt/kpa pip install --no-build-isolation ./python
    KPA_PREFIX=/opt/kpa-cuda KPA_HOST_PREFIX=/opt/kpa-host pip install --no-build-isolation ./python
"""

import glob
import os
import shutil
import subprocess
from pathlib import Path

import torch
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

HERE = Path(__file__).resolve().parent
SOURCE_TREE = HERE.parent


def run(*command):
    print("+", " ".join(str(c) for c in command), flush=True)
    subprocess.run([str(c) for c in command], check=True)


def built_kpa_prefix():
    """Configures, builds and installs the library alone from the source tree."""
    if not (SOURCE_TREE / "CMakeLists.txt").is_file() or not (SOURCE_TREE / "include" / "kpa" / "kpa.h").is_file():
        raise SystemExit("kpa: set KPA_PREFIX to an installed kpa (no kpa source tree around " + str(HERE) + ")")
    build, prefix = HERE / "build" / "kpa-cmake", HERE / "build" / "kpa-prefix"
    kokkos = os.environ.get("Kokkos_ROOT") or os.environ.get("KOKKOS_ROOT")
    if not kokkos and (SOURCE_TREE / ".deps" / "install").is_dir():
        kokkos = str(SOURCE_TREE / ".deps" / "install")
    if not kokkos:
        raise SystemExit("kpa: no Kokkos found: set Kokkos_ROOT, or run scripts/bootstrap-deps.sh in " + str(SOURCE_TREE))
    run("cmake", "-S", SOURCE_TREE, "-B", build, "-DCMAKE_BUILD_TYPE=Release", f"-DKokkos_ROOT={kokkos}",
        "-DKPA_ENABLE_TESTS=OFF", "-DKPA_ENABLE_BENCHMARKS=OFF", "-DKPA_ENABLE_EXAMPLES=OFF")
    run("cmake", "--build", build, "--target", "kpa", "-j", str(os.cpu_count() or 1))
    run("cmake", "--install", build, "--prefix", prefix)
    return prefix


def installed_prefix(variable):
    prefix = Path(os.environ[variable]).resolve()
    if not (prefix / "include" / "kpa" / "kpa.h").is_file():
        raise SystemExit(f"kpa: {variable}={prefix} has no include/kpa/kpa.h")
    return prefix


def kpa_prefix():
    return installed_prefix("KPA_PREFIX") if os.environ.get("KPA_PREFIX") else built_kpa_prefix()


def library_dir(prefix):
    for libdir in ("lib", "lib64", "lib/x86_64-linux-gnu"):
        if glob.glob(str(prefix / libdir / "libkpa.so.*")):
            return prefix / libdir
    raise SystemExit(f"kpa: no libkpa.so.* under {prefix}")


prefix = kpa_prefix()


def dynamic_section(lib, tag):
    dynamic = subprocess.run(["objdump", "-p", lib], check=True, capture_output=True, text=True).stdout
    return [line.split()[1] for line in dynamic.splitlines() if line.strip().startswith(tag + " ")]


def library_file(prefix):
    """The real file of a prefix's libkpa.so.* (its symbolic links left out)."""
    files = [lib for lib in glob.glob(str(library_dir(prefix) / "libkpa.so.*")) if not os.path.islink(lib)]
    if not files:
        raise SystemExit(f"kpa: no libkpa.so.* under {prefix}")
    return files[0]


library = library_file(prefix)
# A CUDA build of kpa links the CUDA runtime; its operators then take CUDA tensors too.
cuda_kpa = any(name.startswith("libcudart") for name in dynamic_section(library, "NEEDED"))
if cuda_kpa and torch.version.cuda is None:
    raise SystemExit(f"kpa: {library} is a CUDA build of kpa; it needs a CUDA build of torch "
                     f"(this torch {torch.__version__} has no CUDA)")

if cuda_kpa:
    if not os.environ.get("KPA_HOST_PREFIX"):
        raise SystemExit("kpa: a CUDA build of kpa runs CPU tensors on a host libkpa that carries its own Kokkos: set "
                         "KPA_HOST_PREFIX to an installed kpa built with -DKPA_SELF_CONTAINED=ON against a static "
                         "Kokkos (scripts/build.sh --self-contained, then cmake --install)")
    host_library = library_file(installed_prefix("KPA_HOST_PREFIX"))
    needed = dynamic_section(host_library, "NEEDED")
    if any(name.startswith(("libkokkos", "libcudart")) for name in needed):
        raise SystemExit(f"kpa: {host_library} (KPA_HOST_PREFIX) needs {', '.join(needed)}: it must be a host "
                         "build of kpa with -DKPA_SELF_CONTAINED=ON, which carries its own Kokkos")


def copy_library(file, folder):
    """The library, as folder/libkpa.so: the extension loads it by that path at run time
    (csrc/torch_ops.cpp), so no soname or run path is involved."""
    folder.mkdir(exist_ok=True)
    for old in glob.glob(str(folder / "libkpa.so*")):
        os.remove(old)
    # A fresh modification time: setuptools' build folder keeps a copy it thinks newer otherwise.
    shutil.copy(file, folder / "libkpa.so")


copy_library(library, HERE / "kpa")
if cuda_kpa:
    copy_library(host_library, HERE / "kpa" / "host")
else:
    shutil.rmtree(HERE / "kpa" / "host", ignore_errors=True)

# torch 2's headers pick their own C++ standard (C++17 or later); torch 1.x's default is C++14.
flags = ["-O2", "-Wall"] + (["-std=c++17"] if int(torch.__version__.split(".")[0]) < 2 else [])
Extension = CUDAExtension if cuda_kpa else CppExtension
setup(
    ext_modules=[
        Extension(
            "kpa._torch_ops",
            ["csrc/torch_ops.cpp"],
            include_dirs=[str(prefix / "include")],
            libraries=["dl"],
            define_macros=[("KPA_TORCH_CUDA", "1")] if cuda_kpa else [],
            extra_compile_args={"cxx": flags} if cuda_kpa else flags,
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
