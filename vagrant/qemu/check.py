"""`make vm-check`: what a Vagrant user's VM does, done with QEMU here, and the stock-kernel tests run in it.

The image (image.sh: Debian 12 and its stock kernel, a base box's shape, cached) boots under QEMU, with KVM only
where the host CPU offers hardware virtualisation (vmx or svm: paravirtualised KVM runs a stock kernel far too
slowly), else TCG. The checkout is synced as the Vagrantfile syncs it (rsync with rsync-excludes, to
~vagrant/mpft-emu), the Vagrantfile's provisioners run (the same scripts, vagrant/provision/), then the stock-kernel
tests (pytest -m stock_kernel, where a skip is a failure: this kernel must have every feature). Their JUnit XML and
the guest's console come back into --out. Then the guest is the second server of cluster runs over two kernels
(`--servers localhost,root@<guest>`: one plane here on the userspace datapath, one there on the kernel's), over a
private network as the Vagrantfile's for several VMs: a tap on a host bridge, both at 9100 bytes (the fabric's
9000-byte frames inside VXLAN), set up in the guest by the Vagrantfile's own jumbo provisioner. The guest is
powered off, and nothing is left running, mounted or linked here (the disk is a copy-on-write overlay in a
temporary directory, removed; the cached image is never written; the bridge and tap are removed). Each phase is
timed; the outcome and the times go into benchmarks/RESULTS.md (section vm-check).

    sudo .venv/bin/python vagrant/qemu/check.py [--out DIR] [--cpus 2] [--memory 4096] [-k EXPR]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from results import recorded  # noqa: E402 - benchmarks/ is not a package

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("MPFT_VM_CACHE") or Path.home() / ".cache" / "mpft" / "vm")
GUEST_DIR = "/home/vagrant/mpft-emu"  # the Vagrantfile's guest_dir
BOOT_TIMEOUT_S = 600
NAT_MAC, PRIVATE_MAC = "52:54:00:12:34:56", "52:54:00:12:34:57"  # the guest's NICs: ssh's, and the tunnels'
BRIDGE, TAP = "mpftvm-br0", "mpftvm-tap0"
PRIVATE_NET = "198.18.251"  # the benchmarking range, beside the several-servers tests' 198.18.250
HOST_ADDRESS, GUEST_ADDRESS = f"{PRIVATE_NET}.1", f"{PRIVATE_NET}.2"
JUMBO_MTU = "9100"
LOCK = Path("/run/mpft-vm-check.lock")  # one check at a time: they share the bridge and tap's names
WORKDIR_PREFIX = "mpft-vm-check-"  # the guest's disk overlay and console, in a temporary directory
# the cluster runs over both kernels: every pair of an all-to-all, then the main job's quick study at one seed
SPREAD_FABRIC = ["--topo", "mpft", "--planes", "2", "--nodes", "4", "--leaves", "2", "--spines", "2"]
PHASES: dict[str, float] = {}


@contextmanager
def phase(name: str):
    print(f"vm-check: {name} ...", flush=True)
    t0 = time.monotonic()
    try:
        yield
    finally:
        PHASES[name] = time.monotonic() - t0
        print(f"vm-check: {name} took {PHASES[name]:.0f} s", flush=True)


TOOLS = {"qemu-system-x86_64": "qemu-system-x86", "qemu-img": "qemu-utils", "mmdebstrap": "mmdebstrap",
         "rsync": "rsync", "ssh": "openssh-client"}


def install_tools() -> None:
    """Debian's packages for what the check runs, where missing (as .ci/setup installs the suite's)."""
    missing = sorted({package for tool, package in TOOLS.items() if shutil.which(tool) is None})
    if missing:
        print(f"vm-check: installing {' '.join(missing)}", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], check=True, env=env,
                       stdout=subprocess.DEVNULL)


def accelerator() -> str:
    """kvm where the CPU has hardware virtualisation and /dev/kvm is there, else tcg."""
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags |= set(line.split(":", 1)[1].split())
    return "kvm" if {"vmx", "svm"} & flags and os.access("/dev/kvm", os.R_OK | os.W_OK) else "tcg"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Guest:
    """One QEMU guest booted from the cached image through an overlay, reached over ssh on a local port."""

    def __init__(self, image: Path, workdir: Path, cpus: int, memory: int) -> None:
        self.image, self.workdir, self.port = image, workdir, free_port()
        self.key = image / "id_ed25519"
        self.console = workdir / "console.log"
        overlay = workdir / "overlay.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(image / "root.img"), "-F", "raw",
                        str(overlay)], check=True)
        accel = accelerator()
        self.accel = accel
        argv = ["qemu-system-x86_64", "-accel", accel, "-cpu", "host" if accel == "kvm" else "max",
                "-smp", str(cpus), "-m", str(memory), "-kernel", str(image / "vmlinuz"),
                "-initrd", str(image / "initrd.img"), "-append", "root=/dev/vda rw console=ttyS0",
                "-drive", f"file={overlay},if=virtio,format=qcow2",
                "-netdev", f"user,id=n0,hostfwd=tcp:127.0.0.1:{self.port}-:22",
                "-device", f"virtio-net-pci,netdev=n0,mac={NAT_MAC}",
                "-netdev", f"tap,id=n1,ifname={TAP},script=no,downscript=no",
                "-device", f"virtio-net-pci,netdev=n1,mac={PRIVATE_MAC},host_mtu={JUMBO_MTU}",
                "-display", "none", "-monitor", "none",
                "-serial", f"file:{self.console}"]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=open(workdir / "qemu.log", "wb"), start_new_session=True)

    def ssh_argv(self) -> list[str]:
        return ["ssh", "-i", str(self.key), "-p", str(self.port), "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes",
                "-o", "ConnectTimeout=10"]

    def run(self, command: str, check: bool = True, log: Path | None = None) -> int:
        """A command in the guest as the vagrant user (sudo inside it for root), its output to `log` or here."""
        out = open(log, "ab") if log else None
        try:
            code = subprocess.run([*self.ssh_argv(), "vagrant@127.0.0.1", command], stdout=out or None,
                                  stderr=subprocess.STDOUT if out else None, check=False).returncode
        finally:
            if out:
                out.close()
        if check and code:
            raise SystemExit(f"vm-check: `{command}` failed in the guest (exit {code})"
                             + (f": see {log}" if log else ""))
        return code

    def wait_ssh(self) -> None:
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        while self.run("true", check=False):
            if self.proc.poll() is not None:
                raise SystemExit(f"vm-check: QEMU exited ({self.proc.returncode}): see {self.workdir}/qemu.log")
            if time.monotonic() > deadline:
                raise SystemExit(f"vm-check: no ssh after {BOOT_TIMEOUT_S} s: see {self.console}")
            time.sleep(5)

    def sync(self) -> None:
        """The checkout to ~/mpft-emu, as `vagrant rsync` does (one-way, with the Vagrantfile's excludes)."""
        subprocess.run(["rsync", "-a", "--delete", "--exclude-from", str(REPO / "vagrant" / "rsync-excludes"),
                        "-e", " ".join(self.ssh_argv()), f"{REPO}/", f"vagrant@127.0.0.1:{GUEST_DIR}/"],
                       check=True)

    def fetch(self, path: str, into: Path) -> None:
        subprocess.run(["rsync", "-a", "-e", " ".join(self.ssh_argv()), f"vagrant@127.0.0.1:{path}", str(into)],
                       check=False)

    def power_off(self) -> None:
        if self.proc.poll() is None:
            self.run("sudo systemctl poweroff", check=False)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def ip(*argv: str, check: bool = True) -> None:
    subprocess.run(["ip", *argv], check=check, capture_output=True)


def links(*names: str) -> list[str]:
    """Those of `names` that exist here as network devices."""
    return [name for name in names if Path("/sys/class/net", name).exists()]


@contextmanager
def private_network():
    """The host's end of the guest's second NIC: a tap on a bridge, both at the jumbo MTU, removed afterwards
    (and first, if a check that was killed left them: holding the lock, no other check is using them)."""
    for name in links(TAP, BRIDGE):
        print(f"vm-check: removing {name}, left by a check that was killed", flush=True)
        ip("link", "del", name)
    made = []
    try:
        ip("link", "add", BRIDGE, "mtu", JUMBO_MTU, "type", "bridge")
        made.append(BRIDGE)
        ip("tuntap", "add", "dev", TAP, "mode", "tap")
        made.append(TAP)
        ip("link", "set", TAP, "mtu", JUMBO_MTU, "master", BRIDGE, "up")
        ip("addr", "add", f"{HOST_ADDRESS}/24", "dev", BRIDGE)
        ip("link", "set", BRIDGE, "up")
        yield
    finally:
        for name in reversed(made):
            ip("link", "del", name, check=False)


def fabric_state(run) -> str:
    """What a run leaves behind if it leaks: OVS bridges, network namespaces, run directories."""
    return run("ovs-vsctl list-br; ip netns list; ls /run/mpft-emu 2>/dev/null | grep -vx lock; true")


def cluster_runs(guest: Guest, out: Path) -> list[tuple[str, str]]:
    """The guest as a second server (its checkout at our checkout's path, root reached with the image's key over
    the private network): an all-to-all over every pair, then the quick study; each one's outcome and verdict,
    and whether either side was left as it was."""
    guest.run(f"dev=$(ip -o link | grep -i {PRIVATE_MAC} | cut -d: -f2 | tr -d ' ') && "
              f"sudo ip addr replace {GUEST_ADDRESS}/24 dev $dev && sudo ip link set $dev up && "
              f"sudo sh {GUEST_DIR}/vagrant/provision/jumbo.sh {PRIVATE_NET} && "
              "sudo install -d -m 700 /root/.ssh && sudo install -m 600 .ssh/authorized_keys /root/.ssh/ && "
              f"sudo mkdir -p {shlex.quote(str(REPO.parent))} && sudo ln -sfn {GUEST_DIR} {shlex.quote(str(REPO))}",
              log=out / "servers-setup.log")
    config = out / "servers-ssh.conf"
    config.write_text(f"Host {GUEST_ADDRESS}\n  User root\n  IdentityFile {guest.key}\n  IdentitiesOnly yes\n"
                      "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
    servers = ["--servers", f"localhost,root@{GUEST_ADDRESS}", "--ssh-config", str(config)]
    mpft = str(REPO / ".venv" / "bin" / "mpft")

    def here(command: str) -> str:
        return subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout

    def there(command: str) -> str:
        return subprocess.run([*guest.ssh_argv(), "vagrant@127.0.0.1", f"sudo sh -c '{command}'"],
                              capture_output=True, text=True).stdout

    before = fabric_state(here), fabric_state(there)
    results = []
    for name, argv, verdict_in in (
            ("all pairs", [mpft, "traffic", "all-to-all", *SPREAD_FABRIC, "--out", str(out / "servers-a2a")],
             out / "servers-a2a" / "traffic.json"),
            ("quick study", [mpft, "run", "routing", "--quick", "--seed", "1", "--out", str(out / "servers-study")],
             None)):
        with (out / f"servers-{name.replace(' ', '-')}.log").open("w") as log:
            done = subprocess.run([*argv, *servers], stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        said = (out / f"servers-{name.replace(' ', '-')}.log").read_text().strip().splitlines()
        detail = (json.loads(verdict_in.read_text())["fidelity"]["verdict"] if verdict_in and verdict_in.exists()
                  else next((line for line in said if line.startswith("answer:")), said[-1] if said else ""))
        results.append((f"servers::{name}", ("passed" if done.returncode == 0 else
                                             f"failed: exit {done.returncode}") + f": {detail}"))
    after = fabric_state(here), fabric_state(there)
    results.append(("servers::nothing left on either side",
                    "passed" if after == before else f"failed: before {before!r}, after {after!r}"))
    return results


def outcomes(junit: Path) -> list[tuple[str, str]]:
    """(test, passed | failed | skipped: why) from pytest's JUnit XML."""
    if not junit.exists():
        return []
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        result = "passed"
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                result = f"{'failed' if kind != 'skipped' else 'skipped'}: {(node.get('message') or '')[:160]}"
        out.append((name, result))
    return out


def failures(results: list[tuple[str, str]]) -> list[str]:
    """What failed the check: anything but a pass (which may say more after a colon) or a skip of a test that only
    a newer kernel can run."""
    return [name for name, result in results
            if result.split(":")[0] != "passed" and "only on a newer kernel" not in result]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "results" / "vm-check")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--memory", type=int, default=4096, help="MiB")
    parser.add_argument("-k", dest="select", help="only the stock-kernel tests pytest's -k selects")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("vm-check: run as root (sudo make vm-check): the image is built with mmdebstrap")
    lock = LOCK.open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SystemExit("vm-check: another vm-check is running on this machine") from None
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with phase("image"):
        install_tools()
        built = subprocess.run(["sh", str(HERE / "image.sh"), str(CACHE)], check=True, capture_output=True,
                               text=True)
        image = Path(built.stdout.strip().splitlines()[-1])
    for stale in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):  # a killed check's disk: GBs
        print(f"vm-check: removing {stale}, left by a check that was killed", flush=True)
        shutil.rmtree(stale, ignore_errors=True)
    guest = None
    junit = args.out / "stock-kernel.xml"
    clustered: list[tuple[str, str]] = []
    with private_network():
        workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
        try:
            with phase("boot"):
                guest = Guest(image, workdir, args.cpus, args.memory)
                guest.wait_ssh()
            with phase("sync"):
                guest.sync()
            with phase("provision"):
                for script in ("setup", "smoke"):
                    guest.run(f"sudo sh {GUEST_DIR}/vagrant/provision/{script}.sh {GUEST_DIR}",
                              log=args.out / f"provision-{script}.log")
            with phase("tests"):
                select = f" -k '{args.select}'" if args.select else ""
                guest.run(f"cd {GUEST_DIR} && sudo MPFT_REQUIRE_STOCK_KERNEL=1 .venv/bin/python -m pytest -q -rs "
                          f"-m stock_kernel --junitxml=/tmp/stock-kernel.xml{select}", check=False,
                          log=args.out / "tests.log")
                guest.fetch("/tmp/stock-kernel.xml", junit)
            with phase("servers"):
                clustered = cluster_runs(guest, args.out)
        finally:
            with phase("teardown"):
                if guest is not None:
                    guest.power_off()
                    shutil.copy(guest.console, args.out / "console.log")
                shutil.rmtree(workdir, ignore_errors=True)
    left = ([f"QEMU (pid {guest.proc.pid})"] if guest is not None and guest.proc.poll() is None else []) + \
        ([str(workdir)] if workdir.exists() else []) + links(BRIDGE, TAP)
    results = outcomes(junit) + clustered
    failed = failures(results)
    print(f"guest: Debian 12 stock kernel under QEMU ({guest.accel if guest else '?'}), {args.cpus} vCPUs, "
          f"{args.memory} MiB")
    for name, result in results:
        print(f"{result.split(':')[0]:>8}  {name}{result[len(result.split(':')[0]):]}")
    print("phases: " + ", ".join(f"{name} {seconds / 60:.1f} min" for name, seconds in PHASES.items())
          + f"; total {(time.monotonic() - started) / 60:.1f} min")
    print(f"{len(results) - len(failed)} of {len(results)} stock-kernel tests and cluster runs passed (or skipped as "
          f"newer kernels' only); left behind on the host: {', '.join(left) or 'nothing'}")
    return 0 if results and not failed and not left else 1


if __name__ == "__main__":
    with recorded("vm-check"):  # the whole check's output and time, in its section of RESULTS.md
        code = main()
    sys.exit(code)
