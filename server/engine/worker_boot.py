"""How an engine worker starts: `python -I -S .../engine/worker_boot.py PACKAGE FD PARENT_PID`.

-S skips the site module (site-packages' .pth files, the editable install's finder) and -I
keeps this script's folder and PYTHON* variables out: ~2 MB of each worker's memory and ~20 ms
of its start (measured, bench/startup.py). A worker needs nothing from site-packages but
llama.cpp's library, whose folder the daemon passes in LLAMA_CPP_LIB_PATH (engine/core.py).
The package is imported from the folder this file is in, under the name the daemon has for
it, however it is installed (a wheel, or an editable checkout whose folder has another name).
"""
import importlib.util
import os
import sys


def import_package(name: str) -> None:
    folder = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location(name, os.path.join(folder, "__init__.py"),
                                                  submodule_search_locations=[folder])
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    spec.loader.exec_module(package)


if __name__ == "__main__":
    package, fd, parent = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    import_package(package)
    worker = importlib.import_module(f"{package}.engine.worker")
    sys.exit(worker.main(fd, parent))
