"""The `infertune` command line. Each subcommand is a few lines over the library."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from infertune import __version__

Command = Callable[[argparse.Namespace], int]


def _validate(args: argparse.Namespace) -> int:
    from infertune.api.manifests import validate_paths

    reports, unreadable = validate_paths(Path(p) for p in args.files)
    for line in unreadable:
        print(line, file=sys.stderr)
    checked = failed = 0
    for report in reports:
        if not report.checked:
            continue
        checked += 1
        if report.errors:
            failed += 1
            for line in report.lines():
                print(line, file=sys.stderr)
        elif not args.quiet:
            print(f"{report.document.source}: {report.document.label}: valid")
    if checked == 0 and not unreadable:
        print("no InferenceTuning found in the given files", file=sys.stderr)
        return 1
    if failed or unreadable:
        print(f"{failed + len(unreadable)} of {checked + len(unreadable)} failed", file=sys.stderr)
        return 1
    return 0


def _crds(args: argparse.Namespace) -> int:
    from infertune.api.crd import render_crds

    text = render_crds()
    if args.check is not None:
        current = Path(args.check).read_text(encoding="utf-8") if Path(args.check).exists() else ""
        if current != text:
            print(f"{args.check} is out of date with the models; run `make crds`", file=sys.stderr)
            return 1
        return 0
    if args.output is not None:
        Path(args.output).write_text(text, encoding="utf-8")
        return 0
    sys.stdout.write(text)
    return 0


def _run(args: argparse.Namespace) -> int:
    from infertune.controller.main import run_operator

    return run_operator(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="infertune",
        description="Tune the infrastructure under LLM inference servers and keep P99 in the SLO.",
    )
    parser.add_argument("--version", action="version", version=f"infertune {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    validate = commands.add_parser(
        "validate", help="check InferenceTuning manifests (exit 1 on any error)",
        description="Check InferenceTuning manifests, multi-document YAML included. Deployments "
        "in the same files are used to check containers and memory limits.",
    )
    validate.add_argument("files", nargs="+", metavar="FILE")
    validate.add_argument("-q", "--quiet", action="store_true", help="print errors only")
    validate.set_defaults(handler=_validate)

    crds = commands.add_parser("crds", help="print the CustomResourceDefinition")
    crds.add_argument("-o", "--output", help="write to this file instead of stdout")
    crds.add_argument("--check", metavar="FILE", help="exit 1 if FILE differs from the models")
    crds.set_defaults(handler=_crds)

    run = commands.add_parser("run", help="run the operator against the current kubeconfig")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then "
                     "$KUBECONFIG, then ~/.kube/config)")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", dest="namespaces",
                       help="watch only this namespace (repeatable)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch all namespaces "
                       "(the default)")
    run.add_argument("--liveness", default=None, metavar="URL",
                     help="serve kopf's liveness probe, for example http://0.0.0.0:8080/healthz")
    run.add_argument("--standalone", action="store_true",
                     help="do not take part in peering (one operator instance only)")
    run.add_argument("--verbose", action="store_true")
    run.set_defaults(handler=_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Command = args.handler
    return handler(args)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
