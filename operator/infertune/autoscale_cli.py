"""`infertune autoscale evaluate`: one evaluation with the operator's adapter and engine.

It reads the signals from Prometheus, runs the same decision the operator runs, and prints the
signals, the decision and its reason. From a file it is the operator's evaluation of a new
tuning: it starts from an empty stabilization window (there is no status to resume from), so it
may propose a scale-in the operator would still hold, and knows of nothing that stops the
writes. With --live NAMESPACE/NAME it reads the tuning from the cluster instead: its spec as the
operator sees it, the state the operator keeps in status.autoscaling.state (the windows), and
the Deployment's replicas from its scale subresource, so it decides as the operator would now.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infertune.api.scaling import MOST_REPLICAS
from infertune.api.spec import InferenceTuning, Mode
from infertune.cli import count_type, kubeconfig_option, seconds_type
from infertune.metrics.access import NO_ACCESS_OPTIONS, PrometheusAccess

if TYPE_CHECKING:  # the engine and the controller are imported when a command runs
    from infertune.autoscale_live import Live
    from infertune.controller.scaling_report import Blocked
    from infertune.scaling.engine import ScaleDecision


METRICS_MISSING = 3
"""Exit status of an evaluation that ran without every signal (the operator's MetricsAvailable
would be False): a preset or query that matches no series fails a script's check."""
EXIT_STATUS = (
    "exit status: 0 evaluated with every signal; 1 bad input, or the cluster cannot be read "
    "(--live); 2 a command line that does not parse (an unknown option, a value of the wrong "
    "type, --prometheus-* options that cannot be used), as for every command; "
    f"{METRICS_MISSING} evaluated, but a signal is missing (no "
    "series, stale, or Prometheus failed) or the latency cannot be compared with the target "
    "(the histogram's buckets): the decision holds where data is missing (a latency that "
    "cannot be compared has no say, and the queue may still scale in), and each problem "
    "from a query names it")
OTHER_TARGET = "status.autoscaling holds the windows of Deployment"
"""How a note begins that says the stored windows are another Deployment's."""
FILE_WRITE_NOTE = ("from a file, no HorizontalPodAutoscaler, other InferenceTuning or replica "
                   "fight is known, any of which stops the writes; --live reads them")
"""Said beside a write previewed from a file: the cluster may hold what stops it."""


def add_autoscale_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from infertune.metrics.access import add_access_options, add_templates_option

    autoscale = commands.add_parser("autoscale", help="preview autoscaling decisions")
    verbs = autoscale.add_subparsers(dest="autoscale_command", required=True,
                                     metavar="COMMAND")
    evaluate = verbs.add_parser(
        "evaluate", help="read the signals of one InferenceTuning and print the decision",
        epilog=EXIT_STATUS)
    evaluate.add_argument("tuning", metavar="TUNING.yaml", nargs="?",
                          help="file with one InferenceTuning, - for standard input (or "
                          "--live)")
    evaluate.add_argument("--live", metavar="NAMESPACE/NAME", type=_live_ref,
                          help="read the InferenceTuning, its stored autoscaling state and the "
                               "Deployment's replicas from the cluster instead of a file")
    evaluate.add_argument("-n", "--namespace", metavar="NAMESPACE", type=_namespace,
                          help="the namespace of a tuning whose file gives none (as kubectl "
                          "apply -n); default: default, said on standard error")
    evaluate.add_argument("--kubeconfig", type=kubeconfig_option, metavar="PATH",
                          help="with --live: kubeconfig file (default: in-cluster, then "
                          "$KUBECONFIG, then ~/.kube/config)")
    evaluate.add_argument("--prometheus", "--prometheus-url", dest="prometheus", metavar="URL",
                          type=_prometheus_url,
                          help="Prometheus base URL, for example http://prometheus:9090 "
                          "(default: $INFERTUNE_PROMETHEUS_URL; --prometheus-url, as infertune "
                          "run names it, is the same option)")
    add_access_options(evaluate)
    add_templates_option(evaluate)
    evaluate.add_argument("--replicas", type=count_type("a Deployment's replica count", 0,
                                                           MOST_REPLICAS), metavar="N",
                          help="current replicas of the Deployment (default: minReplicas; "
                          "with --live, the Deployment's own)")
    evaluate.add_argument("--output", choices=("text", "json"), default="text",
                          help="text (default): the signals, the decision and its reason; "
                          "json: the same with every field (signals, desiredReplicas, action, "
                          "reason, ...)")
    evaluate.add_argument("--timeout", type=seconds_type(most=3600), default=5.0,
                          metavar="SECONDS", help="per-query timeout, and with --live of each "
                          "Kubernetes API request (default 5, at most 3600)")
    evaluate.set_defaults(handler=evaluate_command)


def _namespace(text: str) -> str:
    """-n: a namespace name, checked as the command line is parsed (exit 2): any text was
    taken, `-n Bad_NS` asked whether its pods are scraped, `-n ""` read as default, and
    control characters reached the terminal."""
    from infertune.autoscale_live import namespace_problem

    if (problem := namespace_problem(text)) is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def _live_ref(text: str) -> str:
    """--live: NAMESPACE/NAME, checked as the command line is parsed (exit 2, as a value of
    the wrong type: a malformed one was exit 1, as bad input)."""
    from infertune.autoscale_live import split_ref

    try:
        split_ref(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--live {text!r}: ")) from None
    return text


def _prometheus_url(text: str) -> str:
    """--prometheus: a base URL the adapter can use, checked as the command line is parsed."""
    from infertune.metrics.prometheus import url_problem

    problem = url_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def evaluate_command(args: argparse.Namespace) -> int:
    from infertune.autoscale_live import read_live
    from infertune.metrics.access import PROMETHEUS_URL_ENV, access_from_args
    from infertune.metrics.prometheus import check_access
    from infertune.planning import PlanInputError, load_tuning_and_template
    from infertune.scaling.signals import seconds

    # Command-line errors, exit 2 as argparse's own (README: exit codes).
    if (args.tuning is None) == (args.live is None):
        print("give either TUNING.yaml or --live NAMESPACE/NAME", file=sys.stderr)
        return 2
    if args.live is None and args.kubeconfig is not None:
        print("--kubeconfig is only read with --live", file=sys.stderr)
        return 2
    if args.live is not None and args.namespace is not None:
        print("-n is for a tuning file without a namespace; --live names it: "
              "--live NAMESPACE/NAME", file=sys.stderr)
        return 2
    if args.prometheus is None:
        # As `infertune run` reads it: in the operator's pod the URL is at hand.
        given = os.environ.get(PROMETHEUS_URL_ENV)
        if not given:
            print(f"give --prometheus URL (or set ${PROMETHEUS_URL_ENV}, as infertune run "
                  "reads it)", file=sys.stderr)
            return 2
        try:
            args.prometheus = _prometheus_url(given)
        except argparse.ArgumentTypeError as exc:
            print(f"${PROMETHEUS_URL_ENV}: {exc}", file=sys.stderr)
            return 2
    try:
        # Before anything is read: a malformed header was said after the tuning file's error,
        # or after the cluster's timeouts with --live, and with the exit of bad input.
        access = access_from_args(args)
        check_access(args.prometheus, access)  # a CA for an http:// URL
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    try:
        if args.live is None:
            (tuning, beside), live = load_tuning_and_template(Path(args.tuning)), None
            given = tuning.metadata.namespace
            if given is not None and args.namespace not in (None, given):
                print(f"-n {args.namespace}: the tuning's metadata.namespace is {given} (as "
                      "kubectl apply refuses a namespace that does not match)",
                      file=sys.stderr)
                return 2
            if given is None:
                # Read as namespace default without a word, a tuning of another namespace
                # had "no series ... are they scraped?" for its pods, which are elsewhere.
                namespace = args.namespace or "default"
                if args.namespace is None:
                    print("infertune: the tuning gives no metadata.namespace: taken as "
                          "default (give -n NAMESPACE, as kubectl apply -n)", file=sys.stderr)
                tuning = tuning.model_copy(update={"metadata": tuning.metadata.model_copy(
                    update={"namespace": namespace})})
        else:
            live = read_live(args.live, args.kubeconfig, args.timeout)
            tuning, beside = live.tuning, None
        result = evaluate(tuning, args.prometheus, args.replicas, args.timeout, time.time(),
                          access, live,
                          templates=not args.no_promql_templates, template=beside)
    except (PlanInputError, ValueError) as exc:
        print(str(exc), file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        assert tuning.spec.autoscaling is not None  # evaluate refuses a tuning without it
        print(_text(result, seconds(tuning.spec.autoscaling.latency.target)))
    if result["signals"]["problems"]:
        # Each problem once, without its query (printed above, or in the JSON): three copies
        # of 4 KB of PromQL buried the cause.
        # Not "metrics missing" alone: a latency under the histogram's lowest bucket is
        # there and cannot be compared, and the queue may still scale in.
        print(f"metrics missing or not comparable (exit {METRICS_MISSING}): "
              + "; ".join(_without_query(p) for p in result["signals"]["problems"]),
              file=sys.stderr)
        return METRICS_MISSING
    return 0


def evaluate(tuning: InferenceTuning, prometheus: str, replicas: int | None,
             timeout_s: float, now: float, access: PrometheusAccess = NO_ACCESS_OPTIONS,
             live: Live | None = None, templates: bool = True,
             template: dict[str, Any] | None = None) -> dict[str, Any]:
    """One evaluation, as the JSON the command prints. With `live` (what --live read) it is
    the operator's own: its stored windows, the Deployment's replicas, and whether it would
    write them; without, it is the operator's evaluation of a new tuning (plan_evaluation over
    an empty status): the windows start as a new tuning's, and the batching step starts from
    the knob on `template` (the target's spec.template.spec, when the file holds the
    Deployment)."""
    from infertune.api.manifests import printable
    from infertune.controller.autoscaling import evaluated_in_slot, slot_start
    from infertune.controller.fights import lost_scale_event, with_scale_event, written_replicas
    from infertune.controller.scaling_report import plan_evaluation
    from infertune.metrics.plan import Signal
    from infertune.metrics.prometheus import PrometheusSource
    from infertune.metrics.source import target_for_tuning
    from infertune.scaling.state import format_time
    from infertune.tuning.pod_patch import template_batching

    spec = tuning.spec.autoscaling
    if spec is None:
        raise ValueError(f"{tuning.metadata.name}: spec.autoscaling is not set, so nothing is "
                         "scaled; add an autoscaling section to preview it")
    if replicas is not None and replicas < 0:
        raise ValueError(f"--replicas {replicas}: must be 0 or more")
    known = replicas if replicas is not None or live is None else live.replicas
    current = spec.min_replicas if known is None else known
    target = target_for_tuning(tuning)
    source = PrometheusSource(prometheus, timeout_s=timeout_s, access=access,
                              templates=templates)
    signals = source.fetch([target], now)[target.key]
    queries = source.queries_for(target)
    state = "empty"
    if live is None:
        # The operator's evaluation of a new tuning: nothing stored, no replica fight, and no
        # writer known to stop it (a file shows neither HPAs nor other tunings). Deciding
        # with decide_scale alone left out what the evaluation adds to the decision.
        blocked: Blocked | None = None
        planned = plan_evaluation(tuning.spec, 0, {}, signals, current, None, now,
                                  template=None if template is None else
                                  template_batching(tuning.spec, template))
        notes = [FILE_WRITE_NOTE] if planned.write is not None else []
    else:
        blocked, fight = live.blocked(current, now), live.fight(current, now)
        deployment = tuning.spec.target_ref.name
        written = written_replicas(live.status, deployment, live.created)
        notes = list(live.notes)
        status = live.status
        stored_for = (status.get("autoscaling") or {}).get("target")
        if stored_for in (None, deployment):
            state = "status.autoscaling.state"
        else:
            # Escaped: the status's text is whatever was written there (a line of its own,
            # forged by a newline, read as the operator's).
            notes.append(f"{OTHER_TARGET} {printable(str(stored_for))} (spec.targetRef "
                         "before): they do not count, and this one's start afresh, as the "
                         "operator starts them")
        # As the operator's next evaluation finds it: a write of its own that its status does
        # not hold (it stopped before the status write) counts in the rate limits.
        lost = lost_scale_event(status, deployment, live.replicas, live.own_write_last, now)
        if lost is not None:
            status = with_scale_event(status, lost)
            notes.append(f"replicas {lost.change:+d} were the operator's own write, which its "
                         "status does not hold (it stopped before writing it, or that status "
                         "write has not landed yet): counted in the rate limits as made now, "
                         "as an operator that starts again counts it")
        # The ready count is the Deployment's, so it says nothing about --replicas.
        planned = plan_evaluation(tuning.spec, live.generation, status, signals, current,
                                  blocked, now, None if fight is None else fight.to_json(),
                                  written if written == current else None,
                                  live.ready if replicas is None else None, live.template,
                                  live.unprobed)
    decision = planned.decision
    write = {"replicas": planned.write,
             "why": why_written(tuning, decision, blocked, planned.write), "notes": notes}
    # The operator's own step: from the pod template's value, or the one it applied (then
    # waiting for the pods to run it). None when batching is Off (also when Off removes a
    # stored block).
    block = planned.status.get("batching")
    shown = None if block is None else {
        "knob": block["knob"], "recommended": block["recommended"], "reason": block["reason"]}
    interval = spec.interval.seconds
    start = slot_start(now, interval)
    # The operator evaluates each tuning at the start of each interval slot: this slot's is
    # due while the status holds none of it (made a little late, it is stamped with the
    # slot's start), else the next slot's. A file's tuning may not run anywhere: none.
    upcoming = (None if live is None else start + interval
                if evaluated_in_slot(live.status, now, interval) else start)
    return {
        "tuning": target.key,
        # A rate-limit period or a window that ends before the operator's next evaluation
        # does not hold it then.
        "evaluatedAt": format_time(now),
        "operatorNextEvaluation": None if upcoming is None else format_time(upcoming),
        "currentReplicas": current,
        "currentReplicasAssumed": known is None,
        "state": state,
        "write": write,
        "desiredReplicas": decision.desired_replicas,
        "action": decision.action.value,
        "reason": decision.reason,
        "signals": decision.signals.to_json(),
        # Always, not only for a signal without data: checking a number by hand needs them.
        "queries": {"queue": signals.queue.query or queries.get(Signal.QUEUE, ""),
                    "latency": signals.latency.query or queries.get(Signal.LATENCY, ""),
                    "requestRate": (signals.request_rate.query
                                    or queries.get(Signal.REQUEST_RATE, ""))},
        "batching": shown,
    }


def why_written(tuning: InferenceTuning, decision: ScaleDecision, blocked: Blocked | None,
                 written: int | None) -> str:
    if written is not None:
        return f"the operator writes {written} replicas through deployments/scale"
    if decision.desired_replicas == decision.current_replicas:
        return "nothing to write: the replicas stay"
    if tuning.spec.mode is Mode.DRY_RUN:
        return "not written: mode DryRun"
    assert blocked is not None
    return f"not written ({blocked.reason}): {blocked.message}"


def _text(result: dict[str, Any], target_s: float) -> str:
    """The result for people: numbers rounded, latencies in milliseconds as the reasons write
    them (`target_s`, the latency target, keeps one close to it from reading as it), and
    "no data" where a signal has none (the JSON keeps the raw values and nulls)."""
    from infertune.scaling.signals import latency_text

    signals = result["signals"]
    latency, rate = signals["latencySeconds"], signals["requestRate"]
    floor = signals.get("latencyFloorSeconds")
    # As status.autoscaling.p99 and the Latency column say it: under the lowest bucket the
    # quantile is a fraction of the bound, not the latency (297ms read as measured).
    shown = ("no data" if latency is None else latency_text(latency, target_s)
             if floor is None else f"<={latency_text(floor)} (under the histogram's lowest "
             "bucket)")
    assumed = " (assumed: minReplicas; pass --replicas)" if result["currentReplicasAssumed"] \
        else ""
    windows = ("stored by the operator" if result["state"] != "empty" else
               "empty (the stored ones are another Deployment's: see the notes)"
               if any(n.startswith(OTHER_TARGET) for n in result["write"]["notes"]) else
               "empty (a file has no status; --live reads the operator's)")
    lines = [
        f"{result['tuning']}: {result['action']} {result['currentReplicas']} -> "
        f"{result['desiredReplicas']}{assumed}",
        f"reason: {result['reason']}",
        f"as of {result['evaluatedAt']}" + (
            "" if result["operatorNextEvaluation"] is None else
            f"; the operator's next evaluation is the one of {result['operatorNextEvaluation']}"
            ", when rate-limit periods and windows may have moved on"),
        f"stabilization and rate-limit windows: {windows}",
        f"queue per replica: {_rounded(signals['queuePerReplica'])}",
        f"latency ({signals['latencyKind']}): {shown} at "
        f"{'an unknown request rate' if rate is None else _rounded(rate) + ' req/s'}, "
        f"{signals['latencyBreaches']} samples above target",
    ]
    # Without the query, which its own line gives below: a 2 KB query in each of three lines
    # hid what was wrong (Prometheus not reachable, said three times).
    lines += [f"problem: {_without_query(p)}" for p in signals["problems"]]
    lines += [f"warning: Prometheus warned with its answer: {w}"
              for w in signals["warnings"]]
    if result["write"] is not None:
        lines.append(f"write: {result['write']['why']}")
        lines += [f"note: {n}" for n in result["write"]["notes"]]
    if result["batching"] is not None:
        b = result["batching"]
        lines.append(f"batching: {b['knob']} -> {b['recommended']} ({b['reason']})")
    # Last, as they are long: for this Deployment alone, to paste into Prometheus.
    lines += [f"query ({signal}): {query}" for signal, query in result["queries"].items()
              if query]
    return "\n".join(lines)


def _without_query(problem: str) -> str:
    """A signal's problem (TargetSignals.problems) without the query it names."""
    return problem.split(" (query: ", 1)[0]


def _rounded(value: float | None) -> str:
    """A signal to two decimals, without trailing zeros (30, 6.92); "no data" for None."""
    if value is None:
        return "no data"
    return f"{value:.2f}".rstrip("0").rstrip(".")
