"""The alert rules of charts/infertune/files/prometheus-alerts.yaml (the chart's PrometheusRule
with metrics.prometheusRule.enabled), run by promtool (Prometheus's own rule
engine) over series in the shape the operator exports (controller/exported.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from tests.conftest import ROOT

RULES = ROOT / "charts" / "infertune" / "files" / "prometheus-alerts.yaml"
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None,
                                reason="needs promtool (apt-get install prometheus)")

QWEN = {"namespace": "prod", "name": "qwen", "deployment": "qwen-vllm"}
"""The tuning most tests alert on."""
WARNING = {"severity": "warning", **QWEN}
"""The labels of a warning about it."""


def series(metric: str, values: str, tuning: dict[str, str] | None = None,
           **labels: str) -> dict[str, str]:
    """An input series of `metric` for `tuning` (QWEN; {} for none) with `labels`."""
    given = {**(QWEN if tuning is None else tuning), **labels}
    text = ", ".join(f'{name}="{value}"' for name, value in given.items())
    return {"series": f"{metric}{{{text}}}" if text else metric, "values": values}


def condition(kind: str, status: str, reason: str, values: str,
              tuning: dict[str, str] | None = None) -> dict[str, str]:
    """An input series of the autoscaler's condition `kind` as the operator exports it."""
    return series("infertune_autoscaling_condition", values, tuning, type=kind,
                  status=status, reason=reason)


def other(name: str) -> dict[str, str]:
    """Another tuning of namespace prod, with a Deployment of its name."""
    return {"namespace": "prod", "name": name, "deployment": name}


def promtool_test(tmp_path: Path, series: list[dict[str, str]],
                  alerts: list[dict[str, object]]) -> subprocess.CompletedProcess[str]:
    tests = {"rule_files": [str(RULES)], "evaluation_interval": "1m",
             "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": alerts}]}
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump(tests), encoding="utf-8")
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)


def test_the_rules_are_valid() -> None:
    assert PROMTOOL is not None
    checked = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True,
                             text=True, timeout=60, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def at(alert: str, minutes: int, *expected: dict[str, object]) -> dict[str, object]:
    return {"alertname": alert, "eval_time": f"{minutes}m", "exp_alerts": list(expected)}


def test_held_at_max_replicas_for_ten_minutes_alerts(tmp_path: Path) -> None:
    trial, blocked = other("trial"), other("hpa")
    ran = promtool_test(tmp_path, [
        condition("ScalingLimited", "True", "TooManyReplicas", "1x20"),
        series("infertune_autoscaling_action", "1x20", action="Hold", mode="Enforce"),
        # A DryRun trial and a tuning an HPA keeps from writing: not paged as at max.
        condition("ScalingLimited", "True", "TooManyReplicas", "1x20", trial),
        series("infertune_autoscaling_action", "1x20", trial, action="Hold", mode="DryRun"),
        condition("ScalingLimited", "True", "TooManyReplicas", "1x20", blocked),
        series("infertune_autoscaling_action", "1x20", blocked, action="Hold", mode="Enforce"),
        condition("ScalingActive", "False", "HorizontalPodAutoscalerPresent", "1x20", blocked),
    ], [at("InferenceTuningAtMaxReplicas", 5),
        at("InferenceTuningAtMaxReplicas", 12, {"exp_labels": WARNING, "exp_annotations": {
            "summary": "prod/qwen is held at maxReplicas",
            "description": "The signals of Deployment qwen-vllm call for more replicas than "
                           "spec.autoscaling.maxReplicas allows; status.autoscaling.reason has "
                           "the numbers. Raise maxReplicas if the cluster has room."}})])
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_a_tuning_that_does_not_write_replicas_alerts_but_not_a_disabled_one(
        tmp_path: Path) -> None:
    ran = promtool_test(tmp_path, [
        condition("ScalingActive", "False", "ReplicaFight", "1x10"),
        condition("ScalingActive", "False", "Disabled", "1x10", other("off")),
        condition("ScalingActive", "False", "ScaledToZero", "1x10", other("zero")),
    ], [at("InferenceTuningNotScaling", 3),
        at("InferenceTuningNotScaling", 7, {
            "exp_labels": {**WARNING, "reason": "ReplicaFight"}, "exp_annotations": {
                "summary": "prod/qwen does not scale: ReplicaFight",
                "description": "The ScalingActive condition of the InferenceTuning says why "
                               "(kubectl describe itune -n prod qwen)."}})])
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_a_tuning_no_longer_evaluated_alerts_after_three_of_its_intervals(
        tmp_path: Path) -> None:
    """Evaluated every 15 s until 5m, then no more; a second tuning with a 10m interval,
    evaluated on time, never alerts (a fixed threshold fired on it every cycle)."""
    slow = other("batch")
    evaluated = "infertune_autoscaling_last_evaluation_timestamp_seconds"
    ran = promtool_test(tmp_path, [
        # The value is the time of the last evaluation, scraped each minute.
        series(evaluated, "0+60x5 300x15"),
        series("infertune_autoscaling_interval_seconds", "15x20"),
        series(evaluated, "0x9 600x10 1200", slow),
        series("infertune_autoscaling_interval_seconds", "600x20", slow),
    ], [at("InferenceTuningNotEvaluated", 6),
        *(at("InferenceTuningNotEvaluated", minutes, {"exp_labels": WARNING, "exp_annotations": {
            "summary": f"prod/qwen was last evaluated {ago} ago"}})
          for minutes, ago in ((8, "3m 0s"), (19, "14m 0s")))])
    assert ran.returncode == 0, ran.stdout + ran.stderr


FETCHES = "infertune_autoscaling_prometheus_fetches_total"
"""Exported by the process that leads only (InfertuneAutoscalerAbsent)."""


def test_no_leading_operator_alerts(tmp_path: Path) -> None:
    ran = promtool_test(tmp_path, [series(FETCHES, "1+4x3", {})], [
        at("InfertuneAutoscalerAbsent", 3),
        # Gone after 3m: stale 5m later, then absent for 5m.
        at("InfertuneAutoscalerAbsent", 15, {"exp_labels": {"severity": "critical"},
                                             "exp_annotations": {
            "summary": "no infertune operator leads, or none is scraped: nothing is "
                       "autoscaled"}})])
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_a_leading_operator_is_not_absent(tmp_path: Path) -> None:
    # Exported for 12 minutes: quiet all along, or the rule watches another name.
    ran = promtool_test(tmp_path, [series(FETCHES, "1+4x12", {})],
                        [at("InfertuneAutoscalerAbsent", 11)])
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_evaluations_that_keep_failing_alert(tmp_path: Path) -> None:
    ran = promtool_test(tmp_path, [
        series("infertune_autoscaling_evaluation_failures_total", "_ _ _ 1 3 5 7 9",
               {"namespace": "prod", "name": "qwen"}),
    ], [at("InferenceTuningEvaluationsFailing", 3),
        at("InferenceTuningEvaluationsFailing", 7, {"exp_labels": {
            "severity": "warning", "namespace": "prod", "name": "qwen"}, "exp_annotations": {
                "summary": "prod/qwen: 9 evaluations failed in 10 minutes"}})])
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_a_fallback_and_a_missing_signal_alert(tmp_path: Path) -> None:
    """Not a Deployment paused at 0 replicas, which has no pods to export metrics (whatever
    ScalingActive says first: a DryRun trial at 0 says DryRun), nor a tuning whose
    autoscaling is disabled."""
    paused, trial, off = other("paused"), other("trial"), other("off")
    replicas = "infertune_autoscaling_current_replicas"
    ran = promtool_test(tmp_path, [
        condition("ScalingActive", "True", "Fallback", "1x12"),
        condition("MetricsAvailable", "False", "MetricsMissing", "1x12"),
        series(replicas, "3x12"),
        condition("ScalingActive", "False", "ScaledToZero", "1x12", paused),
        condition("MetricsAvailable", "False", "MetricsMissing", "1x12", paused),
        series(replicas, "0x12", paused),
        condition("ScalingActive", "True", "DryRun", "1x12", trial),
        condition("MetricsAvailable", "False", "MetricsMissing", "1x12", trial),
        series(replicas, "0x12", trial),
        condition("ScalingActive", "False", "Disabled", "1x12", off),
        condition("MetricsAvailable", "False", "MetricsMissing", "1x12", off),
        series(replicas, "2x12", off),
    ], [at("InferenceTuningOnFallback", 3), at("InferenceTuningMetricsMissing", 8),
        at("InferenceTuningOnFallback", 7, {"exp_labels": WARNING, "exp_annotations": {
            "summary": "prod/qwen is on its metrics fallback: raised toward "
                       "fallbackReplicas, none removed"}}),
        at("InferenceTuningMetricsMissing", 12, {
            "exp_labels": {**WARNING, "reason": "MetricsMissing"}, "exp_annotations": {
                "summary": "prod/qwen: MetricsMissing (see its MetricsAvailable condition)"}})])
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_an_outdated_crd_alerts_once_for_every_operator_pod_until_it_is_applied(
        tmp_path: Path) -> None:
    old, ours = "sha256:0123456789abcdef", "sha256:f7193fc2e206ebad"

    def crd(values: str, pod: str, installed: str = old) -> dict[str, str]:
        return series("infertune_crd_schema_current", values, {}, installed=installed,
                      release=ours, pod=pod)

    # Two operator pods say it for 20 minutes; then the CRD is applied (1 from 20m on, under
    # the new digest). A third pod of the new release, Ready at once, is current all along.
    ran = promtool_test(tmp_path, [
        crd("0x20", "infertune-a"), crd("0x20", "infertune-b"),
        crd("_x20 1x10", "infertune-a", ours), crd("1x30", "infertune-c", ours),
    ], [at("InfertuneCRDOutdated", 8),
        at("InfertuneCRDOutdated", 12, {
            "exp_labels": {"severity": "warning", "installed": old, "release": ours},
            "exp_annotations": {"summary": f"the installed InferenceTuning CRD (digest {old}; "
                                           f"the operator's {ours}) would drop fields the "
                                           "operator writes, or is absent: the operator's log "
                                           "and kubectl describe crd "
                                           "inferencetunings.infertune.io say what to "
                                           "apply"}}),
        at("InfertuneCRDOutdated", 27)])
    assert ran.returncode == 0, ran.stdout + ran.stderr
