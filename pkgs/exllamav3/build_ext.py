"""Compile ExLlamaV3's bundled CUDA sources into `exllamav3_ext` ahead of time.

Usage: build_ext.py SOURCES_DIR SITE_PACKAGES

Same sources and flags as the package's own JIT path in exllamav3/ext.py, so the prebuilt module behaves like
the JIT-built one. 1.4.6 selects every .c/.cpp/.cu below SOURCES_DIR with the flags copied below. Later releases
(1.6.x) ship that rule as exllamav3/util/cuda_flags.py (standard library only; their setup.py loads it by path):
when SOURCES_DIR's package has it, its `extension_sources` and `cuda_cflags` are used instead, which leaves out
their ROCm-only sources (rocm/) on a CUDA build.
The module lands at SITE_PACKAGES/exllamav3_ext.<abi>.so: ext.py looks up the top-level module
`exllamav3_ext` first and imports it instead of compiling.

Environment: TORCH_CUDA_ARCH_LIST (required: a build machine has no GPU to guess from, and torch's
fallback would compile for every architecture it knows), CUDA_HOME, MAX_JOBS (parallel compiles),
NVCC_THREADS (optional, nvcc --threads: compiles a unit's architectures in parallel; no effect on code).
Debug builds only (unset = the default, identical flags): EXL3_EXTRA_CXXFLAGS, EXL3_EXTRA_NVCCFLAGS and
EXL3_EXTRA_LDFLAGS, shell-split and appended to the host-compiler, nvcc and link flags, e.g.
EXL3_EXTRA_CXXFLAGS="-g -fno-ipa-icf" EXL3_EXTRA_NVCCFLAGS="-g -Xcompiler=-g,-fno-ipa-icf"
EXL3_EXTRA_LDFLAGS="-Wl,-Map,ext.map" (symbols, no identical-code folding, a link map).
Intermediate objects go to ./build (setuptools' default) in the working directory.
"""

import glob
import importlib.util
import os
import shlex
import sys

from setuptools import setup

# EXL3_EXTENSION_NAME builds another source tree the same way (glm53_expert_cache: pkgs/exllamav3/expert-cache).
EXTENSION_NAME = os.environ.get("EXL3_EXTENSION_NAME", "exllamav3_ext")

# exllamav3/ext.py 1.4.6, non-Windows branch, with verbose and ext_debug off.
CXX_FLAGS = ["-Ofast"]
NVCC_FLAGS = [
    "-lineinfo",
    "-O3",
    "--use_fast_math",
    "-Xcudafe",
    "--diag_suppress=177",
    "-Xcudafe",
    "--diag_suppress=20012",
]


def main(argv):
    if len(argv) != 3:
        sys.exit(f"usage: {argv[0]} SOURCES_DIR SITE_PACKAGES")
    sources_dir, site_packages = (os.path.abspath(path) for path in argv[1:])
    if not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        sys.exit("build_ext.py: set TORCH_CUDA_ARCH_LIST (e.g. '8.6;9.0'); there is no GPU to read it from")
    # torch is imported here, not at the top, so that the source rules below can be read without it
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension

    release_rules = _release_rules(sources_dir)
    if release_rules is not None:
        sources = release_rules.extension_sources(sources_dir, hip=False)
        nvcc_flags = list(release_rules.cuda_cflags(cuda_home=CUDA_HOME))
        print(f"build_ext.py: sources and nvcc flags from {release_rules.__file__}", flush=True)
    else:
        sources = sorted(
            os.path.join(root, name)
            for root, _, names in os.walk(sources_dir)
            for name in names
            if name.endswith((".c", ".cpp", ".cu"))
        )
        nvcc_flags = list(NVCC_FLAGS)
    if not sources:
        sys.exit(f"build_ext.py: no .c/.cpp/.cu sources below {sources_dir}")

    if cuda_host_cxx := os.environ.get("CUDAHOSTCXX"):
        nvcc_flags += ["-ccbin", cuda_host_cxx]  # as ext.py does
    threads = os.environ.get("NVCC_THREADS", "")
    if threads not in ("", "1"):
        nvcc_flags += [f"--threads={int(threads)}"]

    cxx_flags = list(CXX_FLAGS) + shlex.split(os.environ.get("EXL3_EXTRA_CXXFLAGS", ""))
    nvcc_flags += shlex.split(os.environ.get("EXL3_EXTRA_NVCCFLAGS", ""))
    link_flags = shlex.split(os.environ.get("EXL3_EXTRA_LDFLAGS", ""))
    if cxx_flags != CXX_FLAGS or link_flags or os.environ.get("EXL3_EXTRA_NVCCFLAGS", "").strip():
        print(f"build_ext.py: extra flags: cxx {cxx_flags}, nvcc {nvcc_flags}, link {link_flags}", flush=True)

    print(
        f"build_ext.py: {len(sources)} sources, TORCH_CUDA_ARCH_LIST={os.environ['TORCH_CUDA_ARCH_LIST']}, "
        f"MAX_JOBS={os.environ.get('MAX_JOBS', '(torch default)')}",
        flush=True,
    )
    setup(
        name=EXTENSION_NAME,
        # Nothing but the extension: no package discovery in the working directory.
        packages=[],
        py_modules=[],
        ext_modules=[
            CUDAExtension(
                EXTENSION_NAME,
                sources,
                include_dirs=[sources_dir],
                extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
                extra_link_args=link_flags,
            )
        ],
        cmdclass={"build_ext": BuildExtension},
        script_args=["build_ext", "--build-lib", site_packages],
    )
    built = glob.glob(os.path.join(site_packages, EXTENSION_NAME + ".*"))
    if len(built) != 1:
        sys.exit(f"build_ext.py: expected one {EXTENSION_NAME} module in {site_packages}, found {built}")
    print(f"build_ext.py: built {built[0]} ({os.path.getsize(built[0])} bytes)", flush=True)


def _release_rules(sources_dir):
    """The release's own cuda_flags module (SOURCES_DIR/../util/cuda_flags.py), loaded by path as its setup.py
    does, or None for a release without one (1.4.6)."""
    path = os.path.join(os.path.dirname(sources_dir), "util", "cuda_flags.py")
    if not os.path.isfile(path):
        return None
    spec = importlib.util.spec_from_file_location("exllamav3_release_cuda_flags", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    main(sys.argv)
