"""The `infertune` command line. Each subcommand is a few lines over the library."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

from infertune import __version__

Command = Callable[[argparse.Namespace], int]
DEFAULT_LAUNCHER_IMAGE = f"ghcr.io/infertune/infertune:{__version__}"
CLOSED_OUTPUT = 128 + 13
"""Exit status when the reader of the output closed it early: 128 + SIGPIPE, as a shell
reports a command that SIGPIPE ended."""
INTERRUPTED = 128 + 2
"""Exit status after Ctrl-C: 128 + SIGINT, as a shell reports a command that SIGINT ended."""


_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
"""A decimal number with the digits 0-9 (an exponent too): not `1_0`, `inf` or `nan`."""


def _quoted(text: str) -> str:
    """A value the command line gave that is not of its form, as an error shows it: quoted,
    its control characters escaped (repr), and a long one cut (it was printed whole)."""
    return repr(text) if len(text) <= 30 else f"{text[:20]!r}... ({len(text)} characters)"


def _cut(text: str, unit: str) -> str:
    """A value of the right form (digits) as an error shows it: a long one cut, with how many
    `unit` it has."""
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} {unit})"


def seconds_type(*, zero: bool = False, most: float = 86400.0) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds above 0, or 0 and more with `zero`, and at
    most `most` (a day by default: larger ones overflowed the clocks they wait on, with a
    traceback). Written as a decimal number (`30`, `0.5`, `1e3`): Python's float() also took
    `1_0` (ten), full-width digits and spaces around it, which no other tool reads as that
    number. argparse names the option in its error."""
    least = "0 or more" if zero else "above 0"

    def seconds(text: str) -> float:
        if _DECIMAL.fullmatch(text) is None:
            raise argparse.ArgumentTypeError(f"{_quoted(text)} is not a number of seconds written "
                                             "with the digits 0-9 (30, 0.5)")
        value = float(text)
        shown = _cut(text, "characters")
        if not (value >= 0 if zero else value > 0):  # past float's range it is inf: > most
            raise argparse.ArgumentTypeError(f"{shown} must be a number of seconds {least}")
        if value > most:
            raise argparse.ArgumentTypeError(f"{shown} must be at most {most:g} seconds")
        return value

    return seconds


def count_type(what: str, least: int, most: int, *,
               least_note: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number from `least` to `most` (`least_note` says what the
    least means), written with the digits 0-9, for every count and port of the command line.
    Python's int() also took 1_000, full-width digits (U+FF11 U+FF10) and spaces around them, which
    no other tool reads as a number, and refused more than 4300 digits in its own words;
    a count out of range was printed whole (thousands of digits). argparse names the option
    in the error; `what` names the count (a Deployment's replica count)."""
    shown_most = f"from {least}{least_note} to {most}"

    def count(text: str) -> int:
        if re.fullmatch(r"-?[0-9]+", text) is None:  # [0-9], not \d: ASCII digits only
            raise argparse.ArgumentTypeError(f"{_quoted(text)} is not a whole number written with "
                                             f"the digits 0-9; give {what} {shown_most}")
        if len(text.lstrip("-").lstrip("0")) > len(str(most)):  # no int() of 5000 digits
            raise argparse.ArgumentTypeError(f"{_cut(text, 'digits')} is not {what} {shown_most}")
        value = int(text)
        if not least <= value <= most:
            raise argparse.ArgumentTypeError(f"{value} is not {what} {shown_most}")
        return value

    return count


_IMAGE = re.compile(
    # A registry: a first component with a dot or a port, or localhost (else it is a path).
    r"(?:(?:localhost(?::[0-9]+)?|{host}(?:\.{host})+(?::[0-9]+)?|{host}:[0-9]+)/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"  # a tag
    r"(?:@(?:sha256:[a-f0-9]{64}|sha384:[a-f0-9]{96}|sha512:[a-f0-9]{128}))?"  # a digest
    .replace("{host}", "[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"))
"""An image reference as the container runtimes parse it (distribution's grammar)."""


def image_type(text: str) -> str:
    """An argparse type: an image reference, such as ghcr.io/infertune/infertune:0.1.0. An
    empty or malformed one went into the init container of every tuned pod, none of which
    could then start."""
    if len(text) > 255 or not _IMAGE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an image reference; for example "
            f"{DEFAULT_LAUNCHER_IMAGE} or registry.example.com:5000/infertune@sha256:<digest>")
    return text


def _validate(args: argparse.Namespace) -> int:
    from infertune.api.manifests import printable, validate_paths

    reports, unreadable = validate_paths(Path(p) for p in args.files)
    for line in unreadable:
        print(printable(line), file=sys.stderr)
    checked = failed = 0
    for report in reports:
        if not report.checked:
            continue
        checked += 1
        if report.errors:
            failed += 1
            for line in report.lines():
                print(printable(line), file=sys.stderr)
        elif not args.quiet:
            note = "" if report.unchecked is None else f" ({report.unchecked})"
            print(printable(f"{report.document.source}: {report.document.label}: valid{note}"))
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
    try:
        if args.check is not None:
            check = Path(args.check)
            if not check.exists():  # a typo in the path read as drift
                print(f"{args.check} does not exist; give the CRD file to compare (or write "
                      "it with `make crds`)", file=sys.stderr)
                return 1
            try:
                held = check.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                print(f"{args.check} is not UTF-8 text; give the CRD file to compare (or write "
                      "it with `make crds`)", file=sys.stderr)
                return 1
            if held != text:
                # `make crds` writes the repository's two copies only, and the file given may
                # be no CRD at all.
                print(f"{args.check} differs from the CRD the models generate; write it with "
                      f"`infertune crds -o {args.check}` (in this repository: `make crds`)",
                      file=sys.stderr)
                return 1
            return 0
        if args.output is not None and args.output != "-":  # -: standard output, as kubectl
            _write_whole(Path(args.output), lambda staged: staged.write_text(text,
                                                                             encoding="utf-8"))
            return 0
    except (OSError, UnicodeDecodeError) as exc:
        where = args.check if args.check is not None else args.output
        print(f"{where}: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


def path_type(advice: str) -> Callable[[str], str]:
    """An argparse type: a file path that is not empty (`--option "$VAR"` with the variable
    unset), refused with `advice`, which says what to give. argparse names the option."""

    def path(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"an empty path; {advice}")
        return text

    return path


kubeconfig_option = path_type(
    "give a kubeconfig file, or leave the option out for the default credentials "
    "(in-cluster, then $KUBECONFIG, then ~/.kube/config)")
"""--kubeconfig: an empty one was taken as not given, and the default credentials then
reached whatever cluster they name."""


def _run(args: argparse.Namespace) -> int:
    from infertune.controller.main import run_operator

    return run_operator(args)


def _plan(args: argparse.Namespace) -> int:
    from infertune.planning import PlanInputError, plan_from_files

    if args.mig_strategy is not None and args.mig_profile is None:
        # Without a profile the pod keeps its GPU request: the strategy would change nothing,
        # and taken silently it read as applied.
        print("infertune plan: error: --mig-strategy goes with --mig-profile (the slice the "
              "strategy names is the profile's); give both, or leave --mig-strategy out",
              file=sys.stderr)
        return 2
    try:
        text = plan_from_files(Path(args.tuning), Path(args.pod), args.launcher_image,
                               as_json=args.output == "json",
                               static_cpu_manager=not args.no_static_cpu_manager,
                               mig_profile=args.mig_profile, mig_strategy=args.mig_strategy)
    except PlanInputError as exc:
        print(str(exc), file=sys.stderr)  # each line escaped (PlanInputError)
        return 1
    sys.stdout.write(text)
    return 0


def _allocator_check(args: argparse.Namespace) -> int:
    from infertune.api.manifests import printable
    from infertune.tuning.mallocconf import check_malloc_conf, new_in_5_3

    if args.pinned and args.cpus is None:
        print("--pinned needs --cpus N", file=sys.stderr)
        return 2
    problems = check_malloc_conf(args.conf, cpus=args.cpus, pinned=args.pinned)
    for problem in problems:
        print(printable(f"MALLOC_CONF: {problem.message}"), file=sys.stderr)
    if not problems:
        print(f"MALLOC_CONF {args.conf!r}: valid for jemalloc 5.3")
        newer = new_in_5_3(args.conf)
        if newer:
            print(f"note: {', '.join(newer)} {'is' if len(newer) == 1 else 'are'} new in "
                  "jemalloc 5.3: 5.2 (Ubuntu 22.04, Debian 11) ignores "
                  f"{'it' if len(newer) == 1 else 'them'}, and aborts with abort_conf:true")
    return 1 if problems else 0


MOST_CPUS = 2**16
"""The most CPUs --cpus takes (Linux's NR_CPUS is at most 8192): jemalloc counts them in an
unsigned, and a count past it wrapped around in what the check said."""


def _launcher_file() -> Path:
    return Path(__file__).resolve().parent / "launcher" / "infertune-launch"


def _write_whole(path: Path, fill: Callable[[Path], object]) -> None:
    """`path` made whole or not at all: `fill` writes a file beside it, which is renamed over
    it, so a write that fails (a full disk, a quota) leaves the file as it was (`crds -o`
    emptied it, then cut it short: a CRD of 20 KiB where there had been 64). A symbolic
    link's target is written, not the link replaced."""
    path = Path(os.path.realpath(path))
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        fill(staged)
        os.replace(staged, path)
    finally:
        with contextlib.suppress(OSError):  # nothing left behind by a failed try
            staged.unlink(missing_ok=True)


def _launcher_install(args: argparse.Namespace) -> int:
    import shutil

    if not args.directory:  # a usage error, exit 2 as argparse's (the fast path skips it)
        print("infertune launcher install: error: DIR is empty; give the directory the "
              "serving container mounts (the init container's emptyDir)", file=sys.stderr)
        return 2
    target = Path(args.directory) / "infertune-launch"
    if target.parent.exists() and not target.parent.is_dir():
        print(f"launcher install {args.directory}: not a directory; give the directory the "
              "serving container mounts (the init container's emptyDir)", file=sys.stderr)
        return 1

    def fill(staged: Path) -> None:
        shutil.copyfile(_launcher_file(), staged)
        staged.chmod(0o555)

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        # Copied beside it and renamed over it: the init container runs again after a sandbox
        # restart, into the same emptyDir, where the copy it made is read-only (0555).
        _write_whole(target, fill)
    except OSError as exc:
        # The init container's log is where this is read: a line, not a traceback.
        print(f"launcher install {args.directory}: {exc.strerror or exc} "
              f"({exc.filename or target}); the launcher needs a directory it can write "
              "(the init container's emptyDir)", file=sys.stderr)
        return 1
    print(f"installed {target}")
    return 0


def _launcher_path(args: argparse.Namespace) -> int:
    print(_launcher_file())
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose --help, --version and usage messages say a failed write: its
    own drops an OSError, and `infertune --version > /dev/full` exited 0 having written
    nothing. The subcommands' parsers are of this class too (add_subparsers takes the
    parent's)."""

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        if file is None or file is sys.stderr:  # a usage error: exit 2 whatever stderr is
            super()._print_message(message, file)
        elif message:
            file.write(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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
    validate.add_argument("files", nargs="+", metavar="FILE",
                          help="YAML files; - reads standard input")
    validate.add_argument("-q", "--quiet", action="store_true", help="print errors only")
    validate.set_defaults(handler=_validate)

    crds = commands.add_parser("crds", help="print the CustomResourceDefinition")
    # One or the other: given both, the file was silently not written.
    where = crds.add_mutually_exclusive_group()
    where.add_argument("-o", "--output", metavar="FILE", type=path_type(
        "give the file to write, or leave -o out to print to standard output"),
        help="write to this file instead of stdout (- for stdout)")
    # An empty one said ": Is a directory" (the current directory, read).
    where.add_argument("--check", metavar="FILE", type=path_type(
        "give the CRD file to compare, for example crds/infertune.io_inferencetunings.yaml"),
        help="exit 1 if FILE differs from the models")
    crds.set_defaults(handler=_crds)

    _add_run_command(commands)
    _add_plan_command(commands)
    _add_allocator_command(commands)

    from infertune.autoscale_cli import add_autoscale_commands
    from infertune.mig_cli import add_mig_commands

    add_mig_commands(commands)
    add_autoscale_commands(commands)

    _add_launcher_command(commands)
    return parser


def _add_run_command(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`infertune run`: the operator itself."""
    from infertune.metrics.access import add_access_options, add_templates_option

    run = commands.add_parser("run", help="run the operator (credentials: --kubeconfig, else "
                              "in-cluster, else $KUBECONFIG or ~/.kube/config)")
    run.add_argument("--kubeconfig", metavar="PATH", type=kubeconfig_option,
                     help="kubeconfig file (default: in-cluster, then $KUBECONFIG, then "
                     "~/.kube/config)")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", dest="namespaces", metavar="NS",
                       help="watch only this namespace, or the namespaces a kopf pattern "
                       "such as 'team-*' matches (repeatable)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch all namespaces "
                       "(the default)")
    run.add_argument("--liveness", default=None, metavar="URL",
                     help="serve kopf's liveness probe, for example http://0.0.0.0:8080/healthz")
    run.add_argument("--metrics-port", type=count_type("a port", 1, 65535), default=None,
                     metavar="PORT",
                     help="serve the operator's own Prometheus metrics (each tuning's replicas, "
                     "signals, conditions, scale writes) at http://ADDR:PORT/metrics; "
                     "default: not served")
    run.add_argument("--metrics-addr", default="0.0.0.0", metavar="ADDR",
                     help="the address --metrics-port listens on (default 0.0.0.0)")
    run.add_argument("--standalone", action="store_true",
                     help="do not take part in kopf's peering (the chart runs the operator so)")
    run.add_argument("--leader-elect", action="store_true",
                     help="run the autoscaling, re-tuning and MIG loops only while holding a "
                     "Lease in the operator's namespace, so that the old and the new operator "
                     "of a rolling upgrade never both run them (the chart sets it)")
    run.add_argument("--leader-elect-lease", default=None, metavar="NAME",
                     help="the Lease's name (default infertune-operator); operators that share "
                     "a namespace but not their tunings need one each")
    run.add_argument("--verbose", action="store_true",
                     help="log at debug level, kopf's own steps included")
    run.add_argument("--operator-namespace", metavar="NS",
                     help="the operator's own namespace, never tuned "
                     "(default: $INFERTUNE_NAMESPACE or infertune-system)")
    run.add_argument("--launcher-image", default=DEFAULT_LAUNCHER_IMAGE, type=image_type,
                     metavar="IMAGE", help="image of the init container that installs the "
                     f"launcher (default {DEFAULT_LAUNCHER_IMAGE}); with a tuning in mode "
                     "Enforce it must be one the nodes can pull")
    run.add_argument("--no-static-cpu-manager", action="store_true",
                     help="kubelets do not run the static CPU manager: skip the QoS checks")
    run.add_argument("--retune-interval", type=seconds_type(), metavar="SECONDS",
                     help="how often outdated pods are looked for (default 10)")
    run.add_argument("--crd-check-interval", type=seconds_type(), metavar="SECONDS",
                     default=None,
                     help="how often the installed InferenceTuning CRD is read again to tell "
                          "whether it would drop fields of this release's schema (also at "
                          "start; default 60)")
    run.add_argument("--mig-config-delay", type=seconds_type(zero=True), metavar="SECONDS",
                     default=None,
                     help="how long after a config goes into the mig-parted ConfigMap before "
                          "a node is labelled for it: the kubelet updates mig-manager's "
                          "mounted copy within about a minute (default 120)")
    run.add_argument("--mig-drain-other-namespaces", action="store_true",
                     help="let a tuning with spec.mig.allowDisruption evict the GPU pods of "
                          "every namespace on the nodes it drains; without it, a node that "
                          "runs another namespace's GPU pods is left alone (busy), so that "
                          "whoever may create an InferenceTuning cannot evict other teams' "
                          "pods (the chart's mig.drainOtherNamespaces)")
    run.add_argument("--no-mig", action="store_true",
                     help="no MIG partitioning: spec.mig is not acted on, and nodes are never "
                          "patched nor pods evicted outside the tunings' namespaces (the "
                          "chart's mig.enabled=false, which also leaves MIG's permissions out)")
    metrics = run.add_argument_group("Prometheus")
    metrics.add_argument("--prometheus-url", metavar="URL", help="Prometheus the autoscaler "
                         "queries (default: $INFERTUNE_PROMETHEUS_URL; without it autoscaling "
                         "is reported as inactive)")
    add_access_options(metrics)
    add_templates_option(metrics)
    hook = run.add_argument_group("admission webhook")
    hook.add_argument("--webhook-addr", default="0.0.0.0", metavar="ADDR",
                      help="listen address (default 0.0.0.0)")
    hook.add_argument("--webhook-port", type=count_type("a port", 0, 65535,
                                                        least_note=" (any free port)"),
                      default=9443, metavar="PORT",
                      help="listen port (default 9443; 0: any free port)")
    hook.add_argument("--webhook-host", metavar="HOST", help="host name or IP the API "
                      "server connects to (default: the listen address; for 0.0.0.0 or ::, "
                      "this machine's address on its route to the API server)")
    hook.add_argument("--webhook-service", metavar="NS/NAME:PORT",
                      help="register the webhook through this Service (in-cluster)")
    hook.add_argument("--webhook-owner", metavar="CLUSTERROLE",
                      help="a ClusterRole that owns the webhook configuration: deleting it "
                      "(helm uninstall) deletes the configuration too (the chart sets its own)")
    hook.add_argument("--webhook-cert", metavar="PEM", help="serving certificate (for example from "
                      "cert-manager); default: a generated self-signed one")
    hook.add_argument("--webhook-key", metavar="PEM", help="private key of --webhook-cert")
    hook.add_argument("--webhook-ca", metavar="PEM", help="CA bundle the API server verifies with "
                      "(default: the certificate itself)")
    hook.add_argument("--webhook-check-interval", type=seconds_type(), default=30.0,
                      metavar="SECONDS", help="how often the webhook configuration is checked, "
                      "and registered again if another operator process removed it "
                      "(default 30)")
    hook.add_argument("--ready-file", type=Path, metavar="PATH",
                      help="a file that exists while the webhook configuration is registered "
                      "for this process, for a readiness probe (the chart's: test -f PATH); "
                      "the webhook port listens before the registration is made")
    run.set_defaults(handler=_run)


def _add_plan_command(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    plan = commands.add_parser(
        "plan", help="show the patch the webhook would apply to a pod, and why",
        description="Run the pod-tuning planner the webhook runs on one pod.")
    plan.add_argument("tuning", metavar="TUNING.yaml", help="- reads standard input")
    plan.add_argument("--pod", required=True, metavar="POD.yaml",
                      help="a Pod, or a Deployment whose pod template is used (- for "
                      "standard input, which may also hold the tuning)")
    plan.add_argument("--output", choices=("text", "json"), default="text",
                      help="text (default): the revision, reasons, problems and the patch; "
                      "json: {patch, reasons, problems, revision, refused}")
    plan.add_argument("--launcher-image", default=DEFAULT_LAUNCHER_IMAGE, type=image_type,
                      metavar="IMAGE", help="as for run: the image of the init container "
                      f"that installs the launcher (default {DEFAULT_LAUNCHER_IMAGE})")
    plan.add_argument("--no-static-cpu-manager", action="store_true",
                      help="as for run: kubelets do not run the static CPU manager, so the QoS "
                      "checks are skipped (the webhook of an operator run so skips them)")
    plan.add_argument("--mig-profile", metavar="PROFILE",
                      help="with spec.mig: the MIG profile the tuning's pods get once the "
                      "operator has planned the layout (status.mig.profile in the cluster), "
                      "for example 2g.35gb; the patch then requests that slice. Without it "
                      "the pod keeps its GPU request, as before the layout is planned")
    plan.add_argument("--mig-strategy", choices=("mixed", "single"),
                      help="with --mig-profile: the MIG strategy of the nodes "
                      "(status.mig.strategy: the selected nodes' nvidia.com/mig.strategy "
                      "label when they agree, else spec.mig.strategy); default "
                      "spec.mig.strategy. Under single the pod keeps nvidia.com/gpu, and a "
                      "layout of more than one profile cannot be planned")
    plan.set_defaults(handler=_plan)


def _add_allocator_command(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    allocator = commands.add_parser("allocator", help="allocator tools")
    allocator_commands = allocator.add_subparsers(dest="allocator_command", required=True,
                                                  metavar="COMMAND")
    check = allocator_commands.add_parser(
        "check", help="check a jemalloc 5.3 MALLOC_CONF string (exit 1 if invalid)")
    check.add_argument("conf", metavar="STRING", help="the MALLOC_CONF value, for example "
                       "'background_thread:true,dirty_decay_ms:5000'")
    check.add_argument("--cpus", type=count_type("a number of CPUs", 1, MOST_CPUS),
                       metavar="N",
                       help="the CPUs the process may run on (its affinity mask, not its CPU "
                            "limit); checks what depends on them, such as narenas_ratio")
    check.add_argument("--pinned", action="store_true",
                       help="with --cpus: the process is pinned to some of the node's CPUs "
                            "(numactl, the static CPU manager)")
    check.set_defaults(handler=_allocator_check)


def _add_launcher_command(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    launcher = commands.add_parser("launcher", help="the in-container NUMA launcher")
    launcher_commands = launcher.add_subparsers(dest="launcher_command", required=True,
                                                metavar="COMMAND")
    install = launcher_commands.add_parser(
        "install", help="copy the launcher into DIR (the init container runs this)")
    install.add_argument("directory", metavar="DIR", help="the directory the serving "
                         "container mounts (the init container's emptyDir); made if missing")
    install.set_defaults(handler=_launcher_install)
    path = launcher_commands.add_parser("path", help="print where the launcher script is")
    path.set_defaults(handler=_launcher_path)


def main(argv: Sequence[str] | None = None) -> int:
    if sys.stdout is None:  # started with stdout closed (`>&-`): a traceback at the first write
        print("infertune: standard output is closed", file=sys.stderr)
        return 1
    given = list(sys.argv[1:] if argv is None else argv)
    if len(given) == 3 and given[:2] == ["launcher", "install"] and not given[2].startswith("-"):
        # The init container of every tuned pod runs this under a 50m CPU limit: the whole
        # parser imports the API models (0.3 s of CPU, some 6 s of wall time there), and the
        # serving container waited for it.
        return _launcher_install(argparse.Namespace(directory=given[2]))
    try:
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:
        # Ctrl-C in the first half second (the parser imports the models): a traceback.
        _interrupted()
    except OSError as exc:  # writing --help or --version (_Parser)
        return _output_failed(exc)
    except SystemExit:
        # --help, --version and usage errors: argparse writes, then exits. Flushed here, so
        # that a full device or a reader gone is said as after any command (`--version >
        # /dev/full` exited 0 with nothing written).
        try:
            sys.stdout.flush()
        except OSError as exc:
            return _output_failed(exc)
        raise
    handler: Command = args.handler
    if handler is _run:  # a broken pipe there is a connection's, not the output's
        return handler(args)
    interrupts = _Interrupts()
    try:
        with interrupts:
            code = handler(args)
        # Flushed here, so that a reader that went away is seen below and not by the
        # interpreter's final flush (which prints a traceback and exits 120).
        sys.stdout.flush()
    except KeyboardInterrupt:
        _interrupted()
    except OSError as exc:
        return _output_failed(exc)
    return code


def _output_failed(exc: OSError) -> int:
    """The exit status when writing the output failed; `exc` raised again when it is not the
    output's (not a closed reader, not a full or failing device)."""
    if isinstance(exc, BrokenPipeError):
        # `infertune validate many.yaml | head -1`: the reader has what it wanted. Quiet, as
        # a shell tool that SIGPIPE ends; stdout goes to /dev/null so that flushing what is
        # left at exit cannot fail again.
        _output_to_devnull()
        return CLOSED_OUTPUT
    if exc.errno not in OUTPUT_FULL:
        raise exc
    # `infertune crds > /dev/full`, a full disk: said, not a traceback.
    _output_to_devnull()
    print(f"infertune: cannot write the output: {exc.strerror}", file=sys.stderr)
    return 1


def _interrupted() -> NoReturn:
    """Ctrl-C while a query waits for a Prometheus that does not answer: one line and the
    shell's code for SIGINT, at once. It printed a traceback and then waited out the query's
    timeout, as the interpreter joins the query threads before it exits."""
    # Called from the signal handler: whatever fails here must not reach the main thread (a
    # command that takes any exception for no data goes on), so the exit comes in any case.
    # RuntimeError: the main thread was writing to stdout ("reentrant call"); the line goes
    # to the descriptor, past stderr's buffer.
    try:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        with contextlib.suppress(Exception):
            os.write(2, b"infertune: interrupted\n")
    finally:
        os._exit(INTERRUPTED)


class _Interrupts:
    """While entered, Ctrl-C ends the command at once, as interrupted (`_interrupted`), from
    the signal handler. Raised as a KeyboardInterrupt, one that landed inside a lock's
    release (the main thread starting a query's thread) left the lock broken, and what
    reached main() was "RuntimeError: release unlocked lock", with a traceback; where the
    command caught it (the adapter takes any exception of a query for no data) it went on,
    and waited out the other queries' timeout (60 s in the test, about one run in a hundred)
    before it ended. Left alone where SIGINT is not Python's (ignored, as in a shell's
    background job), and off the main thread, where no handler can be set."""

    def __init__(self) -> None:
        self._before: Any = None

    def __enter__(self) -> None:
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._before = signal.signal(signal.SIGINT, self._interrupt)

    def __exit__(self, *exc: object) -> None:
        if self._before is not None:
            signal.signal(signal.SIGINT, self._before)
            self._before = None

    def _interrupt(self, signum: int, frame: FrameType | None) -> None:
        _interrupted()


OUTPUT_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})
"""The errors of a write to standard output that end a command with a message: the output's
device is full or failing."""


def _output_to_devnull() -> None:
    """Standard output goes to /dev/null, so that flushing what is left at exit cannot fail
    again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    with contextlib.suppress(OSError, ValueError):  # stdout is no file (a test's capture)
        os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
