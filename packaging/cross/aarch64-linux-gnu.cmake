# CMake toolchain file: Debian's aarch64 cross compilers (g++-aarch64-linux-gnu), for the
# cross build of the native parts (tests/image/test_cross_build.py).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# Programs (the Python that runs the fetch scripts) from the build machine; headers and
# libraries from wherever they are found (Python's headers are the build machine's).
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
