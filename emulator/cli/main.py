"""`mpft`: the command line. Bad input and a machine that lacks something are one line and exit code 2 (UserError,
EnvironmentProblem); our own fault is one line and exit code 1 (InternalError: with -v, the command a tool refused,
what it said and the traceback); interrupted, 130; terminated, 143."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys
import traceback

from emulator.cli import analysis, fabric, study, traffic
from emulator.cli.options import hand_to_sudo_user
from emulator.model.errors import InternalError, Terminated, ToolFailed, UserError


def _version() -> str:
    """The installed distribution's version (an editable install has one too)."""
    try:
        return importlib.metadata.version("mpft-emu")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mpft", description="Multi-plane fat-tree network emulator")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    parser.add_argument("--version", action="version", version=f"mpft {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for commands in (fabric, study, traffic, analysis):
        commands.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except UserError as exc:
        print(f"mpft: error: {exc}", file=sys.stderr)
        return 2
    except InternalError as exc:
        if args.verbose:
            if isinstance(exc, ToolFailed):
                print(f"mpft: the command: {exc.argv}\nmpft: it said:\n{exc.stderr.rstrip()}", file=sys.stderr)
            traceback.print_exc()
        more = "" if args.verbose else "; -v says more"
        print(f"mpft: internal error (a bug in mpft-emu: please report this line{more}): {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("mpft: interrupted; cleaned up", file=sys.stderr)
        return 130
    except Terminated:
        print("mpft: terminated; cleaned up", file=sys.stderr)
        return 143
    finally:
        if getattr(args, "results_dir", None) is not None:
            hand_to_sudo_user(args.results_dir)


if __name__ == "__main__":
    sys.exit(main())
