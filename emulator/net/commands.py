"""Running the system's network tools: in a named namespace or the root one. A tool that refuses a command our code
built is our fault (ToolFailed, with the command and what the tool said); a tool the machine lacks is the
machine's (EnvironmentProblem)."""

from __future__ import annotations

import subprocess

from emulator.model.errors import EnvironmentProblem, ToolFailed


def netns_path(name: str | None) -> str | None:
    """The file of a named network namespace (None: the root namespace)."""
    return None if name is None else f"/run/netns/{name}"


def in_netns(tool: str, netns: str | None) -> list[str]:
    """`ip` or `tc` working in a named namespace (None: the root namespace)."""
    return [tool, "-n", netns] if netns else [tool]


def in_netns_with_our_mounts(tool: str, netns: str | None) -> list[str]:
    """As in_netns, but the tool keeps our mount namespace: `-n` mounts a private /sys, without the BPF
    filesystem where tc pins the ECN marker's maps (emulator.net.marking)."""
    return ["nsenter", f"--net={netns_path(netns)}", tool] if netns else [tool]


def run_tool(argv: list[str], input_text: str | None = None, env: dict[str, str] | None = None) -> str:
    """Run a tool to completion; its output, or ToolFailed with what it said (EnvironmentProblem: no such tool)."""
    try:
        done = subprocess.run(argv, input=input_text, capture_output=True, text=True, check=False, env=env)
    except FileNotFoundError:
        raise EnvironmentProblem(f"this machine has no {argv[0]} (make setup installs what mpft-emu needs)") from None
    if done.returncode != 0:
        raise ToolFailed(argv, done.returncode, done.stderr or done.stdout)
    return done.stdout
