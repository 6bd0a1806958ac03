"""The alert rules of docs/prometheus-alerts.yaml, run by promtool (Prometheus's own rule
engine) over series in the shape the operator exports (controller/exported.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from tests.conftest import ROOT

RULES = ROOT / "docs" / "prometheus-alerts.yaml"
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None,
                                reason="needs promtool (apt-get install prometheus)")

TUNING = 'namespace="prod", name="qwen", deployment="qwen-vllm"'


def condition(kind: str, status: str, reason: str) -> str:
    return (f'infertune_autoscaling_condition{{{TUNING}, type="{kind}", status="{status}", '
            f'reason="{reason}"}}')


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
    labels = {"severity": "warning", "namespace": "prod", "name": "qwen",
              "deployment": "qwen-vllm"}
    trial = 'namespace="prod", name="trial", deployment="trial"'
    blocked = 'namespace="prod", name="hpa", deployment="hpa"'
    limited = 'type="ScalingLimited", status="True", reason="TooManyReplicas"'
    ran = promtool_test(tmp_path, [
        {"series": condition("ScalingLimited", "True", "TooManyReplicas"),
         "values": "1x20"},
        {"series": f'infertune_autoscaling_action{{{TUNING}, action="Hold", mode="Enforce"}}',
         "values": "1x20"},
        # A DryRun trial and a tuning an HPA keeps from writing: not paged as at max.
        {"series": f"infertune_autoscaling_condition{{{trial}, {limited}}}", "values": "1x20"},
        {"series": f'infertune_autoscaling_action{{{trial}, action="Hold", mode="DryRun"}}',
         "values": "1x20"},
        {"series": f"infertune_autoscaling_condition{{{blocked}, {limited}}}", "values": "1x20"},
        {"series": f'infertune_autoscaling_action{{{blocked}, action="Hold", mode="Enforce"}}',
         "values": "1x20"},
        {"series": f'infertune_autoscaling_condition{{{blocked}, type="ScalingActive", '
                   'status="False", reason="HorizontalPodAutoscalerPresent"}',
         "values": "1x20"},
    ], [at("InferenceTuningAtMaxReplicas", 5),
        at("InferenceTuningAtMaxReplicas", 12, {"exp_labels": labels, "exp_annotations": {
            "summary": "prod/qwen is held at maxReplicas",
            "description": "The signals of Deployment qwen-vllm call for more replicas than "
                           "spec.autoscaling.maxReplicas allows; status.autoscaling.reason has "
                           "the numbers. Raise maxReplicas if the cluster has room."}})])
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_a_tuning_that_does_not_write_replicas_alerts_but_not_a_disabled_one(
        tmp_path: Path) -> None:
    fight = {"severity": "warning", "namespace": "prod", "name": "qwen",
             "deployment": "qwen-vllm", "reason": "ReplicaFight"}
    other = 'namespace="prod", name="off", deployment="off"'
    ran = promtool_test(tmp_path, [
        {"series": condition("ScalingActive", "False", "ReplicaFight"), "values": "1x10"},
        {"series": (f'infertune_autoscaling_condition{{{other}, type="ScalingActive", '
                    'status="False", reason="Disabled"}'), "values": "1x10"},
        {"series": ('infertune_autoscaling_condition{namespace="prod", name="zero", '
                    'deployment="zero", type="ScalingActive", status="False", '
                    'reason="ScaledToZero"}'), "values": "1x10"},
    ], [at("InferenceTuningNotScaling", 3),
        at("InferenceTuningNotScaling", 7, {"exp_labels": fight, "exp_annotations": {
            "summary": "prod/qwen does not scale: ReplicaFight",
            "description": "The ScalingActive condition of the InferenceTuning says why "
                           "(kubectl describe itune -n prod qwen)."}})])
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_a_tuning_no_longer_evaluated_alerts_after_three_of_its_intervals(
        tmp_path: Path) -> None:
    """Evaluated every 15 s until 5m, then no more; a second tuning with a 10m interval,
    evaluated on time, never alerts (a fixed threshold fired on it every cycle)."""
    slow = 'namespace="prod", name="batch", deployment="batch"'
    ran = promtool_test(tmp_path, [
        # The value is the time of the last evaluation, scraped each minute.
        {"series": f"infertune_autoscaling_last_evaluation_timestamp_seconds{{{TUNING}}}",
         "values": "0+60x5 300x15"},
        {"series": f"infertune_autoscaling_interval_seconds{{{TUNING}}}", "values": "15x20"},
        {"series": f"infertune_autoscaling_last_evaluation_timestamp_seconds{{{slow}}}",
         "values": "0x9 600x10 1200"},
        {"series": f"infertune_autoscaling_interval_seconds{{{slow}}}", "values": "600x20"},
    ], [at("InferenceTuningNotEvaluated", 6),
        *(at("InferenceTuningNotEvaluated", minutes, {"exp_labels": {
            "severity": "warning", "namespace": "prod", "name": "qwen",
            "deployment": "qwen-vllm"}, "exp_annotations": {
                "summary": f"prod/qwen was last evaluated {ago} ago"}})
          for minutes, ago in ((8, "3m 0s"), (19, "14m 0s")))])
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_no_leading_operator_alerts(tmp_path: Path) -> None:
    ran = promtool_test(tmp_path, [
        {"series": "infertune_autoscaling_prometheus_fetches_total", "values": "1+4x3"},
    ], [at("InfertuneAutoscalerAbsent", 3),
        # (Exported for 10 minutes: quiet all along, or the rule watches another name.)
        # Gone after 3m: stale 5m later, then absent for 5m.
        at("InfertuneAutoscalerAbsent", 15, {"exp_labels": {"severity": "critical"},
                                             "exp_annotations": {
            "summary": "no infertune operator leads, or none is scraped: nothing is "
                       "autoscaled"}})])
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_evaluations_that_keep_failing_alert(tmp_path: Path) -> None:
    ran = promtool_test(tmp_path, [
        {"series": 'infertune_autoscaling_evaluation_failures_total{namespace="prod", '
                   'name="qwen"}', "values": "_ _ _ 1 3 5 7 9"},
    ], [at("InferenceTuningEvaluationsFailing", 3),
        at("InferenceTuningEvaluationsFailing", 7, {"exp_labels": {
            "severity": "warning", "namespace": "prod", "name": "qwen"}, "exp_annotations": {
                "summary": "prod/qwen: 9 evaluations failed in 10 minutes"}})])
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_a_leading_operator_is_not_absent(tmp_path: Path) -> None:
    ran = promtool_test(tmp_path, [
        {"series": "infertune_autoscaling_prometheus_fetches_total", "values": "1+4x12"},
    ], [at("InfertuneAutoscalerAbsent", 11)])
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_a_fallback_and_a_missing_signal_alert(tmp_path: Path) -> None:
    ran = promtool_test(tmp_path, [
        {"series": condition("ScalingActive", "True", "Fallback"), "values": "1x12"},
        {"series": condition("MetricsAvailable", "False", "MetricsMissing"),
         "values": "1x12"},
    ], [at("InferenceTuningOnFallback", 3), at("InferenceTuningMetricsMissing", 8),
        at("InferenceTuningOnFallback", 7, {"exp_labels": {
            "severity": "warning", "namespace": "prod", "name": "qwen",
            "deployment": "qwen-vllm"}, "exp_annotations": {
                "summary": "prod/qwen runs on fallbackReplicas: no metrics"}}),
        at("InferenceTuningMetricsMissing", 12, {"exp_labels": {
            "severity": "warning", "namespace": "prod", "name": "qwen",
            "deployment": "qwen-vllm", "reason": "MetricsMissing"}, "exp_annotations": {
                "summary": "prod/qwen: MetricsMissing (see its MetricsAvailable condition)"}})])
    assert ran.returncode == 0, ran.stdout + ran.stderr
