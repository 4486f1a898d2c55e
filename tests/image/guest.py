"""The device image under qemu, for tests/image/test_boot.py (and bench figures).

The image of this machine's architecture, or of STACKD_IMAGE_ARCH (aarch64: `make
test-aarch64` boots `make image ARCH=aarch64`'s). x86-64: qemu-system-x86_64 with TCG (not KVM:
nested guests reset on this host) and `-cpu Haswell` (AVX2, no AVX-512: ggml's haswell variant
and our AVX2 kernels are what runs), SeaBIOS. arm64: qemu-system-aarch64 `-M virt -cpu
cortex-a76` (a Raspberry Pi 5's and an RK3588's core: the dot products, no SVE) with TCG and
EDK2's UEFI firmware (Debian's qemu-efi-aarch64), the disk on virtio-blk. Both: user-mode
networking forwarding the daemon's two ports to 127.0.0.1, the credentials as SMBIOS type 11
strings (what systemd imports as system credentials), the first serial port logged to a file
and a second console (a second UART on x86, a virtio console on arm64, whose virt machine has
one UART) carrying a root shell that only the test's copy of the image has (a unit written into
the copy with debugfs, beside a journald drop-in that forwards the journal to the first port).
The image under test is otherwise the one `make image` built, bit for bit.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time

import httpx2 as httpx

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARCH = os.environ.get("STACKD_IMAGE_ARCH") or os.uname().machine


def image_recipe():
    """packaging/image/build.py, for its targets' layout (one source for the offsets)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("stackd_image_build",
                                                  os.path.join(ROOT, "packaging", "image", "build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TARGET = image_recipe().TARGETS[ARCH]
PART_OFFSET = TARGET.part_offset
CONSOLE_TTY = TARGET.console
SHELL_TTY = {"x86_64": "ttyS1", "aarch64": "hvc0"}[ARCH]
# Where `make image` (ARCH=...) puts its image, and the wheels it installs
IMAGE_DIR = os.path.join(ROOT, "build", "image" if ARCH == os.uname().machine else f"image-{ARCH}")
DIST_DIR = os.path.join(ROOT, "dist" if ARCH == os.uname().machine else f"dist-{ARCH}")
# ggml's CPU variant the guest's CPU scores best, and ones it must not load
GGML_CPU = {"x86_64": ("libggml-cpu-haswell.so", ("libggml-cpu-skylakex.so", "libggml-cpu-zen4.so")),
            "aarch64": ("libggml-cpu-armv8.2_2.so", ("libggml-cpu-armv8.6_1.so", "libggml-cpu-armv8.6_2.so"))}[ARCH]
EFI_FIRMWARE = "/usr/share/qemu-efi-aarch64/QEMU_EFI.fd"
SHELL_UNIT = """[Unit]
Description=root shell on a second console (tests/image only: not part of the image)
[Service]
ExecStart=/bin/bash --norc --noprofile --noediting
StandardInput=tty-force
StandardOutput=tty
StandardError=tty
TTYPath=/dev/{shell_tty}
TTYReset=yes
Restart=always
# an interactive bash ignores SIGTERM: hang it up, so it never holds a shutdown back
KillSignal=SIGHUP
TimeoutStopSec=5
"""
JOURNAL_TO_CONSOLE = "[Journal]\nForwardToConsole=yes\nTTYPath=/dev/{console_tty}\nMaxLevelConsole=info\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def debugfs(image: str, commands: list[str], write: bool = False) -> str:
    done = subprocess.run(["debugfs", *(["-w"] if write else []), "-f", "-",
                           f"{image}?offset={PART_OFFSET}"],
                          input="\n".join(commands) + "\n", capture_output=True, text=True, check=True)
    return done.stdout


def debugfs_cat(image: str, path: str, command: str = "cat") -> str:
    """A file (or, with "ls -l", a directory listing) of the image's root file system."""
    done = subprocess.run(["debugfs", "-R", f"{command} {path}", f"{image}?offset={PART_OFFSET}"],
                          capture_output=True, text=True, check=True)
    return done.stdout


def prepare(image: str, copy: str, scratch: str) -> None:
    """A sparse copy of `image` with the test's shell and console logging added."""
    subprocess.run(["cp", "--sparse=always", image, copy], check=True)
    unit, journald = os.path.join(scratch, "test-shell.service"), os.path.join(scratch, "console.conf")
    with open(unit, "w") as f:
        f.write(SHELL_UNIT.format(shell_tty=SHELL_TTY))
    with open(journald, "w") as f:
        f.write(JOURNAL_TO_CONSOLE.format(console_tty=CONSOLE_TTY))
    debugfs(copy, ["cd /etc/systemd/system", f"write {unit} test-shell.service",
                   "cd /etc/systemd/system/multi-user.target.wants",
                   "symlink test-shell.service /etc/systemd/system/test-shell.service",
                   "mkdir /etc/systemd/journald.conf.d", "cd /etc/systemd/journald.conf.d",
                   f"write {journald} console.conf"], write=True)


class Guest:
    def __init__(self, image: str, workdir: str, credentials: dict[str, str], memory_mb: int = 2048):
        self.image, self.workdir, self.credentials = image, workdir, credentials
        self.memory_mb = memory_mb
        self.inference_port, self.cluster_port = free_port(), free_port()
        self.serial_log = os.path.join(workdir, "serial.log")
        self.shell_path = os.path.join(workdir, "shell.sock")
        self.process: subprocess.Popen | None = None
        self.shell: socket.socket | None = None
        self.commands = 0

    # ---- the machine ------------------------------------------------------------------------

    def start(self) -> None:
        smbios = [arg for name, value in self.credentials.items()
                  for arg in ("-smbios", f"type=11,value=io.systemd.credential:{name}={value}")]
        forwards = (f"hostfwd=tcp:127.0.0.1:{self.inference_port}-:8080,"
                    f"hostfwd=tcp:127.0.0.1:{self.cluster_port}-:5381")
        common = ["-smp", "2", "-m", str(self.memory_mb), "-display", "none", "-nodefaults",
                  "-nic", f"user,model=virtio-net-pci,{forwards}",
                  "-chardev", f"file,id=console,path={self.serial_log}", "-serial", "chardev:console",
                  "-chardev", f"socket,id=shell,path={self.shell_path},server=on,wait=off", *smbios]
        if ARCH == "aarch64":
            command = ["qemu-system-aarch64", "-machine", "virt", "-accel", "tcg", "-cpu", "cortex-a76",
                       "-bios", EFI_FIRMWARE, *common,
                       "-drive", f"file={self.image},format=raw,if=none,id=disk", "-device", "virtio-blk-pci,drive=disk",
                       "-device", "virtio-serial-pci", "-device", "virtconsole,chardev=shell"]
        else:
            command = ["qemu-system-x86_64", "-machine", "pc", "-accel", "tcg", "-cpu", "Haswell", *common,
                       "-drive", f"file={self.image},format=raw,if=virtio", "-serial", "chardev:shell"]
        self.reset_shell()
        self.process = subprocess.Popen(["nice", "-n", "5", *command], stdin=subprocess.DEVNULL,
                                        stdout=open(os.path.join(self.workdir, "qemu.log"), "ab"),
                                        stderr=subprocess.STDOUT)

    def wait_exit(self, timeout: float) -> int:
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def console(self) -> str:
        with open(self.serial_log, "rb") as f:
            return f.read().decode("utf-8", "replace")

    # ---- the root shell on ttyS1 ------------------------------------------------------------

    def _connect_shell(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                sock = socket.socket(socket.AF_UNIX)
                sock.connect(self.shell_path)
                break
            except OSError:
                sock.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        self.shell = sock
        self.shell.settimeout(1.0)

    def reset_shell(self) -> None:
        """Drop the connection to the shell (the next command connects and sets it up again):
        after a reboot, a new shell listens on the port."""
        if self.shell is not None:
            self.shell.close()
            self.shell = None

    def sh(self, command: str, timeout: float = 120.0, check: bool = True) -> str:
        """Run `command` in the guest's root shell; its output (stdout and stderr)."""
        if self.shell is None:
            self._connect_shell(timeout)
            self._exchange("stty -echo; export PS1= PS2= PATH=/usr/sbin:/usr/bin:/sbin:/bin SYSTEMD_PAGER= "
                           "SYSTEMD_COLORS=0", timeout)
        status, output = self._exchange(command, timeout)
        if check and status != 0:
            raise AssertionError(f"guest: `{command}` exited {status}: {output}")
        return output

    def _exchange(self, command: str, timeout: float) -> tuple[int, str]:
        self.commands += 1
        n = self.commands
        # the marker spelled apart in the command, so that an echo of it never matches
        self.shell.sendall(f"{command}; echo \"__E\"\"ND{n}__ $?\"\n".encode())
        wanted = re.compile(rf"__END{n}__ (\d+)")
        data, deadline = b"", time.monotonic() + timeout
        while True:
            match = wanted.search(data.decode("utf-8", "replace"))
            if match:
                text = data.decode("utf-8", "replace")[:match.start()].replace("\r", "")
                # a shell that echoes (one just started after a reboot) shows the command first
                echoed = f'echo "__E""ND{n}__ $?"'
                text = "\n".join(line for line in text.split("\n") if echoed not in line)
                return int(match.group(1)), text.strip()
            if time.monotonic() > deadline:
                raise TimeoutError(f"guest: `{command}` gave no answer in {timeout} s: {data[-2000:]!r}")
            try:
                chunk = self.shell.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                raise ConnectionError("guest: the shell's serial port closed")
            data += chunk

    # ---- the daemon -------------------------------------------------------------------------

    def url(self, port: str, path: str) -> str:
        return f"http://127.0.0.1:{self.inference_port if port == 'inference' else self.cluster_port}{path}"

    def request(self, method: str, port: str, path: str, key: str, timeout: float = 300.0, **kwargs):
        return httpx.request(method, self.url(port, path), headers={"Authorization": f"Bearer {key}"},
                             timeout=timeout, **kwargs)

    def wait_healthy(self, key: str, timeout: float) -> float:
        """Seconds until GET /v1/health answers 200 (ready: both ports, the models loaded)."""
        started = time.monotonic()
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"qemu exited ({self.process.returncode}): {self.console()[-3000:]}")
            try:
                if self.request("GET", "cluster", "/v1/health", key, timeout=10).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"no health in {timeout} s: {self.console()[-4000:]}")
            time.sleep(2)

    def main_pid(self) -> int:
        return int(self.sh("systemctl show -p MainPID --value stackd.service"))

    def wait_restarted(self, old_pid: int, key: str, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while True:
            state = self.unit_state()
            if (state["ActiveState"], state["SubState"]) == ("active", "running") \
                    and int(state["MainPID"]) not in (0, old_pid):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"stackd not restarted in {timeout} s: {state}")
            time.sleep(2)
        self.wait_healthy(key, timeout=max(30.0, deadline - time.monotonic()))
        return int(state["MainPID"])

    def unit_state(self, *names: str) -> dict[str, str]:
        names = names or ("ActiveState", "SubState", "MainPID", "NRestarts")
        output = self.sh("systemctl show stackd.service " + " ".join(f"-p {n}" for n in names))
        return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


def available() -> str | None:
    """Why the image cannot be booted here, or None."""
    for tool in ({"x86_64": "qemu-system-x86_64", "aarch64": "qemu-system-aarch64"}[ARCH], "debugfs", "mmdebstrap"):
        if shutil.which(tool) is None:
            return f"{tool} missing (make test-deps installs it)"
    if ARCH == "aarch64" and not os.path.exists(EFI_FIRMWARE):
        return f"{EFI_FIRMWARE} missing (Debian's qemu-efi-aarch64: make image ARCH=aarch64 installs it)"
    return None
