"""`infertune autoscale evaluate`: one evaluation with the operator's adapter and engine.

It reads the signals from Prometheus, runs the same decision the operator runs, and prints the
signals, the decision and its reason. From a file it starts from an empty stabilization window
(there is no status to resume from), so it may propose a scale-in the operator would still
hold. With --live NAMESPACE/NAME it reads the tuning from the cluster instead: its spec as the
operator sees it, the state the operator keeps in status.autoscaling.state (the windows), and
the Deployment's replicas from its scale subresource, so it decides as the operator would now.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, cast

from infertune.api.spec import InferenceTuning
from infertune.metrics.access import PrometheusAccess
from infertune.scaling.state import ScalingState


def add_autoscale_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from infertune.metrics.access import add_access_options

    autoscale = commands.add_parser("autoscale", help="preview autoscaling decisions")
    verbs = autoscale.add_subparsers(dest="autoscale_command", required=True)
    evaluate = verbs.add_parser(
        "evaluate", help="read the signals of one InferenceTuning and print the decision")
    evaluate.add_argument("tuning", metavar="TUNING.yaml", nargs="?",
                          help="file with one InferenceTuning (or --live)")
    evaluate.add_argument("--live", metavar="NAMESPACE/NAME",
                          help="read the InferenceTuning, its stored autoscaling state and the "
                               "Deployment's replicas from the cluster instead of a file")
    evaluate.add_argument("--kubeconfig", help="with --live: kubeconfig file (default: "
                          "in-cluster, then $KUBECONFIG, then ~/.kube/config)")
    evaluate.add_argument("--prometheus", required=True, metavar="URL",
                          help="Prometheus base URL, for example http://prometheus:9090")
    add_access_options(evaluate)
    evaluate.add_argument("--replicas", type=int, metavar="N",
                          help="current replicas of the Deployment (default: minReplicas)")
    evaluate.add_argument("--output", choices=("text", "json"), default="text")
    evaluate.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                          help="per-query timeout (default 5)")
    evaluate.set_defaults(handler=evaluate_command)


def evaluate_command(args: argparse.Namespace) -> int:
    from infertune.metrics.access import access_from_args
    from infertune.planning import PlanInputError, load_tuning

    try:
        if (args.tuning is None) == (args.live is None):
            raise ValueError("give either TUNING.yaml or --live NAMESPACE/NAME")
        if args.live is None:
            if args.kubeconfig is not None:
                raise ValueError("--kubeconfig is only read with --live")
            tuning, replicas, state = load_tuning(Path(args.tuning)), args.replicas, None
        else:
            tuning, live_replicas, state = read_live(args.live, args.kubeconfig)
            replicas = live_replicas if args.replicas is None else args.replicas
        result = evaluate(tuning, args.prometheus, replicas, args.timeout, time.time(),
                          access_from_args(args), state)
    except (PlanInputError, ValueError) as exc:
        print(str(exc), file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(_text(result))
    return 0


def read_live(ref: str, kubeconfig: str | None) -> tuple[InferenceTuning, int, ScalingState]:
    """The tuning NAMESPACE/NAME from the cluster, its target's replicas (scale subresource)
    and the autoscaling state stored in its status; ValueError says what is missing."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import ConfigException
    from pydantic import ValidationError

    from infertune.api.errors import field_errors
    from infertune.api.spec import GROUP, PLURAL, VERSION
    from infertune.kube.client import configure

    namespace, slash, name = ref.partition("/")
    if not (slash and namespace and name) or "/" in name:
        raise ValueError(f"--live {ref!r}: expected NAMESPACE/NAME, for example serving/qwen")
    try:
        configure(kubeconfig)
    except (ConfigException, OSError) as exc:
        raise ValueError(f"--live: no cluster credentials ({exc}); pass --kubeconfig") from None
    what = f"InferenceTuning {namespace}/{name}"
    try:
        body = cast(dict[str, Any], client.CustomObjectsApi().get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name))
        what = f"the InferenceTuning's spec ({namespace}/{name})"
        tuning = InferenceTuning.model_validate(
            {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body})
        target = tuning.spec.target_ref.name
        what = f"Deployment {namespace}/{target} (spec.targetRef)"
        scale = client.AppsV1Api().read_namespaced_deployment_scale(target, namespace)
    except ApiException as exc:
        found = "not found" if exc.status == 404 else f"not readable (HTTP {exc.status})"
        raise ValueError(f"--live: {what} {found}") from None
    except ValidationError as exc:
        problems = "; ".join(str(e) for e in field_errors(exc, InferenceTuning))
        raise ValueError(f"--live: {what} does not validate: {problems}") from None
    stored = ((body.get("status") or {}).get("autoscaling") or {}).get("state")
    return tuning, int(scale.spec.replicas or 0) if scale.spec else 0, \
        ScalingState.from_json(stored)


def evaluate(tuning: InferenceTuning, prometheus: str, replicas: int | None,
             timeout_s: float, now: float, access: PrometheusAccess | None = None,
             state: ScalingState | None = None) -> dict[str, Any]:
    """One evaluation, as the JSON the command prints. `state` is the stored autoscaling
    state (--live); None starts from empty windows, as a new tuning would."""
    from infertune.metrics.prometheus import NO_ACCESS_OPTIONS, PrometheusSource
    from infertune.metrics.source import target_for_tuning
    from infertune.scaling.batching import recommend_batching
    from infertune.scaling.engine import decide_scale

    spec = tuning.spec.autoscaling
    if spec is None:
        raise ValueError(f"{tuning.metadata.name}: spec.autoscaling is not set, so nothing is "
                         "scaled; add an autoscaling section to preview it")
    if replicas is not None and replicas < 0:
        raise ValueError(f"--replicas {replicas}: must be 0 or more")
    current = spec.min_replicas if replicas is None else replicas
    target = target_for_tuning(tuning)
    source = PrometheusSource(prometheus, timeout_s=timeout_s, access=access or NO_ACCESS_OPTIONS)
    signals = source.fetch([target], now)[target.key]
    decision = decide_scale(spec, current, signals, ScalingState() if state is None else state, now)
    batching = recommend_batching(tuning.spec.batching, tuning.spec.engine, spec,
                                  decision.signals, None)
    return {
        "tuning": target.key,
        "currentReplicas": current,
        "currentReplicasAssumed": replicas is None,
        "state": "status.autoscaling.state" if state is not None else "empty",
        "desiredReplicas": decision.desired_replicas,
        "action": decision.action.value,
        "reason": decision.reason,
        "signals": decision.signals.to_json(),
        "queries": {"queue": signals.queue.query, "latency": signals.latency.query,
                    "requestRate": signals.request_rate.query},
        "batching": None if batching is None else {
            "knob": batching.knob.value, "recommended": batching.recommended,
            "reason": batching.reason},
    }


def _text(result: dict[str, Any]) -> str:
    signals = result["signals"]
    assumed = " (assumed: minReplicas; pass --replicas)" if result["currentReplicasAssumed"] \
        else ""
    windows = ("stored by the operator" if result["state"] != "empty" else
               "empty (a file has no status; --live reads the operator's)")
    lines = [
        f"{result['tuning']}: {result['action']} {result['currentReplicas']} -> "
        f"{result['desiredReplicas']}{assumed}",
        f"reason: {result['reason']}",
        f"stabilization and rate-limit windows: {windows}",
        f"queue per replica: {signals['queuePerReplica']}",
        f"latency ({signals['latencyKind']}): {signals['latencySeconds']} s at "
        f"{signals['requestRate']} req/s, {signals['latencyBreaches']} samples above target",
    ]
    lines += [f"problem: {p}" for p in signals["problems"]]
    if result["batching"] is not None:
        b = result["batching"]
        lines.append(f"batching: {b['knob']} -> {b['recommended']} ({b['reason']})")
    return "\n".join(lines)
