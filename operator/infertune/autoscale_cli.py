"""`infertune autoscale evaluate`: one evaluation with the operator's adapter and engine.

It reads the signals from Prometheus, runs the same decision the operator runs, and prints the
signals, the decision and its reason. It starts from an empty stabilization window (the CLI
has no status to resume from), so it may propose a scale-in the operator would still hold.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from infertune.api.spec import InferenceTuning
from infertune.metrics.access import PrometheusAccess


def add_autoscale_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from infertune.metrics.access import add_access_options

    autoscale = commands.add_parser("autoscale", help="preview autoscaling decisions")
    verbs = autoscale.add_subparsers(dest="autoscale_command", required=True)
    evaluate = verbs.add_parser(
        "evaluate", help="read the signals of one InferenceTuning and print the decision")
    evaluate.add_argument("tuning", metavar="TUNING.yaml", help="file with one InferenceTuning")
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
        tuning = load_tuning(Path(args.tuning))
        result = evaluate(tuning, args.prometheus, args.replicas, args.timeout, time.time(),
                          access_from_args(args))
    except (PlanInputError, ValueError) as exc:
        print(str(exc), file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(_text(result))
    return 0


def evaluate(tuning: InferenceTuning, prometheus: str, replicas: int | None,
             timeout_s: float, now: float,
             access: PrometheusAccess | None = None) -> dict[str, Any]:
    """One evaluation, as the JSON the command prints."""
    from infertune.metrics.prometheus import NO_ACCESS_OPTIONS, PrometheusSource
    from infertune.metrics.source import target_for_tuning
    from infertune.scaling.batching import recommend_batching
    from infertune.scaling.engine import decide_scale
    from infertune.scaling.state import ScalingState

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
    decision = decide_scale(spec, current, signals, ScalingState(), now)
    batching = recommend_batching(tuning.spec.batching, tuning.spec.engine, spec,
                                  decision.signals, None)
    return {
        "tuning": target.key,
        "currentReplicas": current,
        "currentReplicasAssumed": replicas is None,
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
    lines = [
        f"{result['tuning']}: {result['action']} {result['currentReplicas']} -> "
        f"{result['desiredReplicas']}{assumed}",
        f"reason: {result['reason']}",
        f"queue per replica: {signals['queuePerReplica']}",
        f"latency ({signals['latencyKind']}): {signals['latencySeconds']} s at "
        f"{signals['requestRate']} req/s, {signals['latencyBreaches']} samples above target",
    ]
    lines += [f"problem: {p}" for p in signals["problems"]]
    if result["batching"] is not None:
        b = result["batching"]
        lines.append(f"batching: {b['knob']} -> {b['recommended']} ({b['reason']})")
    return "\n".join(lines)
