"""The chart's lists of `infertune run` options (templates/_helpers.tpl) against the command's
own: an option missing from them is refused in extraArgs, and one they name that the command
no longer has renders an operator that exits at start."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from infertune.cli import build_parser

HELPERS = Path(__file__).resolve().parent.parent / "charts" / "infertune" / "templates" / \
    "_helpers.tpl"


def _run_options() -> set[str]:
    (commands,) = [a for a in build_parser()._actions
                   if isinstance(a, argparse._SubParsersAction)]
    run = commands.choices["run"]
    return {o.removeprefix("--") for a in run._actions for o in a.option_strings
            if o.startswith("--")} - {"help"}


def test_the_chart_knows_every_option_of_infertune_run() -> None:
    text = HELPERS.read_text()
    chart_sets = re.search(r"\$chartSets := dict(.*?)-\}\}", text, re.DOTALL)
    user_sets = re.search(r"\$userSets := list(.*?)-\}\}", text, re.DOTALL)
    assert chart_sets is not None and user_sets is not None
    # dict "option" "value" ...: every other string is an option.
    chart = re.findall(r'"([^"]*)"', chart_sets.group(1))[::2]
    user = re.findall(r'"([^"]*)"', user_sets.group(1))
    assert not set(chart) & set(user)
    assert set(chart) | set(user) == _run_options()


def test_the_flags_the_chart_names_are_the_options_without_a_value() -> None:
    """extraArgs refuses `--verbose=true` and a bare `--kubeconfig` by this list: one out of
    step with the command let such an item through, and the operator exited at start."""
    text = HELPERS.read_text()
    user_sets = re.search(r"\$userSets := list(.*?)-\}\}", text, re.DOTALL)
    flags = re.search(r"\$flags := list(.*?)-\}\}", text, re.DOTALL)
    assert user_sets is not None and flags is not None
    (commands,) = [a for a in build_parser()._actions
                   if isinstance(a, argparse._SubParsersAction)]
    run = commands.choices["run"]
    takes_none = {o.removeprefix("--") for a in run._actions if a.nargs == 0
                  for o in a.option_strings if o.startswith("--")}
    user = set(re.findall(r'"([^"]*)"', user_sets.group(1)))
    assert set(re.findall(r'"([^"]*)"', flags.group(1))) == user & takes_none
