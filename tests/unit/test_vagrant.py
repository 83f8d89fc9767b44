"""The Vagrant VM: its Vagrantfile validates, and it provisions with the set-up script CI runs."""

from __future__ import annotations

import fcntl
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from emulator.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]
VAGRANT_DIR = REPO / "vagrant"
VAGRANTFILE = (VAGRANT_DIR / "Vagrantfile").read_text()


@pytest.fixture
def validate(tmp_path) -> Callable[..., subprocess.CompletedProcess]:
    """Runs `vagrant validate --ignore-provider` with extra environment variables; leaves nothing behind."""
    binary = shutil.which("vagrant")
    if binary is None:
        pytest.skip("no vagrant command (.ci/setup installs Debian's vagrant package)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VAGRANT_", "MPFT_VM_"))}
    env.update(VAGRANT_CWD=str(VAGRANT_DIR),
               VAGRANT_HOME=str(tmp_path / "vagrant.d"),  # not ~/.vagrant.d
               VAGRANT_DOTFILE_PATH=str(tmp_path / "dotfile"),  # not vagrant/.vagrant
               VAGRANT_CHECKPOINT_DISABLE="1")  # no version check over the network

    def run(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([binary, "--no-color", "validate", "--ignore-provider"], env={**env, **extra},
                              capture_output=True, text=True, timeout=300, check=False)

    return run


def test_vagrantfile_validates(validate):
    before = sorted(p.name for p in VAGRANT_DIR.iterdir())
    result = validate()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "validated successfully" in result.stdout
    assert sorted(p.name for p in VAGRANT_DIR.iterdir()) == before


def test_vagrantfile_takes_size_and_box_from_the_environment(validate):
    result = validate(MPFT_VM_CPUS="4", MPFT_VM_MEMORY="8192", MPFT_VM_BOX="bento/ubuntu-24.04")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("name", "value"), [("MPFT_VM_CPUS", "two"), ("MPFT_VM_CPUS", "0"),
                                             ("MPFT_VM_MEMORY", "4G"), ("MPFT_VM_MEMORY", "-1")])
def test_vagrantfile_refuses_bad_sizes(validate, name, value):
    result = validate(**{name: value})
    assert result.returncode != 0
    assert f"{name} must be a positive whole number" in result.stdout + result.stderr


# -- the Vagrantfile's provisioning, read as text ---------------------------------------------------------
def make_rules(text: str) -> dict[str, tuple[list[str], list[str]]]:
    """target -> (prerequisites, recipe lines) of a simple Makefile."""
    rules: dict[str, tuple[list[str], list[str]]] = {}
    target = None
    for line in text.splitlines():
        if line.startswith("\t") and target:
            rules[target][1].append(line.strip())
        elif match := re.match(r"([\w.-]+)\s*:(?!=)(.*)", line):
            target = match[1]
            rules[target] = (match[2].split(), [])
        elif line.strip():
            target = None
    return rules


def shell_provisioners() -> dict[str, tuple[list[str], list[str]]]:
    """name -> (script lines, arguments) of the Vagrantfile's shell provisioners, in the order they run: scripts
    under vagrant/ (make vm-check runs the same files), comments and blank lines left out."""
    found = re.findall(r'config\.vm\.provision "(\w+)", type: "shell", path: "([^"]+)", args: \[([^\]]*)\]$',
                       VAGRANTFILE, flags=re.M)
    out = {}
    for name, path, args in found:
        lines = [line.strip() for line in (VAGRANT_DIR / path).read_text().splitlines()]
        out[name] = ([line for line in lines if line and not line.startswith("#")],
                     [arg.strip() for arg in args.split(",") if arg.strip()])
    return out


def ruby_string(expression: str) -> str:
    """The value of a path the Vagrantfile writes as a literal, a variable or `#{variable}`."""
    text = expression.strip()
    name = text.removeprefix("#{").removesuffix("}")
    if not re.fullmatch(r"[a-z_]\w*", name):
        return text.strip('"')
    match = re.search(rf'^\s*{name} = "([^"]*)"$', VAGRANTFILE, flags=re.M)
    assert match, f"no value for {name} in the Vagrantfile"
    return match[1]


def test_vm_provisions_with_the_setup_script_ci_runs():
    rules = make_rules((REPO / "Makefile").read_text())
    # .ci/run's make targets and everything they depend on: CI always runs `make setup`.
    wanted = [word for line in (REPO / ".ci" / "run").read_text().splitlines()
              if line.strip().startswith("make ") for word in line.split()[1:]]
    reached: set[str] = set()
    while wanted:
        target = wanted.pop()
        if target not in reached:
            reached.add(target)
            wanted += rules[target][0]
    assert "setup" in reached
    setup_recipe = rules["setup"][1]

    provisioners = shell_provisioners()
    assert list(provisioners) == ["setup", "smoke"]
    setup, args = provisioners["setup"]
    assert setup[-len(setup_recipe):] == setup_recipe
    assert "privileged: false" not in VAGRANTFILE  # set-up runs as root, like `sudo make setup`

    # ... from the root of the repository as synced into the VM: the script's argument.
    synced = re.search(r'config\.vm\.synced_folder "\.\.", ([^,]+),', VAGRANTFILE)
    assert synced, "the repository (the Vagrantfile's parent folder) is not synced"
    assert [line for line in setup if line.startswith("cd ")] == ['cd "${1:?usage: setup.sh CHECKOUT}"']
    assert [ruby_string(arg) for arg in args] == [ruby_string(synced[1])]


def test_smoke_test_runs_real_mpft_commands():
    smoke, _ = shell_provisioners()["smoke"]
    commands = [shlex.split(line) for line in smoke if line.startswith(".venv/bin/mpft")]
    assert [argv[1] for argv in commands] == ["doctor", "topo"]
    for argv in commands:
        build_parser().parse_args(argv[1:])  # exits (fails the test) on an unknown command or option


def test_several_vms_for_a_cluster_run(validate, tmp_path):
    """MPFT_VM_COUNT=2 defines mpft1 and mpft2, with one key pair for root made in Vagrant's own state folder
    (here the test's), never in the repository; a bad count is refused by name."""
    before = sorted(p.name for p in VAGRANT_DIR.iterdir())
    result = validate(MPFT_VM_COUNT="2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "mpft1" in result.stdout and "mpft2" in result.stdout
    assert sorted(p.name for p in (tmp_path / "dotfile" / "mpft-cluster").iterdir()) == ["id_ed25519",
                                                                                          "id_ed25519.pub"]
    assert sorted(p.name for p in VAGRANT_DIR.iterdir()) == before
    refused = validate(MPFT_VM_COUNT="none")
    assert refused.returncode != 0
    assert "MPFT_VM_COUNT must be a positive whole number" in refused.stdout + refused.stderr


def test_the_several_vms_provisioning_is_valid_shell(tmp_path):
    """The script that hands each VM the key and the names, as Ruby renders it, and the jumbo MTU's (a file the
    VM check runs too, on the same prefix the Vagrantfile passes), parse as sh."""
    ruby = shutil.which("ruby")
    if ruby is None:
        pytest.skip("no ruby (Debian's vagrant package brings it)")
    render = ('src = File.read(ARGV[0]); eval(src.scan(/^def mpft_cluster_script.*?^end\\n/m).join); '
              'File.write(ARGV[1], mpft_cluster_script(3, "192.168.56", "-----KEY-----\\nx\\n", "ssh-ed25519 A c"))')
    cluster, jumbo = tmp_path / "cluster.sh", VAGRANT_DIR / "provision" / "jumbo.sh"
    subprocess.run([ruby, "-e", render, str(VAGRANT_DIR / "Vagrantfile"), str(cluster)], check=True)
    for script in (cluster, jumbo):
        checked = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
    assert "192.168.56.13 mpft3" in cluster.read_text() and "Host mpft1 mpft2 mpft3" in cluster.read_text()
    assert "mtu 9100" in jumbo.read_text()
    assert 'path: "provision/jumbo.sh", args: [cluster_net]' in VAGRANTFILE


def _vm_check():
    spec = importlib.util.spec_from_file_location("vm_check", VAGRANT_DIR / "qemu" / "check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    return check


def test_the_vm_check_fails_on_anything_but_a_pass_or_a_newer_kernels_skip():
    """A pass that says more (a cluster run's verdict) is a pass; any other skip fails: the guest has every feature."""
    check = _vm_check()
    results = [("a", "passed"), ("servers::all pairs", "passed: CPU-BOUND in ...; its clock moved +1 us"),
               ("b", "skipped: only on a newer kernel: tc programs get bpf_get_netns_cookie from Linux 6.15"),
               ("c", "skipped: no netem"), ("d", "failed: assert 1 == 2"), ("servers::quick study", "failed: exit 1")]
    assert check.failures(results) == ["c", "d", "servers::quick study"]


@pytest.mark.skipif(os.geteuid() != 0, reason="making a bridge needs root")
def test_the_vm_check_replaces_the_bridge_a_killed_check_left(capsys):
    """A check killed mid-run (SIGKILL: no finally) leaves its bridge behind; the next one removes it, says so, and
    takes nothing else."""
    check = _vm_check()
    with check.LOCK.open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pytest.skip("a vm-check is running on this machine")
        subprocess.run(["ip", "link", "add", check.BRIDGE, "type", "bridge"], check=True)
        try:
            with check.private_network():
                assert Path(f"/sys/class/net/{check.TAP}/master").resolve().name == check.BRIDGE
        finally:
            subprocess.run(["ip", "link", "del", check.BRIDGE], capture_output=True, check=False)
    assert f"removing {check.BRIDGE}, left by a check that was killed" in capsys.readouterr().out
    assert check.links(check.BRIDGE, check.TAP) == []
