"""Build the native parts of stackd.

* The package: the folder `server/` installs as the package `stackd` (package_dir), so an
  install never puts a top-level `server` into site-packages.
* Cython: the HTTP hot path (`server/http/protocol.py`, `wire.py`, `request.py`) is written in
  Cython's pure-Python mode and compiled here. The same source, uncompiled, is its Python twin:
  the protocol test suite runs against both. Production refuses to start on the uncompiled twin.
* C++ (pybind11): `CMakeLists.txt` builds the modules under `native/`; setup.py drives CMake.

A module that fails to build fails the build: there is no silent fallback.
"""
from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
import sysconfig

from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

PACKAGE, SOURCE_DIR = "stackd", "server"
# The module list lives in server/compiled.py, which also enforces it at start-up.
_COMPILED = runpy.run_path(os.path.join(SOURCE_DIR, "compiled.py"))
COMPILED_MODULES, CYTHON_DIRECTIVES = _COMPILED["COMPILED_MODULES"], _COMPILED["CYTHON_DIRECTIVES"]
KERNELS_LIBRARY = "libstackd_kernels.so"
# CMake builds the chat formats module (native/chat/) beside the engine, in the same run.
CHAT_MODULE = "_chat" + sysconfig.get_config_var("EXT_SUFFIX")


class CMakeExtension(Extension):
    def __init__(self, name: str, source_dir: str = "."):
        super().__init__(name, sources=[])
        self.source_dir = os.path.abspath(source_dir)


class BuildExt(build_ext):
    """build_ext that hands CMakeExtensions to CMake (pybind11's cmake_example layout)."""

    def build_extension(self, ext):
        if not isinstance(ext, CMakeExtension):
            return super().build_extension(ext)
        out_dir = os.path.abspath(os.path.dirname(self.get_ext_fullpath(ext.name)))
        build_dir = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        os.makedirs(build_dir, exist_ok=True)
        import pybind11
        subprocess.check_call([
            "cmake", ext.source_dir, "-B", build_dir,
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            "-DCMAKE_BUILD_TYPE=Release",
        ])
        subprocess.check_call(["cmake", "--build", build_dir, "--parallel", str(os.cpu_count() or 2)])

    def copy_extensions_to_source(self):
        super().copy_extensions_to_source()
        # CMake also builds kernels/ as a plain shared library (loaded with ctypes by
        # server/engine/accel.py) and the chat formats module, which setuptools does not know
        # to copy in place.
        for name in (KERNELS_LIBRARY, CHAT_MODULE):
            built = os.path.join(self.build_lib, PACKAGE, name)
            if os.path.exists(built):  # replaced, not rewritten: a running process may map it
                target = os.path.join(SOURCE_DIR, name)
                shutil.copyfile(built, target + ".tmp")
                os.replace(target + ".tmp", target)


extensions = cythonize(
    [Extension(f"{PACKAGE}.{name}", [os.path.join(SOURCE_DIR, *name.split(".")) + ".py"])
     for name in COMPILED_MODULES],
    compiler_directives=CYTHON_DIRECTIVES,
    quiet=True,
)
if os.environ.get("STACKD_NO_NATIVE_BUILD") == "1":
    extensions = []     # the Makefile's editable install: build_ext --inplace built them already
elif os.path.exists("CMakeLists.txt"):
    extensions.append(CMakeExtension(f"{PACKAGE}._engine"))

setup(
    package_dir={PACKAGE: SOURCE_DIR},
    packages=[PACKAGE] + [f"{PACKAGE}.{name}" for name in find_packages(SOURCE_DIR)],
    package_data={PACKAGE: ["_engine.pyi", "_chat.pyi", KERNELS_LIBRARY],
                  f"{PACKAGE}.console": ["static/*", "db/migrations/*.mako"]},
    ext_modules=extensions,
    cmdclass={"build_ext": BuildExt},
)
