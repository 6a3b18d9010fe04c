"""The ``p2pcrawl`` command: join, seed, leave, status, export and demo."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sqlite3
import sys
from collections.abc import Sequence
from typing import Any

from p2pcrawl.network import DataDirError
from p2pcrawl.settings import SettingsError
from p2pcrawl.ui.client import run_client
from p2pcrawl.ui.join import run_join
from p2pcrawl.ui.logs import say, setup_logging
from p2pcrawl.ui.options import EXIT_FAILURE, EXIT_USAGE, UsageError, build_parser, merge_config

__all__ = ["describe", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; any failure is one line on stderr and a non-zero exit status.

    ``--debug`` adds the traceback, for a bug report.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        print(f"p2pcrawl: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return _run(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        # --debug adds the traceback: printed, or the record's "exc" with JSON logs.
        say(f"p2pcrawl: error: {describe(exc)}", logging.ERROR, exc if args.debug else None)
        return EXIT_USAGE if isinstance(exc, UsageError | SettingsError) else EXIT_FAILURE


def _run(args: Any) -> int:
    if args.command == "join":
        opts = merge_config(args)
        setup_logging(opts["log_level"], opts["log_format"])
        return asyncio.run(run_join(opts))
    # The demo prints its own progress; library chatter would drown it.
    default_level = "warning" if args.command == "demo" else "info"
    setup_logging(args.log_level or default_level, args.log_format or "text")
    if args.command == "demo":
        from p2pcrawl.ui.demo import run_demo

        return asyncio.run(run_demo(args))
    if args.command == "export":
        return _export(args)
    return asyncio.run(run_client(args))


def describe(exc: BaseException) -> str:
    """One line for a person: what failed, without the stack."""
    if isinstance(exc, UsageError | SettingsError | OSError | DataDirError):
        # OSError covers StoreUnwritable (disk full, read-only) and the like; its text
        # already names the path and the reason.
        return " ".join(str(exc).split())
    if isinstance(exc, sqlite3.Error):
        return f"the data directory's stores failed: {exc}"
    text = " ".join(str(exc).split()) or "(no message)"
    return f"{type(exc).__name__}: {text} (run with --debug for the traceback)"


def _export(args: argparse.Namespace) -> int:
    from p2pcrawl.ui.changes import parse_since
    from p2pcrawl.ui.export import ExportError, run_export

    def note(message: str) -> None:
        print(f"p2pcrawl: warning: {message}", file=sys.stderr)

    try:
        since = None if args.changed_since is None else parse_since(args.changed_since)
        if args.output is None:
            run_export(args.sources, args.format, sys.stdout, note, changed_since=since)
        else:
            with args.output.open("w", encoding="utf-8") as out:
                n = run_export(args.sources, args.format, out, note, changed_since=since)
            print(f"wrote {n} lines to {args.output}", file=sys.stderr)
    except ExportError as exc:
        raise UsageError(str(exc)) from exc
    except BrokenPipeError:
        # `p2pcrawl export ... | head`: the reader has what it wanted. Point stdout at
        # /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
