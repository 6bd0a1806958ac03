"""Bad input to the CLI is a message naming the file and the field, and an exit status; never
a traceback."""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from infertune.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "vllm-qwen2-7b-h200-mig.yaml"
DOCS = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
TUNING = next(d for d in DOCS if d["kind"] == "InferenceTuning")
TARGET = next(d for d in DOCS if d["kind"] == "Deployment")


def deployment(name: str, spec: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": TUNING["metadata"]["namespace"]},
            "spec": spec}


def written(tmp_path: Path, *docs: dict[str, Any]) -> str:
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return str(path)


def test_plan_takes_the_deployment_the_tuning_targets(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = deployment("other", {"template": {"spec": {"containers": [{"name": "x"}]}}})
    path = written(tmp_path, other, TARGET, TUNING)
    assert main(["plan", path, "--pod", path]) == 0  # took "other" before: container not found
    assert "serving container: vllm" in capsys.readouterr().out
    two = written(tmp_path, other, deployment("another", other["spec"]), TUNING)
    assert main(["plan", two, "--pod", two]) == 1
    assert "no Deployment named qwen2-7b (spec.targetRef.name) among another, other" in \
        capsys.readouterr().err


@pytest.mark.parametrize(("spec", "says"), [
    ([1], "spec.template must be a mapping"),
    ({"template": 5}, "spec.template must be a mapping"),
    ({"template": {"spec": {"containers": "abc"}}},
     "spec.template.spec.containers must be a list of mappings"),
    ({"template": {"metadata": {"annotations": [1]}, "spec": {"containers": []}}},
     "spec.template.metadata.annotations must be a mapping"),
    ({"template": {"spec": {"containers": [{"name": "vllm", "resources": [1]}]}}},
     "spec.template.spec.containers[0].resources must be a mapping"),
    # These failed inside the planner with a traceback.
    ({"template": {"metadata": {"labels": 0}, "spec": {"containers": []}}},
     "spec.template.metadata.labels must be a mapping"),
    ({"template": {"metadata": {"annotations": ""}, "spec": {"containers": []}}},
     "spec.template.metadata.annotations must be a mapping"),
    ({"template": {"metadata": [], "spec": {"containers": []}}},
     "spec.template.metadata must be a mapping"),
    ({"template": {"spec": {"containers": [{"name": "vllm", "env": [1, 2]}]}}},
     "spec.template.spec.containers[0].env must be a list of mappings"),
    ({"template": {"spec": {"containers": [{"name": "vllm", "command": ["vllm"],
                                            "resources": {"limits": {"cpu": "abc"}}}]}}},
     "spec.template.spec.containers[0].resources.limits.cpu: 'abc' is not a Kubernetes "
     "quantity"),
    # The API server takes strings only; a nested list was printed out in full.
    ({"template": {"spec": {"containers": [{"name": "vllm", "command": ["vllm"],
                                            "args": ["--port", 8000]}]}}},
     "spec.template.spec.containers[0].args[1] must be a string (quote a number"),
    ({"template": {"spec": {"containers": [{"name": "vllm", "command": [["vllm"]]}]}}},
     "spec.template.spec.containers[0].command[0] must be a string"),
    # These failed inside the planner with a traceback too.
    ({"template": {"spec": {"nodeSelector": ["gpu"], "containers": [{"name": "vllm"}]}}},
     "spec.template.spec.nodeSelector must be a mapping"),
    ({"template": {"spec": {"containers": [{"name": "vllm"}],
                            "initContainers": [{"name": "fetch", "resources": [1]}]}}},
     "spec.template.spec.initContainers[0].resources must be a mapping"),
    ({"template": {"spec": {"containers": [{"name": "vllm", "envFrom": ["secret"]}]}}},
     "spec.template.spec.containers[0].envFrom must be a list of mappings"),
])
def test_plan_names_a_malformed_pod_template(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             spec: Any, says: str) -> None:
    path = written(tmp_path, deployment("qwen2-7b", spec), TUNING)
    assert main(["plan", str(EXAMPLE), "--pod", path]) == 1
    assert says in capsys.readouterr().err


def test_plan_takes_init_containers_left_empty(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """`initContainers:` with no value (YAML's null), which kubectl takes: `plan` failed
    with a TypeError."""
    template = {"template": {"spec": {"initContainers": None, "containers": [{
        "name": "vllm", "command": ["vllm", "serve", "qwen"],
        "resources": {"limits": {"cpu": "4", "memory": "48Gi"}}}]}}}
    path = written(tmp_path, deployment("qwen2-7b", template), TUNING)
    assert main(["plan", str(EXAMPLE), "--pod", path]) == 0
    assert "serving container: vllm" in capsys.readouterr().out


def test_plan_names_a_deployment_whose_metadata_is_not_a_mapping(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = {**deployment("qwen2-7b", {"template": {"spec": {"containers": []}}}),
              "metadata": [1]}
    path = written(tmp_path, broken, TUNING)
    assert main(["plan", str(EXAMPLE), "--pod", path]) == 1
    assert "metadata must be a mapping" in capsys.readouterr().err


@pytest.mark.parametrize("spec", [[1], {"template": 5},
                                  {"template": {"spec": {"containers": "abc"}}},
                                  {"template": {"spec": {"containers": [
                                      {"name": "vllm", "resources": [1]}]}}}])
def test_validate_names_a_malformed_deployment(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str],
                                               spec: Any) -> None:
    path = written(tmp_path, deployment("qwen2-7b", spec), TUNING)
    assert main(["validate", path]) == 1
    assert "spec.targetRef.name: " in capsys.readouterr().err


@pytest.mark.parametrize(("content", "says"), [
    (b"\xff\xfe", "not UTF-8 text"),
    (b"[" * 5000, "nested too deeply"),
])
@pytest.mark.parametrize("command", ["validate", "plan"])
def test_a_file_that_is_no_manifest_is_named(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str],
                                             content: bytes, says: str, command: str) -> None:
    path = tmp_path / "odd.yaml"
    path.write_bytes(content)
    argv = [command, str(path)] + (["--pod", str(EXAMPLE)] if command == "plan" else [])
    assert main(argv) == 1
    out = capsys.readouterr()
    assert f"{path}: {says}" in out.out + out.err


def test_crds_into_a_directory_is_an_error_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crds", "-o", str(tmp_path)]) == 1
    assert main(["crds", "--check", str(tmp_path)]) == 1
    assert "Is a directory" in capsys.readouterr().err
    # A typo in the path read as "out of date with the models".
    assert main(["crds", "--check", str(tmp_path / "missing.yaml")]) == 1
    assert f"{tmp_path / 'missing.yaml'} does not exist" in capsys.readouterr().err


@pytest.mark.parametrize(("option", "says"), [
    ("--check", "argument --check: an empty path; give the CRD file to compare"),
    ("-o", "argument -o/--output: an empty path; give the file to write, or leave -o out"),
])
def test_crds_with_an_empty_path_says_the_option_needs_one(
        capsys: pytest.CaptureFixture[str], option: str, says: str) -> None:
    """`--check ""` (a variable unset) said ": Is a directory", and -o's exit was 1, not a
    usage error's."""
    with pytest.raises(SystemExit) as exited:
        main(["crds", option, ""])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and says in err, err


def test_the_crds_usage_is_the_one_readme_gives(capsys: pytest.CaptureFixture[str]) -> None:
    """README wrote [-o FILE] [--check FILE], which reads as both at once; they exclude each
    other (given both, the file was not written)."""
    with pytest.raises(SystemExit):
        main(["crds", "--help"])
    usage = "crds [-o FILE | --check FILE]"
    assert f"usage: infertune {usage.replace('crds', 'crds [-h]')}" in capsys.readouterr().out
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert f"`infertune {usage.replace('|', chr(92) + '|')}`" in readme


def test_a_crd_file_that_differs_is_told_how_to_write_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`make crds` writes the repository's own copies only: for a file elsewhere (or one that
    is no CRD at all) it was the wrong advice."""
    other = tmp_path / "tuning.yaml"
    other.write_text("kind: InferenceTuning\n")
    assert main(["crds", "--check", str(other)]) == 1
    assert capsys.readouterr().err.strip() == (
        f"{other} differs from the CRD the models generate; write it with `infertune crds -o "
        f"{other}` (in this repository: `make crds`)")
    assert main(["crds", "-o", str(other)]) == 0
    assert main(["crds", "--check", str(other)]) == 0


@pytest.mark.parametrize(("argv", "says"), [
    (["mig", "layout", "--product", "NVIDIA-H200", "3g.71gb", "--name", "all-disabled"],
     "all-disabled is the config that turns MIG off"),
    (["mig", "layout", "--product", "NVIDIA-H200", "3g.71gb", "--name", "Big Layout"],
     "is not a label value"),
    (["autoscale", "evaluate", str(EXAMPLE), "--prometheus", "http://p:9090", "--timeout",
      "nan"], "'nan' is not a number of seconds written with the digits 0-9"),
    (["autoscale", "evaluate", str(EXAMPLE), "--prometheus", "http://p:9090", "--timeout",
      "-1"], "-1 must be a number of seconds above 0"),
    (["autoscale", "evaluate", str(EXAMPLE), "--prometheus", "http://p:9090", "--timeout",
      "1_0"], "'1_0' is not a number of seconds written with the digits 0-9"),
])
def test_options_that_cannot_work_are_usage_errors(capsys: pytest.CaptureFixture[str],
                                                   argv: list[str], says: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


COUNTS = [
    (["autoscale", "evaluate", str(EXAMPLE), "--prometheus", "http://p:9090", "--replicas"],
     "argument --replicas", "a Deployment's replica count from 0 to 2147483647"),
    (["allocator", "check", "narenas:4", "--cpus"], "argument --cpus",
     "a number of CPUs from 1 to 65536"),
    (["run", "--webhook-port"], "argument --webhook-port",
     "a port from 0 (any free port) to 65535"),
    (["run", "--metrics-port"], "argument --metrics-port", "a port from 1 to 65535"),
    (["mig", "layout", "--product", "NVIDIA-H200", "2g.35gbx"], "argument PROFILE[xCOUNT]",
     "a count of instances from 1 to 2147483647"),
]


@pytest.mark.parametrize(("argv", "option", "count"), COUNTS[:-1], ids=lambda v: str(v)[:40])
@pytest.mark.parametrize("given", ["1_000", "\uff11\uff10", " 5", "5\n", "0x10", "+5"])
def test_a_count_is_written_with_the_digits_0_to_9_only(
        capsys: pytest.CaptureFixture[str], argv: list[str], option: str, count: str,
        given: str) -> None:
    """Python's int() took 1_000, full-width digits (U+FF11 U+FF10) and spaces, which no other tool
    reads as a number: taken, `--replicas` of the two previewed ten replicas. (mig layout's
    PROFILE[xCOUNT] refuses them as no PROFILE[xCOUNT].)"""
    with pytest.raises(SystemExit) as exited:
        main([*argv, given])
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert option in err and "is not a whole number written with the digits 0-9; give " \
        f"{count}" in err, err


@pytest.mark.parametrize(("argv", "option", "count"), COUNTS, ids=lambda v: str(v)[:40])
def test_a_count_of_thousands_of_digits_is_said_short(
        capsys: pytest.CaptureFixture[str], argv: list[str], option: str, count: str) -> None:
    """5000 digits were printed whole, and past 4300 int() refused them in Python's words
    ("Exceeds the limit (4300 digits) for integer string conversion") as no whole number."""
    digits = "9" * 5000
    with pytest.raises(SystemExit) as exited:
        main([*argv[:-1], argv[-1] + digits] if argv[-1].endswith("x") else [*argv, digits])
    err = capsys.readouterr().err
    said = err.splitlines()[-1]  # after the usage
    assert exited.value.code == 2 and len(said) < 300, said
    assert f"99999999999999999999... (5000 digits) is not {count}" in said and option in said


def _arguments(parser: argparse.ArgumentParser,
               command: str = "infertune") -> Iterator[tuple[str, argparse.Action]]:
    """(the command, one of its arguments) for every argument of every subcommand."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _arguments(sub, f"{command} {name}")
        else:
            yield command, action


def test_no_option_of_the_command_line_reads_a_count_with_int() -> None:
    """Every count and port goes through cli.count_type: a new one given type=int would
    take what the table above refuses."""
    from infertune.cli import build_parser

    assert [(c, a.dest) for c, a in _arguments(build_parser()) if a.type is int] == []


def test_every_argument_of_every_command_says_what_it_is_in_its_help() -> None:
    """`plan --help` listed --output and --launcher-image with nothing beside them, and so
    did the help of evaluate's --output and of four positional arguments."""
    from infertune.cli import build_parser

    assert [(c, a.option_strings or a.metavar) for c, a in _arguments(build_parser())
            if not a.help] == []


@pytest.fixture
def stdin(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Feeds standard input; the CLI reads it once per process (cached), so each feed, and
    the end of the test, empties that cache."""
    from infertune.api import manifests

    def feed(data: bytes) -> None:
        manifests._stdin_text.cache_clear()
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))

    manifests._stdin_text.cache_clear()
    yield feed
    manifests._stdin_text.cache_clear()


def test_dash_reads_standard_input_once_for_every_argument(
        stdin: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """kubectl get ... -o yaml | infertune plan - --pod -: the tuning and its Deployment from
    one stream, read once."""
    stdin(yaml.safe_dump_all([TARGET, TUNING]).encode())
    assert main(["plan", "-", "--pod", "-"]) == 0
    assert "serving container: vllm" in capsys.readouterr().out
    assert main(["validate", "-", "-"]) == 0
    out = capsys.readouterr().out
    assert out.count("InferenceTuning") == 1, out  # one stream, its documents once


def test_standard_input_is_named_in_errors(stdin: Any,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    stdin(b"\xff\xfe not text")
    assert main(["validate", "-"]) == 1
    assert "<stdin>: not UTF-8 text" in capsys.readouterr().err
    stdin(b"kind: Deployment\n")
    assert main(["plan", "-", "--pod", "-"]) == 1
    assert "<stdin>: expected exactly one InferenceTuning, found 0 (the file holds " \
        "Deployment)" in capsys.readouterr().err


@pytest.mark.parametrize(("documents", "says"), [
    ([{**TUNING, "kind": "InferenceTunning"}],
     "found 0 (the file holds kind InferenceTunning; use kind InferenceTuning)"),
    ([{**TUNING, "kind": "inferencetuning"}],
     "found 0 (the file holds kind inferencetuning; use kind InferenceTuning)"),
    ([{"replicaCount": 2, "image": {"tag": "v1"}}],
     "found 0 (the file holds no kind: is it a Helm values file?"),
    ([TUNING, {**TUNING, "metadata": {**TUNING["metadata"], "name": "second"}}],
     "found 2 (inference/qwen2-7b, inference/second); give a file with one"),
])
def test_a_file_without_one_tuning_says_what_it_holds(
        stdin: Any, capsys: pytest.CaptureFixture[str], documents: list[dict[str, Any]],
        says: str) -> None:
    """A kind misspelt, a values file and two tunings read "found 0 (the file holds
    InferenceTunning)", "(the file holds None)" and "found 2", naming neither."""
    stdin(yaml.safe_dump_all(documents).encode())
    assert main(["autoscale", "evaluate", "-", "--prometheus", "http://127.0.0.1:9"]) == 1
    assert f"<stdin>: expected exactly one InferenceTuning, {says}" in capsys.readouterr().err


def test_evaluate_exits_3_when_it_decided_without_metrics(
        stdin: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """Every query failed (nothing listens there): the decision is still printed, and the
    exit status says that it was made without data, as MetricsAvailable would."""
    stdin((ROOT / "tests" / "fixtures" / "autoscale" / "tuning.yaml").read_bytes())
    code = main(["autoscale", "evaluate", "-", "--prometheus", "http://127.0.0.1:9",
                 "--timeout", "2", "--output", "json"])
    captured = capsys.readouterr()
    assert code == 3
    out = json.loads(captured.out)
    assert out["action"] == "Hold" and out["tuning"] == "serving/llm"
    assert all("cannot connect" in p for p in out["signals"]["problems"])
    assert captured.err.startswith("metrics missing or not comparable (exit 3): queue: "
                                   "Prometheus at ")
    # The summary names each problem once; the queries are in the output, not repeated.
    assert "(query: " not in captured.err and "label_replace" not in captured.err
    assert captured.err.count("cannot connect") == 3, captured.err


@pytest.mark.parametrize(("url", "says"), [
    ("http://prometheus:99999", "the port is not a number from 1 to 65535"),
    ("http://prometheus:0", "the port is not a number from 1 to 65535"),
    ("http://prometheus:web", "the port is not a number from 1 to 65535"),
    ("http://:9090", "names no host"),
    ("prometheus:9090", "must start with http:// or https://"),
    ("http://prometheus:9090 ", "holds a space or a line break"),
    ("http://prometheus:9090?x=1", "has a query string or a fragment"),
    ("http://prometheus:9090/#graph", "has a query string or a fragment"),
])
def test_evaluate_refuses_a_prometheus_url_no_query_could_reach(
        url: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A command line that does not parse (exit 2, as a value of the wrong type), not a
    decision made without metrics (exit 3) after three failed queries."""
    with pytest.raises(SystemExit) as exited:
        main(["autoscale", "evaluate", str(EXAMPLE), "--prometheus", url])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert says in err and url in err, err


def test_a_closed_standard_input_is_a_message(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from infertune.api import manifests

    manifests._stdin_text.cache_clear()
    monkeypatch.setattr("sys.stdin", None)  # `infertune validate - <&-`
    assert main(["validate", "-"]) == 1
    assert "<stdin>: cannot read: standard input is closed" in capsys.readouterr().err


def test_allocator_check_names_options_new_in_5_3(capsys: pytest.CaptureFixture[str]) -> None:
    """"valid for jemalloc 5.x" for tcache_max: 5.2.1 (Ubuntu 22.04) ignores it, and aborts on
    it under abort_conf:true."""
    from infertune.cli import main

    assert main(["allocator", "check", "abort_conf:true,tcache_max:65536"]) == 0
    out = capsys.readouterr().out
    assert "valid for jemalloc 5.3" in out and "5.x" not in out
    assert "note: tcache_max is new in jemalloc 5.3" in out
    assert main(["allocator", "check", "narenas:4"]) == 0
    assert "note:" not in capsys.readouterr().out


def test_autoscale_evaluate_names_a_malformed_deployment_beside_the_tuning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Read for its pod template's batching knob, it failed with a traceback."""
    path = tmp_path / "tuning.yaml"
    path.write_text(yaml.safe_dump_all([
        {"apiVersion": "infertune.io/v1alpha1", "kind": "InferenceTuning",
         "metadata": {"name": "llm", "namespace": "serving"},
         "spec": {"targetRef": {"name": "llm"}, "engine": "vllm",
                  "autoscaling": {"interval": "2s"}}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "llm", "namespace": "serving"},
         "spec": {"template": {"spec": {"containers": ["vllm"]}}}}]))
    assert main(["autoscale", "evaluate", str(path), "--prometheus", "http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"{path}: Deployment llm: spec.template.spec.containers must be a list of " \
        "mappings" in err


def test_ctrl_c_while_the_parser_loads_is_one_line_and_exit_130() -> None:
    """The parser imports the API models (half a second): a Ctrl-C then printed a traceback,
    where README promises one line and exit 130 for every command but `run`."""
    import subprocess
    import sys

    code = ("from infertune import cli\n"
            "def parser():\n"
            "    raise KeyboardInterrupt\n"
            "cli.build_parser = parser\n"
            "cli.main(['validate', 'x.yaml'])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert (done.returncode, done.stderr) == (130, "infertune: interrupted\n"), done.stderr


def test_evaluate_takes_the_prometheus_url_as_run_does(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`run` takes --prometheus-url and $INFERTUNE_PROMETHEUS_URL; evaluate took neither, and
    said only "required: --prometheus" (in the operator's pod, where the URL is at hand)."""
    monkeypatch.delenv("INFERTUNE_PROMETHEUS_URL", raising=False)
    assert main(["autoscale", "evaluate", str(EXAMPLE)]) == 2
    assert capsys.readouterr().err == ("give --prometheus URL (or set $INFERTUNE_PROMETHEUS_URL, "
                                       "as infertune run reads it)\n")
    monkeypatch.setenv("INFERTUNE_PROMETHEUS_URL", "prometheus:9090")
    assert main(["autoscale", "evaluate", str(EXAMPLE)]) == 2
    assert capsys.readouterr().err.startswith(
        "$INFERTUNE_PROMETHEUS_URL: Prometheus URL 'prometheus:9090' must start with http://")
    # A password in it is refused, in words that fit a variable, and not repeated.
    monkeypatch.setenv("INFERTUNE_PROMETHEUS_URL", "http://me:s3cret@prometheus:9090")
    assert main(["autoscale", "evaluate", str(EXAMPLE)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("$INFERTUNE_PROMETHEUS_URL: Prometheus URL 'http://***@prometheus:9090' "
                          "holds a user and password, and a command-line argument or an "
                          "environment variable is shown"), err
    assert "s3cret" not in err
    # Read from either (nothing listens on port 9: evaluated, with every signal missing).
    monkeypatch.setenv("INFERTUNE_PROMETHEUS_URL", "http://127.0.0.1:9")
    for argv in ([], ["--prometheus-url", "http://127.0.0.1:9"]):
        if argv:
            monkeypatch.delenv("INFERTUNE_PROMETHEUS_URL")
        assert main(["autoscale", "evaluate", str(EXAMPLE), *argv, "--timeout", "1",
                     "--output", "json"]) == 3
        assert json.loads(capsys.readouterr().out)["tuning"] == "inference/qwen2-7b"
