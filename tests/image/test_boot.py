"""The device image `make image` builds, booted under qemu (tests/image/guest.py): one boot and
one reboot, then a poweroff. The tests run in this file's order, on one machine.

Through the forwarded ports: health, a chat answer and an embedding with the admin key that
came in as a systemd credential. Through the guest's shell: kill -9 of the daemon and systemd
restarts it; a SIGSTOPped daemon stops pinging the watchdog and systemd restarts it; a reboot
keeps keys and models; poweroff stops stackd within its stop timeout with the store intact.
"""
import hashlib
import json
import os
import re
import secrets
import subprocess
import sys
import time

import pytest

from . import guest as guests

pytestmark = [pytest.mark.slow, pytest.mark.image, pytest.mark.skipif(guests.available() is not None,
                                                    reason=str(guests.available()))]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# TCG emulates every instruction: a first boot imports the models too (arm64's guest, every
# instruction translated from another ISA, takes longer)
BOOT_TIMEOUT = 1200.0 if guests.ARCH == "x86_64" else 3000.0
ADMIN_KEY = "sk-image-test-" + secrets.token_urlsafe(24)
CLUSTER_SECRET = secrets.token_urlsafe(24)
FIGURES = os.path.join(guests.IMAGE_DIR, "figures.json")


@pytest.fixture(scope="module")
def image():
    """The image of `make image` (built, or found in its cache, from dist/ of `make wheels`)."""
    arch = [] if guests.ARCH == os.uname().machine else ["--arch", guests.ARCH]
    done = subprocess.run([sys.executable, os.path.join(ROOT, "packaging", "image", "build.py"), *arch,
                           guests.DIST_DIR, guests.IMAGE_DIR], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def vm(image, tmp_path_factory):
    scratch = tmp_path_factory.mktemp("image")
    copy = str(scratch / "disk.img")
    guests.prepare(image, copy, str(scratch))
    machine = guests.Guest(copy, str(scratch), {"stackd.admin-key": ADMIN_KEY,
                                                "stackd.cluster-secret": CLUSTER_SECRET})
    started = time.monotonic()
    machine.start()
    machine.figures = {"image_bytes": os.path.getsize(image)}
    machine.boot_started = started
    try:
        yield machine
    finally:
        machine.kill()
        os.makedirs(os.path.dirname(FIGURES), exist_ok=True)
        with open(FIGURES, "w") as f:
            json.dump(machine.figures, f, indent=2)


def chat(vm, key: str = ADMIN_KEY) -> str:
    response = vm.request("POST", "inference", "/v1/chat/completions", key, json={
        "model": "smollm2-135m-instruct", "max_tokens": 12, "temperature": 0,
        "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def test_first_boot_serves_health_chat_and_embeddings(vm):
    vm.wait_healthy(ADMIN_KEY, BOOT_TIMEOUT)
    answer = chat(vm)
    vm.figures["boot_to_first_answer_s"] = round(time.monotonic() - vm.boot_started, 1)
    assert answer.strip()
    response = vm.request("POST", "inference", "/v1/embeddings", ADMIN_KEY,
                          json={"model": "all-minilm-l6-v2", "input": "hello from the device"})
    assert response.status_code == 200, response.text
    assert len(response.json()["data"][0]["embedding"]) == 384
    # a wrong key is refused: the credential's key is the one that works
    assert vm.request("GET", "cluster", "/v1/health", "sk-not-the-key").status_code == 401


def test_the_portable_build_runs_its_cpu_variant_and_the_credentials(vm):
    # ggml's CPU variant for the guest's CPU (Haswell: AVX2, no AVX-512; Cortex-A76: the dot
    # products and fp16, no i8mm or SVE) is mapped in a worker
    workers = vm.sh("grep -l worker_boot.py /proc/[0-9]*/cmdline").split()
    assert workers
    maps = vm.sh(f"cat {workers[0].replace('cmdline', 'maps')}")
    wanted, unwanted = guests.GGML_CPU
    assert wanted in maps
    assert not any(name in maps for name in unwanted)
    pid = vm.main_pid()
    environ = vm.sh(f"tr '\\0' '\\n' < /proc/{pid}/environ")
    assert "STACKD_CLUSTER_SECRET_FILE=/run/credentials/stackd.service/stackd.cluster-secret" in environ
    assert vm.sh("ls /var/lib/stackd/cluster.secret 2>&1", check=False).endswith("No such file or directory")
    assert vm.sh("ls /var/lib/stackd/admin.key 2>&1", check=False).endswith("No such file or directory")
    # no key or secret in the image itself: nothing under /etc or /opt holds them
    assert vm.sh(f"grep -rl -- '{ADMIN_KEY}' /etc /opt /var/lib/stackd 2>/dev/null", check=False) == ""
    # what the daemon takes in the guest (memory of the service's processes)
    vm.figures["memory_current_bytes"] = int(vm.sh("systemctl show -p MemoryCurrent --value stackd.service"))
    pss = vm.sh("cat /sys/fs/cgroup/system.slice/stackd.service/cgroup.procs | "
                "while read p; do awk '/^Pss:/ {print $2}' /proc/$p/smaps_rollup; done")
    vm.figures["pss_kib"] = sum(int(line) for line in pss.split())
    vm.figures["processes"] = len(pss.split())
    vm.figures["/v1/health"] = vm.request("GET", "cluster", "/v1/health", ADMIN_KEY).json()
    readonly = vm.sh("findmnt -no OPTIONS /usr")
    assert readonly.split(",")[0] == "ro"


def test_kill_9_of_the_daemon_is_restarted_by_systemd(vm):
    pid = vm.main_pid()
    restarts = int(vm.sh("systemctl show -p NRestarts --value stackd.service"))
    vm.sh(f"kill -9 {pid}")
    vm.wait_restarted(pid, ADMIN_KEY, timeout=BOOT_TIMEOUT)
    assert int(vm.sh("systemctl show -p NRestarts --value stackd.service")) == restarts + 1
    assert chat(vm).strip()


def test_a_stopped_daemon_is_restarted_by_the_watchdog(vm):
    pid = vm.main_pid()
    vm.sh(f"kill -STOP {pid}")
    vm.wait_restarted(pid, ADMIN_KEY, timeout=BOOT_TIMEOUT)
    journal = vm.sh("journalctl -b -u stackd.service --no-pager -o cat")
    assert re.search(r"stackd\.service: Watchdog timeout", journal), journal[-3000:]


def test_a_reboot_keeps_keys_and_models(vm):
    created = vm.sh("runuser -u stackd -- env STACKD_DATA_DIR=/var/lib/stackd "
                    "/opt/stackd/bin/stackd keys create --name after-reboot --permissions inference")
    key = created.splitlines()[-1].strip()
    assert key.startswith("sk-")
    before = vm.sh("cd /var/lib/stackd && sha256sum keys.json $(find models -name '*.json' | sort)")
    models = {m["id"]: m for m in vm.request("GET", "inference", "/v1/models", ADMIN_KEY).json()["data"]}
    boot_id = vm.sh("cat /proc/sys/kernel/random/boot_id")
    vm.sh("systemctl reboot --no-block")
    vm.reset_shell()
    deadline = time.monotonic() + BOOT_TIMEOUT
    while True:                           # the old shell goes with the old boot
        time.sleep(5)
        try:
            if vm.sh("cat /proc/sys/kernel/random/boot_id", timeout=30) != boot_id:
                break
        except (OSError, TimeoutError, ConnectionError):
            vm.reset_shell()
        assert time.monotonic() < deadline, "no shell after the reboot"
    vm.wait_healthy(ADMIN_KEY, BOOT_TIMEOUT)
    assert vm.sh("cat /proc/sys/kernel/random/boot_id") != boot_id
    assert vm.sh("cd /var/lib/stackd && sha256sum keys.json $(find models -name '*.json' | sort)") == before
    after = {m["id"]: m for m in vm.request("GET", "inference", "/v1/models", ADMIN_KEY).json()["data"]}
    assert after.keys() == models.keys() >= {"smollm2-135m-instruct", "all-minilm-l6-v2"}
    response = vm.request("POST", "inference", "/v1/chat/completions", key, json={
        "model": "smollm2-135m-instruct", "max_tokens": 4,
        "messages": [{"role": "user", "content": "Hi"}]})
    assert response.status_code == 200, response.text


def test_poweroff_stops_stackd_within_its_timeout_with_the_store_intact(vm):
    manifests = vm.sh("cd /var/lib/stackd && sha256sum $(find models -name '*.json' | sort)")
    # the blobs alone: not the files that come and go beside them (an import's temporary, a pull's
    # partial, the prompt cache's): one renamed between find's readdir and its stat is an error line
    blobs = vm.sh("cd /var/lib/stackd && find models/blobs -name 'sha256-*' ! -name '*.partial' -type f "
                  "-printf '%s %p\\n' | sort")
    vm.sh("systemctl poweroff --no-block")
    assert vm.wait_exit(timeout=300) == 0
    console = vm.console()
    assert "stackd: stopped" in console[console.rfind("Stopping stackd.service"):]
    assert "stackd.service: State 'stop-sigterm' timed out" not in console
    assert "stackd.service: Deactivated successfully" in console[console.rfind("Stopping stackd.service"):]
    # the store on the powered-off disk, read with debugfs: every manifest as it was
    for line in manifests.splitlines():
        digest, name = line.split()
        data = guests.debugfs_cat(vm.image, f"/var/lib/stackd/{name}")
        assert hashlib.sha256(data.encode()).hexdigest() == digest, name
    listing = guests.debugfs_cat(vm.image, "/var/lib/stackd/models/blobs", "ls -l")
    assert blobs.splitlines(), "the store lists no blob"
    for line in blobs.splitlines():
        assert re.fullmatch(r"\d+ models/blobs/sha256-[0-9a-f]{64}", line), blobs
        size, name = line.split()
        assert re.search(rf"\s{size}\s.*{re.escape(os.path.basename(name))}", listing), name
    fsck = subprocess.run(["e2fsck", "-fn", f"{vm.image}?offset={guests.PART_OFFSET}"],
                          capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
