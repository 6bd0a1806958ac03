"""`infertune validate`: examples pass, each invalid manifest fails with its expected message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infertune.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
INVALID = sorted((ROOT / "tests" / "fixtures" / "invalid").glob("*.yaml"))


def _expected(path: Path) -> list[str]:
    return [line.split(":", 1)[1].strip() for line in path.read_text().splitlines()
            if line.startswith("# expect:")]


def test_there_are_examples_for_every_engine_setup() -> None:
    names = {p.name for p in EXAMPLES}
    assert len(names) >= 5
    for wanted in ("vllm-qwen2-7b-h200-mig.yaml", "sglang-a100-80gb.yaml", "tgi-l4-no-mig.yaml",
                   "dryrun-triton.yaml", "canary-vllm.yaml"):
        assert wanted in names


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_valid(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(example)]) == 0, capsys.readouterr().err
    assert ": valid" in capsys.readouterr().out


@pytest.mark.parametrize("manifest", INVALID, ids=lambda p: p.name)
def test_invalid_manifest_fails_with_its_message(manifest: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    expected = _expected(manifest)
    assert expected, f"{manifest.name} has no '# expect:' line"
    assert main(["validate", str(manifest)]) == 1
    err = capsys.readouterr().err
    for message in expected:
        assert message in err
    assert "Traceback" not in err


def test_multi_document_files_report_each_object(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    good = (ROOT / "examples" / "dryrun-triton.yaml").read_text()
    bad = (ROOT / "tests" / "fixtures" / "invalid" / "min-above-max.yaml").read_text()
    combined = tmp_path / "both.yaml"
    combined.write_text(good + "\n---\n" + bad)
    assert main(["validate", str(combined)]) == 1
    captured = capsys.readouterr()
    assert "InferenceTuning search/triton-embeddings: valid" in captured.out
    assert "InferenceTuning ml/qwen: spec.autoscaling.minReplicas" in captured.err
    assert "1 of 2 failed" in captured.err


def test_files_without_inference_tunings_are_an_error(tmp_path: Path) -> None:
    only_deployment = tmp_path / "d.yaml"
    only_deployment.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    assert main(["validate", str(only_deployment)]) == 1


def test_missing_file_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path / "nope.yaml")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_console_entry_points_run() -> None:
    for argv in (["infertune"], [sys.executable, "-m", "infertune"]):
        done = subprocess.run([*argv, "crds"], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        assert "kind: CustomResourceDefinition" in done.stdout



def test_a_yaml_alias_bomb_is_refused_with_a_short_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nine nested aliases in 600 bytes: the message quoted the whole expanded value, and
    validate ran for minutes."""
    levels = ['  a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]'] + [
        f"  a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join([
        "apiVersion: infertune.io/v1alpha1", "kind: InferenceTuning",
        "metadata: {name: t, namespace: ns}", "x:", *levels,
        "spec:", "  targetRef: {name: d}", "  engine: vllm",
        "  mig: {profile: 1g.18gb, layout: *a8}"]) + "\n")
    assert main(["validate", str(bomb)]) == 1
    err = capsys.readouterr().err
    # Refused as kubectl refuses it, before anything walks it: used where a value is turned
    # into text (`mode: *a8`, an annotation of a pod for `plan`), it held the command at
    # gigabytes of memory until it was killed.
    assert err.startswith(f"{bomb}: line 1 column 1: not valid YAML: excessive aliasing: its "
                          "anchors expand to more than 100,000 values (kubectl refuses it "
                          "too)\n"), err[:300]
    # Aliases as manifests use them (one list in two places) are read as before.
    shared = tmp_path / "shared.yaml"
    shared.write_text("\n".join([
        "apiVersion: infertune.io/v1alpha1", "kind: InferenceTuning",
        "metadata: {name: t, namespace: ns, labels: &labels {team: a, tier: b},",
        "           annotations: *labels}",
        "spec:", "  targetRef: {name: d}", "  engine: vllm",
        "  mode: DryRun"]) + "\n")
    assert main(["validate", str(shared)]) == 0, capsys.readouterr()


def test_a_key_given_twice_is_refused_with_its_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """kubectl refuses such a file; PyYAML kept the last value silently, so this tuning was
    valid, and Enforce."""
    twice = tmp_path / "twice.yaml"
    twice.write_text("apiVersion: infertune.io/v1alpha1\nkind: InferenceTuning\n"
                     "metadata: {name: t, namespace: ns}\nspec:\n  targetRef: {name: d}\n"
                     "  engine: vllm\n  mode: DryRun\n  mode: Enforce\n")
    assert main(["validate", str(twice)]) == 1
    assert "line 8 column 3: not valid YAML: found the key 'mode' twice" in \
        capsys.readouterr().err
    # A merge key's values may be overridden, as YAML says.
    merged = tmp_path / "merged.yaml"
    merged.write_text("apiVersion: infertune.io/v1alpha1\nkind: InferenceTuning\n"
                      "metadata: {name: t, namespace: ns}\nspec:\n  <<: &base {engine: vllm, "
                      "mode: DryRun}\n  targetRef: {name: d}\n  mode: Enforce\n")
    assert main(["validate", str(merged)]) == 0, capsys.readouterr().err


def test_keys_read_as_numbers_or_flags_are_the_strings_kubectl_sends(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """sigs.k8s.io/yaml turns such a key into its text (a label 2024, a nodeSelector key 1):
    refused here as "not a valid string" with a path of a list index, and `{1: a, true: b}`
    was "the key True twice" (Python's 1 == True)."""
    manifest = tmp_path / "keys.yaml"

    def validate(labels: str, selector: str = "{gpu: h100}") -> tuple[int, str]:
        manifest.write_text(
            "apiVersion: infertune.io/v1alpha1\nkind: InferenceTuning\n"
            f"metadata: {{name: t, namespace: ns, labels: {labels}}}\n"
            "spec: {targetRef: {name: d}, engine: vllm, "
            f"mig: {{profile: 3g.40gb, nodeSelector: {selector}}}}}\n")
        code = main(["validate", str(manifest)])
        return code, capsys.readouterr().err

    assert validate("{2024: x, true: z, 0x10: w, 1.5: v}", "{1: x}") == (0, "")
    code, err = validate("{1e6: u}")  # the label "1e+06", which no label key can be
    assert code == 1 and "metadata.labels['1e+06']: the key '1e+06' is not a label key" in err
    assert validate("{1: a, true: b}") == (0, "")
    code, err = validate('{1: a, "1": b}')
    assert code == 1 and "found the key '1' twice" in err, err
    code, err = validate("{0x1: a, 1: b}")  # both the label "1"
    assert code == 1 and "found the key '1' twice" in err, err
    code, err = validate("{~: a}")
    assert code == 1 and "a mapping key kubectl cannot send (null); write it as a quoted " \
        "string" in err, err
    from infertune.api.manifests import load_documents
    manifest.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, labels: "
                        "{2024: x, true: z, 1.5: v, 1e6: u, 7e-5: t, .inf: s}}\n")
    documents, problems = load_documents(manifest)
    assert not problems and list(documents[0].body["metadata"]["labels"]) == [
        "2024", "true", "1.5", "1e+06", "7e-05", ".inf"]  # as Go's FormatFloat(v, 'g', -1, 32)


def test_a_name_with_a_newline_cannot_print_a_line_of_its_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spoof = tmp_path / "spoof.yaml"
    spoof.write_text('apiVersion: infertune.io/v1alpha1\nkind: InferenceTuning\n'
                     'metadata: {name: "x: valid\\nprod.yaml: InferenceTuning prod/api", '
                     'namespace: ns}\nspec: {targetRef: {name: d}, engine: vllm}\n')
    assert main(["validate", str(spoof)]) == 1
    captured = capsys.readouterr()
    assert not [line for line in (captured.out + captured.err).splitlines()
                if line.startswith("prod.yaml")]
    assert "ns/x: valid\\nprod.yaml" in captured.err


@pytest.mark.parametrize("header", ["apiVersion: v1\nkind: List\n",
                                    "apiVersion: infertune.io/v1alpha1\n"
                                    "kind: InferenceTuningList\n"])
def test_the_objects_of_a_list_are_each_checked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], header: str) -> None:
    """`kubectl get itune -A -o yaml` writes a v1 List, and kubectl applies the items of an
    InferenceTuningList too: their tunings were skipped (or the list refused as a kind)."""
    listed = tmp_path / "list.yaml"
    listed.write_text(
        header + "items:\n"
        "- apiVersion: infertune.io/v1alpha1\n  kind: InferenceTuning\n"
        "  metadata: {name: bad, namespace: ns}\n  spec: {targetRef: {name: d}, engine: nope}\n"
        "- apiVersion: infertune.io/v1alpha1\n  kind: InferenceTuning\n"
        "  metadata: {name: good, namespace: ns}\n  spec: {targetRef: {name: d}, engine: vllm}\n")
    assert main(["validate", str(listed)]) == 1
    captured = capsys.readouterr()
    assert "InferenceTuning ns/bad: spec.engine:" in captured.err
    assert "InferenceTuning ns/good: valid" in captured.out


def _tuning_yaml(spec_lines: str, metadata_lines: str = "") -> str:
    return ("apiVersion: infertune.io/v1alpha1\nkind: InferenceTuning\nmetadata:\n"
            f"  name: qwen\n  namespace: ml\n{metadata_lines}spec:\n  engine: vllm\n"
            f"{spec_lines}")


@pytest.mark.parametrize(("spec_lines", "metadata_lines", "error"), [
    # What kubectl (sigs.k8s.io/yaml, go-yaml v2) sends, and the API server then says.
    # Said why: "False: input should be a valid string" puzzled a user who wrote `n`.
    ("  targetRef: {name: qwen}\n  container: n\n", "", "spec.container: False: input should "
     "be a valid string (YAML reads an unquoted y, n, yes, no, on, off, true or false as a "
     "boolean; quote it, for example 'n')"),
    ("  targetRef: {name: qwen}\n  autoscaling: {maxReplicas: 1:30}\n", "",
     "'1:30' is not a number; give a number"),
    ("  targetRef: {name: qwen}\n  autoscaling: {maxReplicas: 1e3}\n", "", None),  # 1000
    ("  targetRef: {name: qwen}\n  autoscaling: {maxReplicas: 0X1F, tolerance: +.5}\n", "",
     None),
    ("  targetRef: {name: 2024-01-01}\n", "  annotations: {example.com/window: 12:30, "
     "example.com/eq: =}\n", None),
    # Underscores alone where digits must be, and more digits than Python reads: go-yaml
    # takes them for strings (they crashed validate with a traceback).
    ("  targetRef: {name: qwen}\n  autoscaling: {maxReplicas: 0x_}\n", "",
     "spec.autoscaling.maxReplicas: '0x_' is not a number"),
    ("  targetRef: {name: qwen}\n  autoscaling: {tolerance: 1e_}\n", "",
     "spec.autoscaling.tolerance: '1e_' is not a number"),
    ("  targetRef: {name: qwen}\n", "  labels: {team: " + "9" * 5000 + "}\n",
     "metadata.labels['team']"),
    # Past int64 in hex or octal: Python took them as ints and failed printing one.
    ("  targetRef: {name: qwen}\n  autoscaling: {maxReplicas: 0x" + "f" * 5000 + "}\n", "",
     "spec.autoscaling.maxReplicas: '0xffff"),
    ("  targetRef: {name: qwen}\n  autoscaling: {maxReplicas: 0o" + "7" * 5000 + "}\n", "",
     "spec.autoscaling.maxReplicas: '0o7777"),
    # Beyond a float: go-yaml keeps them as strings, and "write it without quotes" was
    # wrong advice for a number written without any.
    ("  targetRef: {name: qwen}\n  autoscaling: {maxReplicas: 1e400}\n", "",
     "spec.autoscaling.maxReplicas: 1e400 is out of range: a number beyond what a 64-bit "
     "float holds; give a smaller one"),
    ("  targetRef: {name: qwen}\n  autoscaling: {tolerance: -" + "9" * 5000 + "}\n", "",
     "spec.autoscaling.tolerance: -9999999999999999999... (5001 characters) is out of range"),
    # An explicit !!timestamp is the text to kubectl: it was a Python date, said as
    # "datetime.date(2024, 1, 2)" and refused in a string field.
    ("  targetRef: {name: qwen}\n  container: !!timestamp 2024-01-02\n", "", None),
    ("  targetRef: {name: qwen}\n  autoscaling: {maxReplicas: !!timestamp 2024-01-02T10:00:00Z}"
     "\n", "", "spec.autoscaling.maxReplicas: '2024-01-02T10:00:00Z' is not a number"),
    ("  targetRef: {name: qwen}\n  mode: !!timestamp 2024-01-02\n", "",
     "spec.mode: '2024-01-02' is not allowed; input should be "),
    # Quantities kubectl sends as the integers they are, and an empty namespace it ignores.
    ("  targetRef: {name: qwen}\n  memory: {high: 30e9, minHeadroom: 1.0}\n", "", None),
])
def test_yaml_is_read_as_kubectl_reads_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          spec_lines: str, metadata_lines: str,
                                          error: str | None) -> None:
    """PyYAML's YAML 1.1 read `n` as a string and 1:30 as 90 (validate passed what the API
    server refused), and refused 1e3, +.5, dates and `=` that kubectl sends as 1000, 0.5 and
    strings."""
    manifest = tmp_path / "t.yaml"
    manifest.write_text(_tuning_yaml(spec_lines, metadata_lines))
    code = main(["validate", str(manifest)])
    captured = capsys.readouterr()
    if error is None:
        assert code == 0, captured.err
    else:
        assert code == 1 and error in captured.err, captured.err


def test_an_empty_namespace_is_unset_as_kubectl_takes_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = tmp_path / "t.yaml"
    manifest.write_text(_tuning_yaml("  targetRef: {name: qwen}\n").replace(
        "namespace: ml", 'namespace: ""'))
    assert main(["validate", str(manifest)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(("engine", "said"), [
    ("tgi", "TGI ignores --max-batch-total-tokens for Flash Attention models"),
    ("triton", "Triton reads max-queue-delay-microseconds from the model config"),
])
def test_batching_auto_that_can_never_apply_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], engine: str, said: str) -> None:
    """The API server takes it, and the operator then only recommends, for good: validate
    said "valid"."""
    manifest = tmp_path / "t.yaml"
    manifest.write_text(_tuning_yaml("  targetRef: {name: qwen}\n  autoscaling: {}\n"
                                     "  batching: {mode: Auto}\n").replace(
        "engine: vllm", f"engine: {engine}"))
    assert main(["validate", str(manifest)]) == 1
    err = capsys.readouterr().err
    assert "spec.batching.mode: Auto can never apply a value here, only recommend one" in err
    assert said in err, err


def test_a_json_manifest_is_read_as_json(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """kubectl reads a JSON object as JSON: tab indentation (jq --tab, Go's MarshalIndent)
    and exponents (Python's json.dumps writes 1e-05) were refused as YAML."""
    manifest = tmp_path / "t.json"
    manifest.write_text(
        '{\n\t"apiVersion": "infertune.io/v1alpha1",\n\t"kind": "InferenceTuning",\n'
        '\t"metadata": {"name": "qwen", "namespace": "ml"},\n'
        '\t"spec": {"targetRef": {"name": "qwen"}, "engine": "vllm",\n'
        '\t\t"canary": {"steps": [{"weight": 10}], "analysis": {"maxErrorRate": 1e-05}}}\n}\n')
    assert main(["validate", str(manifest)]) == 0, capsys.readouterr().err
    manifest.write_text('{"kind": "InferenceTuning", "kind": "InferenceTuning"}')
    assert main(["validate", str(manifest)]) == 1
    assert "found the key 'kind' twice" in capsys.readouterr().err


def test_a_status_in_the_file_is_not_checked(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The API server drops it on create and apply (the status subresource); a file saved
    with `kubectl get -o yaml` holds one, and an old or edited one failed validation."""
    manifest = tmp_path / "t.yaml"
    manifest.write_text(_tuning_yaml("  targetRef: {name: qwen}\n")
                        + "status: {phase: Bogus, autoscaling: {unknown: 1}}\n")
    assert main(["validate", str(manifest)]) == 0, capsys.readouterr().err


def test_output_into_a_pipe_closed_early_ends_quietly_with_141(tmp_path: Path) -> None:
    """`infertune validate many.yaml | head -1`: the rest of the output went into a closed
    pipe, and a BrokenPipeError traceback came out with exit 1."""
    items = "".join(f"- apiVersion: infertune.io/v1alpha1\n  kind: InferenceTuning\n"
                    f"  metadata: {{name: tuning-{i}, namespace: ns}}\n"
                    f"  spec: {{targetRef: {{name: d-{i}}}, engine: vllm}}\n"  # one each
                    for i in range(3000))
    many = tmp_path / "many.yaml"
    many.write_text("apiVersion: v1\nkind: List\nitems:\n" + items)
    # Some 150 KB of "valid" lines: more than the pipe holds, so writes are still going on
    # when head has read its line and gone.
    writer = subprocess.Popen([sys.executable, "-m", "infertune", "validate", str(many)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert writer.stdout is not None and writer.stderr is not None
    head = subprocess.run(["head", "-1"], stdin=writer.stdout, capture_output=True,
                          check=True)
    writer.stdout.close()
    err = writer.stderr.read().decode()
    assert writer.wait(timeout=120) == 141, err
    assert head.stdout.decode().endswith(
        "InferenceTuning ns/tuning-0: valid (Deployment d-0 is not among the files: "
        "spec.container and memory.high not checked against it)\n")
    assert err == "", err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("argv", [["crds"], ["validate", "examples/canary-vllm.yaml"],
                                  ["--version"], ["--help"], ["autoscale", "evaluate", "--help"]])
def test_output_to_a_full_device_is_said_without_a_traceback(argv: list[str]) -> None:
    """`infertune crds > /dev/full`: an OSError traceback came out, exit 1; `--version` and
    `--help` exited 0 having written nothing (argparse drops the error)."""
    root = Path(__file__).resolve().parent.parent
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "infertune", *argv], cwd=root,
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr == "infertune: cannot write the output: No space left on device\n"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_usage_error_exits_2_whatever_stderr_is() -> None:
    root = Path(__file__).resolve().parent.parent
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "infertune", "nosuch"], cwd=root,
                              stderr=full, timeout=120)
    assert done.returncode == 2


def test_crds_takes_a_file_to_write_or_one_to_check_not_both(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Given both, the file to write was silently not written."""
    written = tmp_path / "crd.yaml"
    with pytest.raises(SystemExit) as exit_:
        main(["crds", "-o", str(written), "--check", "crds/infertune.io_inferencetunings.yaml"])
    assert exit_.value.code == 2 and not written.exists()
    assert "argument --check: not allowed with argument -o/--output" in capsys.readouterr().err


def _doc(kind: str, name: str, namespace: str | None, body: str) -> str:
    meta = f"{{name: {name}" + (f", namespace: {namespace}}}" if namespace else "}")
    version = "apps/v1" if kind == "Deployment" else "infertune.io/v1alpha1"
    return f"---\napiVersion: {version}\nkind: {kind}\nmetadata: {meta}\n{body}"


DEPLOYMENT_32GI = ("spec:\n  selector: {matchLabels: {app: q}}\n  template:\n"
                   "    metadata: {labels: {app: q}}\n    spec:\n      containers:\n"
                   "      - {name: vllm, image: v, command: [vllm], resources: {limits: "
                   "{memory: 32Gi}}}\n")


@pytest.mark.parametrize(("tuning_ns", "deployment_ns"), [
    (None, "inference"), ("inference", None), ("inference", "inference")])
def test_a_namespace_left_unset_on_one_side_is_the_others(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], tuning_ns: str | None,
        deployment_ns: str | None) -> None:
    """`kubectl apply -n inference` puts both there: validate took the unset one for
    `default`, skipped the Deployment check and said valid, and `plan` (and the webhook)
    refused the pods for a memory.high above the limit."""
    manifest = tmp_path / "t.yaml"
    manifest.write_text(
        _doc("InferenceTuning", "q", tuning_ns,
             "spec: {targetRef: {name: q}, engine: vllm, memory: {high: 40Gi}}\n")
        + _doc("Deployment", "q", deployment_ns, DEPLOYMENT_32GI))
    assert main(["validate", str(manifest)]) == 1
    assert "spec.memory.high: 40Gi is above the memory limit 32Gi" in capsys.readouterr().err


def test_two_tunings_of_one_deployment_are_each_an_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both were valid, and the webhook tuned the pods of neither."""
    spec = "spec: {targetRef: {name: q}, engine: vllm}\n"
    manifest = tmp_path / "t.yaml"
    manifest.write_text(_doc("InferenceTuning", "a", "ml", spec)
                        + _doc("InferenceTuning", "b", None, spec)
                        + _doc("InferenceTuning", "c", "other", spec))
    assert main(["validate", str(manifest)]) == 1
    err = capsys.readouterr().err
    assert "ml/a: spec.targetRef.name: InferenceTuning b in mode Enforce also targets " \
        "Deployment q" in err, err
    # b, without a namespace, meets both.
    assert "InferenceTuning a, c in mode Enforce also target Deployment q" in err, err
    assert "other/c: spec.targetRef.name: InferenceTuning b in mode Enforce also targets" \
        in err, err
    # In namespaces of their own, they are two Deployments.
    manifest.write_text(_doc("InferenceTuning", "a", "ml", spec)
                        + _doc("InferenceTuning", "c", "other", spec))
    assert main(["validate", str(manifest)]) == 0, capsys.readouterr().err


def test_valid_says_when_the_deployment_was_not_there_to_check_against(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """memory.high above the container's limit passed as "valid" with the Deployment in
    another file (another repository, often): said to be unchecked, not taken for checked."""
    tuning = _doc("InferenceTuning", "q", "ml",
                  "spec: {targetRef: {name: q}, engine: vllm, memory: {high: 40Gi}}\n")
    manifest = tmp_path / "t.yaml"
    manifest.write_text(tuning)
    assert main(["validate", str(manifest)]) == 0
    assert capsys.readouterr().out.endswith(
        "InferenceTuning ml/q: valid (Deployment q is not among the files: spec.container and "
        "memory.high not checked against it)\n")
    manifest.write_text(tuning + _doc("Deployment", "q", "ml", DEPLOYMENT_32GI))
    assert main(["validate", str(manifest)]) == 1
    assert "spec.memory.high: 40Gi is above the memory limit 32Gi" in capsys.readouterr().err
    manifest.write_text(tuning.replace("40Gi", "20Gi") + _doc("Deployment", "q", "ml",
                                                              DEPLOYMENT_32GI))
    assert main(["validate", str(manifest)]) == 0
    assert capsys.readouterr().out.endswith("InferenceTuning ml/q: valid\n")


def _validated(manifest: Path, text: str, capsys: pytest.CaptureFixture[str]) -> str:
    """What `validate` prints of `text`, written to `manifest`, which it passes."""
    manifest.write_text(text)
    assert main(["validate", str(manifest)]) == 0
    return capsys.readouterr().out


def test_valid_says_batching_without_autoscaling_is_not_acted_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """"valid" read as if batching would be tuned; only the autoscaler's evaluations read it."""
    spec = "spec: {targetRef: {name: q}, engine: vllm, batching: {mode: Recommend}}\n"
    manifest, deployment = tmp_path / "t.yaml", _doc("Deployment", "q", "ml", DEPLOYMENT_32GI)
    assert _validated(manifest, _doc("InferenceTuning", "q", "ml", spec) + deployment,
                      capsys).endswith(
        "InferenceTuning ml/q: valid (spec.batching is not acted on without spec.autoscaling: "
        "its evaluations recommend and apply the batch size; add spec.autoscaling (with "
        "enabled: false it recommends without scaling), or set spec.batching.mode: Off)\n")
    autoscaled = spec.replace("batching:", "autoscaling: {maxReplicas: 4, latency: {target: "
                              "500ms}}, batching:")
    assert _validated(manifest, _doc("InferenceTuning", "q", "ml", autoscaled) + deployment,
                      capsys).endswith("InferenceTuning ml/q: valid\n")
    # The default target, 75ms, is under vLLM's lowest latency bucket (300ms).
    default = autoscaled.replace(", latency: {target: 500ms}", "")
    assert _validated(manifest, _doc("InferenceTuning", "q", "ml", default) + deployment,
                      capsys).endswith(
        "InferenceTuning ml/q: valid (spec.autoscaling.latency.target 75ms is under 300ms, "
        "the lowest bucket of vllm's latency histogram, and cannot be measured "
        "(LatencyTargetBelowResolution); set 300ms or more, or a finer "
        "spec.metrics.latencyHistogram)\n")


def test_valid_says_a_canary_is_not_enforced(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """"valid" read as if the canary would guard the next rollout; nothing acts on it yet."""
    spec = "spec: {targetRef: {name: q}, engine: vllm, canary: {steps: [{weight: 20}]}}\n"
    manifest, deployment = tmp_path / "t.yaml", _doc("Deployment", "q", "ml", DEPLOYMENT_32GI)
    tuning = _doc("InferenceTuning", "q", "ml", spec)
    assert _validated(manifest, tuning + deployment, capsys).endswith(
        "InferenceTuning ml/q: valid (spec.canary is not enforced yet: canary rollouts are "
        "planned, new revisions roll out as the Deployment says)\n")
    assert _validated(manifest, tuning, capsys).endswith(
        "(Deployment q is not among the files: spec.container and memory.high not checked "
        "against it; spec.canary is not enforced yet: canary rollouts are planned, new "
        "revisions roll out as the Deployment says)\n")
    off = spec.replace("canary: {", "canary: {enabled: false, ")
    assert _validated(manifest, _doc("InferenceTuning", "q", "ml", off) + deployment,
                      capsys).endswith("InferenceTuning ml/q: valid\n")


def test_a_trial_beside_the_tuning_in_force_is_no_rival(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trial (mode DryRun) changes nothing: beside the tuning in force, the pods are that
    one's (a trial stopped them being tuned). Two in force are still an error, the trial
    beside them is not one; two trials alone are (neither annotates the pods)."""
    spec = "spec: {targetRef: {name: q}, engine: vllm}\n"
    trial = "spec: {targetRef: {name: q}, engine: vllm, mode: DryRun}\n"
    manifest = tmp_path / "t.yaml"
    manifest.write_text(_doc("InferenceTuning", "a", "ml", spec)
                        + _doc("InferenceTuning", "t", "ml", trial))
    assert main(["validate", str(manifest)]) == 0, capsys.readouterr().err
    manifest.write_text(_doc("InferenceTuning", "a", "ml", spec)
                        + _doc("InferenceTuning", "b", "ml", spec)
                        + _doc("InferenceTuning", "t", "ml", trial))
    assert main(["validate", str(manifest)]) == 1
    err = capsys.readouterr().err
    assert "ml/a: spec.targetRef.name: InferenceTuning b in mode Enforce also targets" in err
    assert "ml/b: spec.targetRef.name: InferenceTuning a in mode Enforce also targets" in err
    assert "ml/t:" not in err, err
    manifest.write_text(_doc("InferenceTuning", "t", "ml", trial)
                        + _doc("InferenceTuning", "u", "ml", trial))
    assert main(["validate", str(manifest)]) == 1
    err = capsys.readouterr().err
    assert "ml/t: spec.targetRef.name: InferenceTuning u also targets Deployment q, and the " \
        "pods of a Deployment more than one tuning targets are annotated with a trial's plan " \
        "by none" in err, err


def test_what_validate_prints_is_one_line_per_problem_whatever_the_file_holds(
        tmp_path: Path) -> None:
    """A field name holding an escape sequence cleared the screen, and a newline in it began
    a line of its own; a file name that is not UTF-8 was a UnicodeEncodeError traceback where
    the output is strict UTF-8 (PYTHONIOENCODING, most desktop locales)."""
    name = os.fsdecode(b"bad\xffname.yaml")
    manifest = tmp_path / name
    manifest.write_text("apiVersion: infertune.io/v1alpha1\nkind: InferenceTuning\n"
                        "metadata: {name: q}\nspec: {targetRef: {name: q}, engine: vllm, "
                        '"bad\\e[2Jkey\\nx": 1}\n')
    done = subprocess.run([sys.executable, "-m", "infertune", "validate", str(manifest)],
                          capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "\x1b" not in done.stderr, done.stderr
    first, summary = done.stderr.splitlines()
    assert first.endswith(r"bad\udcffname.yaml: InferenceTuning q: spec.bad\x1b[2Jkey\nx: "
                          "unknown field; remove it (valid here: targetRef, engine, mode, "
                          "container, metrics, numa, memory, allocator, retune, mig, "
                          "autoscaling, batching, canary)"), first
    assert summary == "1 of 1 failed"


def test_one_tuning_given_twice_is_not_its_own_rival(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`validate base.yaml rendered.yaml` with the same tuning in both: one object, which
    targets its Deployment once."""
    manifest = tmp_path / "t.yaml"
    manifest.write_text(_doc("InferenceTuning", "a", "ml",
                             "spec: {targetRef: {name: q}, engine: vllm}\n"))
    assert main(["validate", str(manifest), str(manifest)]) == 0, capsys.readouterr().err


def test_the_deployment_of_the_tunings_own_namespace_is_checked_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small = DEPLOYMENT_32GI.replace("32Gi", "8Gi")
    manifest = tmp_path / "t.yaml"
    manifest.write_text(
        _doc("InferenceTuning", "q", "ml",
             "spec: {targetRef: {name: q}, engine: vllm, memory: {high: 20Gi}}\n")
        + _doc("Deployment", "q", None, small)  # lands in ml only with kubectl apply -n ml
        + _doc("Deployment", "q", "ml", DEPLOYMENT_32GI))
    assert main(["validate", str(manifest)]) == 0, capsys.readouterr().err


def test_a_crd_write_that_fails_leaves_the_file_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Found by review: written in place, a full disk or a quota emptied the CRD file and cut
    it short (20 KiB of 64), and `crds --check` then said only that it differs."""
    import errno

    target = tmp_path / "crd.yaml"
    target.write_text("the CRD as it was\n")

    def full(self: Path, *_: object, **__: object) -> int:
        self.open("w").write("cut sh")  # what a full disk leaves of a write
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", full)
    assert main(["crds", "-o", str(target)]) == 1
    assert target.read_text() == "the CRD as it was\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["crd.yaml"]  # nothing left behind
    assert capsys.readouterr().err == f"{target}: No space left on device\n"
    monkeypatch.undo()
    link = tmp_path / "link.yaml"
    link.symlink_to(target)
    assert main(["crds", "-o", str(link)]) == 0
    assert link.is_symlink() and "kind: CustomResourceDefinition" in target.read_text()


def test_standard_output_closed_is_said_not_a_traceback(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdout", None)
    assert main(["crds"]) == 1
    assert capsys.readouterr().err == "infertune: standard output is closed\n"
