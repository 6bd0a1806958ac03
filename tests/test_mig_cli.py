"""`infertune mig layout` and `infertune mig profiles`, called through their own parser."""

from __future__ import annotations

import argparse

import pytest
import yaml

from infertune.mig_cli import add_mig_commands, parse_slice


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="infertune")
    add_mig_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


@pytest.mark.parametrize(("text", "expected"), [
    ("3g.71gb", ("3g.71gb", 1)), ("2g.35gbx2", ("2g.35gb", 2)), ("2x2g.35gb", ("2g.35gb", 2)),
    ("1g.5gb+mex1", ("1g.5gb+me", 1)), ("1G.5GB", ("1g.5gb", 1)),
])
def test_slices_are_written_profile_then_count(text: str, expected: tuple[str, int]) -> None:
    assert parse_slice(text) == expected


@pytest.mark.parametrize("text", ["3g", "2x3g.20gbx2", "3g.20gbx0", "big"])
def test_malformed_slices_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_slice(text)


def test_feasible_layout_prints_a_mig_parted_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["mig", "layout", "--product", "NVIDIA-H200", "3g.71gb", "2g.35gbx2"]) == 0
    out = capsys.readouterr().out
    assert "# NVIDIA-H200, memory slices per GPU: 2g.35gb at 0-1, 2g.35gb at 2-3, 3g.71gb at 4-7" \
        in out
    config = yaml.safe_load(out)
    assert config["version"] == "v1"
    assert config["mig-configs"]["infertune-h200-1x3g.71gb-2x2g.35gb"] == [
        {"devices": "all", "mig-enabled": True, "mig-devices": {"3g.71gb": 1, "2g.35gb": 2}}]
    assert config["mig-configs"]["all-disabled"] == [{"devices": "all", "mig-enabled": False}]


def test_layout_name_can_be_given(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["mig", "layout", "--product", "NVIDIA-A100-SXM4-40GB", "1g.5gbx7",
                 "--name", "all-1g.5gb"]) == 0
    assert set(yaml.safe_load(capsys.readouterr().out)["mig-configs"]) == {"all-disabled",
                                                                          "all-1g.5gb"}


@pytest.mark.parametrize(("argv", "reason"), [
    (["--product", "NVIDIA-A100-SXM4-40GB", "4g.20gbx2"],
     "2x4g.20gb: at most 1 instance of 4g.20gb per GPU"),
    (["--product", "NVIDIA-A100-SXM4-40GB", "3g.71gb"], "3g.71gb does not exist on"),
    (["--product", "NVIDIA-A10", "1g.5gb"], "NVIDIA-A10 does not support MIG"),
])
def test_infeasible_layout_exits_1_with_the_reason(argv: list[str], reason: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["mig", "layout", *argv]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert reason in captured.err and "Traceback" not in captured.err


def test_a_product_name_is_said_without_its_control_characters(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["mig", "profiles", "X\x1b[31mRED\nfake"]) == 1
    assert capsys.readouterr().err.startswith("unknown GPU product X\\x1b[31mRED\\nfake; known:")
    assert _run(["mig", "layout", "--product", "X\nfake", "1g.18gb"]) == 1
    assert capsys.readouterr().err.startswith("infeasible: unknown GPU product X\\nfake; known:")


def test_profiles_lists_the_catalog_entry(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["mig", "profiles", "NVIDIA-H200-NVL"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("NVIDIA-H200: 7 compute slices, 8 memory slices")
    # The bytes sizing uses: what nvidia-smi mig -lgip reports on H200 (69.50 GiB).
    assert "3g.71gb            3      4   71   74625056768   2  0,4 (4)" in out


def test_profiles_marks_what_is_unverified(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["mig", "profiles", "NVIDIA-GB200"]) == 0
    assert "note: placements not confirmed by GB200 nvidia-smi mig -lgipp output" in \
        capsys.readouterr().out


@pytest.mark.parametrize(("product", "message"), [
    ("NVIDIA-H300", "unknown GPU product NVIDIA-H300; known: NVIDIA-A100-SXM4-40GB"),
    ("NVIDIA-L4", "NVIDIA-L4 does not support MIG"),
])
def test_profiles_of_an_unusable_product_exit_1(product: str, message: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["mig", "profiles", product]) == 1
    assert message in capsys.readouterr().err
