"""`infertune mig ...`: plan a MIG layout offline and print the mig-parted config for it.

cli.py adds these with `add_mig_commands(commands)`. Handlers print errors to stderr and return
1; they never raise for bad input.
"""

from __future__ import annotations

import argparse
import re
import sys

import yaml

from infertune.api.manifests import printable
from infertune.cli import count_type
from infertune.tuning.mig import (
    Infeasible,
    LayoutPlan,
    MigProduct,
    NonMigProduct,
    SliceRequest,
    load_catalog,
    plan_layout,
)
from infertune.tuning.migparted import config_name, render_mig_parted_config

# PROFILE[xCOUNT] as the brief of `mig layout` says; NxPROFILE is accepted too.
_SLICE = re.compile(r"^(?:(?P<before>[0-9]+)x)?(?P<profile>[0-9]+g\.[0-9]+gb(?:\+me)?)"
                    r"(?:x(?P<after>[0-9]+))?$")


def parse_slice(text: str) -> tuple[str, int]:
    """`3g.71gb`, `2g.35gbx2` or `2x2g.35gb` as (profile, count)."""
    match = _SLICE.match(text.strip().lower())
    if match is None or (match["before"] and match["after"]):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not PROFILE[xCOUNT]; write for example 3g.71gb or 2g.35gbx2")
    try:
        count = _COUNT(match["before"] or match["after"] or "1")
    except argparse.ArgumentTypeError as exc:
        shown = repr(text) if len(text) <= 40 else f"{text[:30]!r}..."
        raise argparse.ArgumentTypeError(f"{shown}: the count {exc}") from None
    return match["profile"], count


_COUNT = count_type("a count of instances", 1, 2**31 - 1)
"""A count as every count of the command line is read; one above what a GPU holds (7 at
most) is the planner's to refuse, naming the most."""


def _layout(args: argparse.Namespace) -> int:
    result = plan_layout(args.product, SliceRequest(tuple(args.slices)))
    if isinstance(result, Infeasible):
        print(f"infeasible: {printable(result.reason)}", file=sys.stderr)
        return 1
    name = args.name if args.name is not None else config_name(result.product, result)
    sys.stdout.write(_placement_comment(result))
    sys.stdout.write(yaml.safe_dump(render_mig_parted_config({name: result}), sort_keys=False))
    return 0


def _placement_comment(plan: LayoutPlan) -> str:
    placed = ", ".join(f"{i.profile} at {i.start}-{i.start + i.width - 1}"
                       for i in plan.instances)
    return f"# {plan.product}, memory slices per GPU: {placed}\n# {plan.reason}\n"


def _profiles(args: argparse.Namespace) -> int:
    catalog = load_catalog()
    found = catalog.lookup(args.product)
    if found is None:
        print(f"unknown GPU product {printable(args.product)}; known: "
              f"{', '.join(catalog.known_products)}", file=sys.stderr)
        return 1
    if isinstance(found, NonMigProduct):
        print(f"{printable(args.product)} does not support MIG", file=sys.stderr)
        return 1
    sys.stdout.write(_profile_table(found))
    return 0


def _profile_table(gpu: MigProduct) -> str:
    lines = [f"{gpu.product}: {gpu.compute_slices} compute slices, {gpu.memory_slices} memory "
             "slices" + (f" (aliases: {', '.join(gpu.aliases)})" if gpu.aliases else ""),
             f"{'PROFILE':<12} {'COMPUTE':>7} {'MEMORY':>6} {'GB':>4} {'BYTES':>13} {'MAX':>3}"
             "  STARTS (WIDTH)"]
    for p in gpu.profiles:
        starts = ",".join(str(s) for s in p.placements)
        lines.append(f"{p.name:<12} {p.compute_slices:>7} {p.memory_slices:>6} "
                     f"{p.memory_gb:>4} {p.memory_bytes:>13} {p.max_instances:>3}  "
                     f"{starts} ({p.memory_slices})")
    if gpu.unverified:
        lines.append(f"note: {gpu.unverified}")
    return "\n".join(lines) + "\n"


def _config_name(value: str) -> str:
    """--name: it becomes the nvidia.com/mig.config label value, and all-disabled is the
    config every rendered file already holds."""
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?", value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a label value: lowercase letters, digits, '-' and '.', at most "
            "63 characters, starting and ending with a letter or digit")
    if value == "all-disabled":
        raise argparse.ArgumentTypeError("all-disabled is the config that turns MIG off, and "
                                         "is always in the file; choose another name")
    return value


def add_mig_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add `mig layout` and `mig profiles` to an `add_subparsers()` result."""
    mig = commands.add_parser("mig", help="plan MIG layouts and print mig-parted configs")
    mig_commands = mig.add_subparsers(dest="mig_command", required=True, metavar="COMMAND")
    layout = mig_commands.add_parser(
        "layout", help="check a per-GPU layout and print its mig-parted config (exit 1 if "
        "infeasible)", description="Place the given MIG instances on one GPU of PRODUCT by "
        "NVIDIA's placement rules and print a mig-parted config for the GPU Operator.")
    layout.add_argument("--product", required=True,
                        help="nvidia.com/gpu.product value, for example NVIDIA-H200")
    layout.add_argument("slices", nargs="+", type=parse_slice, metavar="PROFILE[xCOUNT]",
                        help="a MIG profile and how many of it, for example 3g.71gb or "
                        "2g.35gbx2 (mig profiles PRODUCT lists them)")
    layout.add_argument("--name", type=_config_name, help="the mig-parted config name "
                        "(default: derived, label-safe, for the nvidia.com/mig.config node "
                        "label)")
    layout.set_defaults(handler=_layout)
    profiles = mig_commands.add_parser("profiles", help="list the MIG profiles of a GPU")
    profiles.add_argument("product", metavar="PRODUCT", help="nvidia.com/gpu.product value, "
                          "for example NVIDIA-H200")
    profiles.set_defaults(handler=_profiles)
