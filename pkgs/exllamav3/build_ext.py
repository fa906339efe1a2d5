"""Compile ExLlamaV3's bundled CUDA sources into `exllamav3_ext` ahead of time.

Usage: build_ext.py SOURCES_DIR SITE_PACKAGES. Same sources and flags as the package's own JIT path
(every .c/.cpp/.cu below SOURCES_DIR), so the prebuilt module behaves like the JIT-built one.
"""

import os
import sys

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

sources_dir, site_packages = sys.argv[1], sys.argv[2]
sources = sorted(
    os.path.join(root, name)
    for root, _, names in os.walk(sources_dir)
    for name in names
    if name.endswith((".c", ".cpp", ".cu"))
)
sys.argv = [sys.argv[0], "build_ext", "--build-lib", site_packages]
setup(
    name="exllamav3_ext",
    ext_modules=[
        CUDAExtension(
            "exllamav3_ext",
            sources,
            include_dirs=[sources_dir],
            extra_compile_args={
                "cxx": ["-Ofast"],
                "nvcc": ["-lineinfo", "-O3", "--use_fast_math", "-Xcudafe", "--diag_suppress=177",
                         "-Xcudafe", "--diag_suppress=20012"],
            },
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
