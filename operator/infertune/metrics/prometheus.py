"""The Prometheus metrics source, on prometheus-api-client's instant and range queries.

One HTTP request per query plan (plan.py). Every failure becomes "no data" with the reason and
the query a person can run: NaN and infinite values, a series that is absent or stale, a
timeout, a refused connection, an HTTP error.
"""

from __future__ import annotations

import ast
import ipaddress
import json
import logging
import math
import operator
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, NamedTuple, cast
from urllib.parse import urlsplit

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from requests.adapters import HTTPAdapter
from urllib3.exceptions import (
    DecodeError,
    NameResolutionError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
)
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.exceptions import SSLError as Urllib3SSLError
from urllib3.exceptions import TimeoutError as Urllib3Timeout
from urllib3.util.retry import Retry

from infertune.api.manifests import printable
from infertune.api.units import duration_seconds
from infertune.metrics.access import (
    AUTH_TYPE_OPTION,
    CA_OPTION,
    CERT_OPTION,
    CREDENTIALS_OPTION,
    NO_ACCESS_OPTIONS,
    AccessError,
    Credentials,
    PrometheusAccess,
)
from infertune.metrics.plan import QueryPlan, Signal, plan_queries, unsupported
from infertune.metrics.presets import HistogramLatency, MeanLatency
from infertune.metrics.promql import (
    STAT_LABEL,
    TARGET_LABEL,
    duration,
    requests_counter,
    spellings,
)
from infertune.metrics.source import MetricsTarget
from infertune.scaling.signals import (
    NEGATIVE,
    NOT_READ,
    ONLY_NAN,
    STALE,
    Series,
    TargetSignals,
    Window,
    full_window_steps,
)
from infertune.scaling.state import format_time

PARALLEL_QUERIES = 4
"""Queries of one batch in flight at once (a batch has one per signal per query shape)."""
PARALLEL_TEMPLATE_QUERIES = 4
"""Queries of PromQL templates in flight at once, in a pool of their own: a tenant's slow
template must not hold the presets' queries, which every other tuning waits for."""
TEMPLATES_OFF = ("PromQL templates (spec.metrics.queries) are turned off in this operator "
                 "(infertune run --no-promql-templates); give metric names in spec.metrics "
                 "instead")
ANSWER_TIMEOUTS = 1.5
"""How long a query that started has to answer in full, in timeouts: requests' timeout is per
read, which an answer sent a little at a time never reaches."""
BUDGET_TIMEOUTS = 1.5
"""Queries not started within this many query timeouts are no data for their tunings this
cycle (the others go on); so a batch takes at most this plus one timeout (plus ANSWER_TIMEOUTS
when answers come slowly)."""
FLOOR_REFRESH_S = 600.0
"""How long the latency histograms' lowest bucket bounds are kept before they are read again
(one instant query per latency plan every 10 minutes, not one per cycle)."""
FLOOR_FORGET_S = 2 * FLOOR_REFRESH_S
"""Bounds no batch used for this long are forgotten."""
FLOOR_RETRY_S = 60.0
"""After a failed read of the bounds, or when a target with latency data has none, how long
until they are read again."""
SeriesKey = tuple[str, str]
"""(namespace, Deployment) as the target label set puts them."""
SignalData = Series | Window


def url_problem(url: str) -> str | None:
    """What makes `url` no Prometheus base URL the adapter can use, None when it is one
    (`infertune autoscale evaluate --prometheus` refuses it as a command line that does not
    parse; the adapter as a ValueError)."""
    shown = _without_userinfo(url)
    if not url.startswith(("http://", "https://")):
        return f"Prometheus URL {shown!r} must start with http:// or https://"
    if any(c.isspace() for c in url):
        # A paste's trailing space read as "the port is not a number".
        return f"Prometheus URL {shown!r} holds a space or a line break; remove it"
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # "Invalid IPv6 URL"
        return f"Prometheus URL {shown!r}: {exc}; for example http://[fd00::1]:9090"
    try:
        port = parts.port  # ValueError: not a number, or above 65535
    except ValueError:
        port = 0
    if port == 0:
        return f"Prometheus URL {shown!r}: the port is not a number from 1 to 65535"
    if not parts.hostname:
        return f"Prometheus URL {shown!r} names no host; for example http://prometheus:9090"
    if "?" in url or "#" in url:
        # The API's paths are appended to it: every query then went to a wrong URL and
        # read as "answered with something other than JSON".
        return (f"Prometheus URL {shown!r} has a query string or a fragment ('?' or '#'), "
                "which the query API's paths cannot follow; give the server's base URL, with "
                "its path prefix if it has one (http://prometheus:9090, "
                "https://example.com/prometheus)")
    if parts.username is not None or parts.password is not None:
        # As the Authorization header on the command line is refused (access.py):
        # requests sends them as Basic credentials.
        # Given as an argument or as $INFERTUNE_PROMETHEUS_URL: both are shown (the process
        # list, the pod's spec), so the words fit either.
        return (f"Prometheus URL {shown!r} holds a user and password, and a command-line "
                "argument or an environment variable is shown to whoever lists processes or "
                f"reads the pod (the chart's Deployment too); put base64 of user:password in "
                f"a file and give it with "
                f"{CREDENTIALS_OPTION} and {AUTH_TYPE_OPTION} Basic (chart: "
                "prometheus.credentialsSecret)")
    return None


WHOLE_ANSWERS = {"partial_response": "false", "deny_partial_response": "1"}
"""Sent with every query: a Thanos Querier (`partial_response`) and a VictoriaMetrics cluster
(`deny_partial_response`) answer with what the stores that answered hold when one does not,
by default, and the pods of the one that failed were missing from the queue, the pod count
and the quantile while MetricsAvailable said True (a scale-out sized on the pods that
reported came out too small). Asked this way they fail instead, which is no data; Prometheus
itself ignores both."""


logger = logging.getLogger(__name__)


def cleartext_credentials(url: str, access: PrometheusAccess) -> str | None:
    """The warning when credentials would go to a host other than this one unencrypted
    (`--prometheus-credentials-file`, or a user:password in the URL, over http://), else
    None. Said, not refused: a proxy in the same pod or on the node may take http. A
    ServiceAccount token sent so can be read on the way and used with its permissions."""
    parts = urlsplit(url)
    if parts.scheme != "http" or (access.credentials_file is None and "@" not in parts.netloc):
        return None
    host = (parts.hostname or "").lower()
    try:
        if host == "localhost" or ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass  # a name, not an address
    return (f"Prometheus credentials are sent unencrypted to {_without_userinfo(url)}: use an "
            "https:// URL, or a token that may do nothing but read Prometheus (not the "
            "operator's own ServiceAccount token)")


class PrometheusSource:
    """Fetches signals from the Prometheus HTTP API at `url`, reached as `access` says. A
    `session` passed in is used as it is: its TLS settings (verify, cert) are the caller's."""

    def __init__(self, url: str, *, timeout_s: float = 5.0, resolution_s: float = 1.0,
                 access: PrometheusAccess = NO_ACCESS_OPTIONS,
                 session: requests.Session | None = None, templates: bool = True) -> None:
        problem = url_problem(url)
        if problem is not None:
            raise ValueError(problem)
        shown = _without_userinfo(url)
        if resolution_s <= 0 or timeout_s <= 0:
            raise ValueError("timeout_s and resolution_s must be above 0")
        check_access(url, access)
        if (said := cleartext_credentials(url, access)) is not None:
            logger.warning(said)
        self.url = url.rstrip("/")
        self.shown_url = shown.rstrip("/")
        """The URL as messages give it: requests sends a user:password@ in it as Basic
        credentials, and the messages go into MetricsAvailable, which whoever can read the
        tuning reads."""
        self.timeout_s = timeout_s
        self.templates = templates
        """False: tunings with PromQL templates are not read (infertune run
        --no-promql-templates): a template runs with the operator's access to Prometheus."""
        self.resolution_s = resolution_s
        if session is None:
            session = requests.Session()
            session.verify = access.session_verify
            if access.client_cert is not None:
                cert, key = access.client_cert
                session.cert = (str(cert), str(key))
        self._credentials = None if access.credentials_file is None else Credentials(access)
        # No retries inside a cycle: a failure is "no data" now and the next cycle asks again,
        # instead of one slow Prometheus holding every tuning's evaluation for several timeouts.
        self._client = PrometheusConnect(url=self.url, headers=dict(access.headers),
                                         session=session, retry=Retry(total=False))
        # In place of the client's adapter for the URL (no retries either): the answer is
        # read whole within ANSWER_TIMEOUTS, or the request ends (`_AnswerWithin`).
        session.mount(self.url, _AnswerWithin(timeout_s * ANSWER_TIMEOUTS))
        self._planned: tuple[tuple[MetricsTarget, ...], list[tuple[QueryPlan, _Query]]] = (
            (), [])
        self._pool = ThreadPoolExecutor(max_workers=PARALLEL_QUERIES,
                                        thread_name_prefix="prometheus-query")
        self._template_pool = ThreadPoolExecutor(max_workers=PARALLEL_TEMPLATE_QUERIES,
                                                 thread_name_prefix="prometheus-template")
        self._turns = {False: 0, True: 0}
        """Per pool (templated or not): where the next cycle starts its plans."""
        self._warned: dict[str, float] = {}
        """Each warning Prometheus answered with -> when a batch last had it (monotonic), for
        `_log_warnings`."""
        self._floor_texts: dict[int, str | None] = {}
        """id of each planned latency plan -> its floor query (kept with the plans)."""
        self._floor_used: dict[str, float] = {}
        """Floor query -> when a batch last used its bounds (monotonic)."""
        self._floor_family: dict[str, str | None] = {}
        """Floor query -> the same query over no namespace or Deployment in particular: the
        histogram (and labels) it reads, which bounds may be borrowed within."""
        self._floors: dict[str, _Floors] = {}
        """Per floor query (promql.latency_floor_query): the lowest finite bucket bound of
        each target's histogram."""
        self._bounds_queries: dict[tuple[int, str], str] = {}
        """(id of a planned latency plan, target key) -> the query of that target's bucket
        bounds alone, for the problem said while they are not known (kept with the plans:
        built for each such target at every cycle, it cost ~40 ms a cycle at 1000 tunings
        while the bounds read failed)."""

    def fetch(self, targets: Sequence[MetricsTarget], now: float) -> dict[str, TargetSignals]:
        if self._credentials is not None:  # once per cycle: the file may have been rotated
            self._client.headers["Authorization"] = self._credentials.current()
        found: dict[Signal, dict[str, SignalData]] = {signal: {} for signal in Signal}
        plans = self._plans(targets if self.templates else
                            [t for t in targets if not t.uses_templates])
        # At the same time: a Prometheus that hangs costs the batch at most the budget and a
        # timeout, not one per plan (every tuning's evaluation waits for the batch).
        def run(planned: tuple[QueryPlan, _Query]) -> _Answer:
            return self._run(planned[0], planned[1], now)

        # The batch's longest wait: queries not started within the budget, one timeout each.
        deadline = time.monotonic() + self.timeout_s * (BUDGET_TIMEOUTS + 1)
        with_latency: list[tuple[QueryPlan, Iterable[SeriesKey]]] = []
        warned: dict[str, dict[str, None]] = {}
        for answer in self._answers(run, plans):
            plan = answer.plan
            table, hits = found[plan.signal], answer.hits
            for target in plan.members:
                got = hits.get(target.series_key)
                table[target.key] = got if got is not None else answer.missing(target)
            if hits and plan.floor is not None:
                with_latency.append((plan, hits.keys()))
            if answer.warnings:
                for target in plan.members:
                    warned.setdefault(target.key, {}).update(dict.fromkeys(answer.warnings))
        self._log_warnings(warned)
        floors, unknown = self._latency_floors(plans, with_latency, now, deadline)
        # Window plans fill the queue and running tables, range plans the other two.
        queue = cast(dict[str, Window], found[Signal.QUEUE])
        running = cast(dict[str, Window], found[Signal.RUNNING])
        latency = cast(dict[str, Series], found[Signal.LATENCY])
        rate = cast(dict[str, Series], found[Signal.REQUEST_RATE])
        # Every supported target is in a queue and a latency plan; the others say why not.
        out: dict[str, TargetSignals] = {}
        for t in targets:  # a thousand per cycle: one lookup each, positional arguments
            key = t.key
            window = queue.get(key)
            out[key] = self._unsupported(t) if window is None else TargetSignals(
                window, latency[key], rate[key], running.get(key, NOT_READ), t.latency_kind,
                floors.get(key), key in unknown, now, _window_s(t.window),
                unknown.get(key, ""), tuple(warned[key]) if key in warned else ())
        return out

    def _log_warnings(self, warned: Mapping[str, Mapping[str, None]]) -> None:
        """Logs each warning Prometheus answered with that no batch had for WARNING_LOGGED_S
        (it is in MetricsAvailable of every tuning whose query it came with): by batch alone,
        tunings of two intervals, whose batches alternate, logged a lasting one every few
        cycles."""
        now = time.monotonic()
        seen = {warning for said in warned.values() for warning in said}
        for warning in sorted(seen):
            if now - self._warned.get(warning, -math.inf) >= WARNING_LOGGED_S:
                tunings = sum(warning in said for said in warned.values())
                logger.warning("Prometheus at %s warned, with the answer of the queries of %d "
                               "tuning(s): %s", self.shown_url, tunings, warning)
        self._warned = {warning: at for warning, at in self._warned.items()
                        if now - at < WARNING_LOGGED_S} | dict.fromkeys(seen, now)

    def queries_for(self, target: MetricsTarget) -> dict[Signal, str]:
        """Each signal's query for `target` alone, as a person would paste it into Prometheus
        (a batch asks for many targets at once); "" where none can be built."""
        queries: dict[Signal, str] = {}
        for plan in plan_queries([target], self.resolution_s):
            try:
                queries[plan.signal] = plan.query_for(target)
            except (ValueError, ArithmeticError):  # the fetch says why
                queries[plan.signal] = ""
        return queries

    def _latency_floors(self, plans: list[tuple[QueryPlan, _Query]],
                        with_latency: list[tuple[QueryPlan, Iterable[SeriesKey]]],
                        now: float, deadline: float) -> tuple[dict[str, float], dict[str, str]]:
        """(target key -> the lowest finite bucket bound of its latency histogram, where
        known; the keys with latency data whose bounds are not known). The bounds of the
        histograms that answered are read when due, at once and within the batch's longest
        wait (a Prometheus that did not answer the latency is not asked them)."""
        reading = {text: (self._pool.submit(self._read_floors, text, label, now), asked)
                   for text, label, asked in self._floors_due(with_latency)}
        self._floors_read(reading, deadline)
        clock = time.monotonic()
        floors: dict[str, float] = {}
        unknown: dict[str, str] = {}
        with_data = {id(plan): keys for plan, keys in with_latency}
        for plan, _ in plans:
            text = self._floor_texts.get(id(plan))
            if text is None:
                continue
            known = self._floors.get(text)
            bounds = {} if known is None else known.bounds
            if known is not None:
                self._floor_used[text] = clock
            answered = with_data.get(id(plan), ())
            latency = plan.members[0].metrics.latency
            # The bounds are in the histogram's unit (`le`), the floor in seconds.
            to_seconds = latency.to_seconds if isinstance(latency, HistogramLatency) else 1.0
            for target in plan.members:
                key = target.series_key
                floor = bounds.get(key)
                if floor is None and key in answered:
                    # Read under another query of the same histogram (the batch had other
                    # members then): a bound changes with the engine's version, not with
                    # the batch.
                    floor = self._bound_elsewhere(key, self._floor_family.get(text))
                if floor is not None:
                    floors[target.key] = floor * to_seconds
                elif key in answered:
                    unknown[target.key] = self._why_no_bounds(plan, target, known)
        for text in [t for t, used in self._floor_used.items()
                     if clock - used > FLOOR_FORGET_S]:
            # The bounds of a set of targets no batch asks for any more (tunings come and
            # go, and the query names their Deployments).
            self._floors.pop(text, None)
            self._floor_family.pop(text, None)
            del self._floor_used[text]
        return floors, unknown

    def _why_no_bounds(self, plan: QueryPlan, target: MetricsTarget,
                       known: _Floors | None) -> str:
        """Why the bucket bounds of `target`'s histogram are not known (for MetricsAvailable:
        a latency not compared holds every scale-in), with the query of its bounds."""
        if known is None:
            why = "not read yet"
        elif known.error:
            why = f"the last read failed: {known.error}"
        else:
            why = "the last read found no bucket bounds for it"
        cached = (id(plan), target.key)
        query = self._bounds_queries.get(cached)
        if query is None:
            try:
                query = plan.floor_query_for(target)
            except (ValueError, ArithmeticError):
                query = ""
            self._bounds_queries[cached] = query
        return f"{why} (query: {query})" if query else why

    def _bound_elsewhere(self, key: SeriesKey, family: str | None) -> float | None:
        """The newest lowest bound read for `key` under another floor query of `family` (the
        same histogram and labels: another histogram has other buckets)."""
        if family is None:
            return None
        reads = [f for text, f in self._floors.items()
                 if key in f.bounds and self._floor_family.get(text) == family]
        return max(reads, key=operator.attrgetter("read_at")).bounds[key] if reads else None

    def _floors_due(self, plans: list[tuple[QueryPlan, Iterable[SeriesKey]]]
                    ) -> list[tuple[str, str, frozenset[SeriesKey]]]:
        """(floor query, namespace label, the targets with latency data) of the latency plans
        whose bounds are due to be read: every FLOOR_REFRESH_S; at once when a target with
        data has none and was not asked for at the last read (its pods are new); after
        FLOOR_RETRY_S when it was (the read failed, or did not find it)."""
        clock = time.monotonic()
        due = []
        for plan, with_data in plans:
            text = self._floor_texts.get(id(plan))
            if text is None:
                continue
            known = self._floors.get(text)
            if (known is None or clock >= known.due_at or any(
                    key not in known.bounds
                    and (key not in known.asked or clock >= known.read_at + FLOOR_RETRY_S)
                    for key in with_data)):
                due.append((text, plan.members[0].namespace_label, frozenset(with_data)))
        return due

    def _read_floors(self, text: str, namespace_label: str,
                     now: float) -> dict[SeriesKey, float]:
        """The lowest finite bucket bound of each target's histogram, from one instant
        query (in the query pool, within the batch's budget)."""
        result = self._client.custom_query(
            text, params={"time": math.floor(now), "timeout": f"{self.timeout_s:g}",
                          **WHOLE_ANSWERS}, timeout=self.timeout_s)
        floors: dict[SeriesKey, float] = {}
        for item in result:
            labels = item["metric"]
            try:
                bound = float(labels.get("le", "nan"))
            except ValueError:
                # An exporter's `le` that is no number (histogram_quantile skips its series
                # too): one pod's failed the read that every namespace of the plan shares,
                # and none of their latencies was compared with its target.
                continue
            if math.isfinite(bound) and bound > 0:
                key = (labels.get(namespace_label, ""), labels.get(TARGET_LABEL, ""))
                floors[key] = min(bound, floors.get(key, math.inf))
        return floors

    def _floors_read(self, reading: dict[str, tuple[Future[dict[SeriesKey, float]],
                                                    frozenset[SeriesKey]]],
                     deadline: float) -> None:
        """Store the bounds read this cycle. A read that failed, or did not finish within the
        batch's budget, keeps the bounds read before and is tried again after FLOOR_RETRY_S:
        the bounds change only with the engine's version. The latency of a target whose
        bounds are not known meanwhile is not compared with the target."""
        clock = time.monotonic()
        for text, (future, asked) in reading.items():
            known = self._floors.get(text)
            try:
                floors = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except Exception as exc:  # any failure: keep the last bounds, and try again later
                future.cancel()
                why = ("not answered within the batch's budget" if isinstance(exc, FutureTimeout)
                       else _describe(exc, self.timeout_s))
                self._floors[text] = _Floors(clock, clock + FLOOR_RETRY_S,
                                             {} if known is None else known.bounds, asked, why)
                continue
            self._floors[text] = _Floors(clock, clock + FLOOR_REFRESH_S, floors, asked)

    def _unsupported(self, target: MetricsTarget) -> TargetSignals:
        if not self.templates and target.uses_templates:
            problem = TEMPLATES_OFF
        else:
            problem = unsupported(target) or "not planned"
        return TargetSignals(Window.missing(problem), Series.missing(problem),
                             Series.missing(problem), latency_kind=target.latency_kind)

    def _answers(self, run: Callable[[tuple[QueryPlan, _Query]], _Answer],
                 plans: list[tuple[QueryPlan, _Query]]) -> list[_Answer]:
        """Every plan's answer. The presets' plans and the templates' run in pools of their
        own, so a tenant's slow templates never hold the queries every other tuning waits
        for. In each pool a plan not started within the budget is no data for its tunings
        (it queued behind slow queries: a Prometheus that hangs costs the batch at most the
        budget and one timeout and a half, however many plans); one that started has
        ANSWER_TIMEOUTS timeouts to answer in full, however slowly its answer comes.
        Each pool starts its plans where the last cycle's started ones ended, so no tuning is
        the one left out every time."""
        budget = self.timeout_s * BUDGET_TIMEOUTS
        deadline = time.monotonic() + budget
        submitted: dict[Future[_Answer], QueryPlan] = {}
        order: dict[bool, list[tuple[QueryPlan, _Query]]] = {False: [], True: []}
        for planned in plans:
            order[planned[0].templated].append(planned)
        began: dict[int, float] = {}

        def timed(planned: tuple[QueryPlan, _Query]) -> _Answer:
            began[id(planned[0])] = time.monotonic()
            return run(planned)

        for templated, group in order.items():
            turn = self._turns[templated] % len(group) if group else 0
            pool = self._template_pool if templated else self._pool
            for planned in group[turn:] + group[:turn]:
                submitted[pool.submit(timed, planned)] = planned[0]
        _, waiting = wait(submitted, timeout=max(0.0, deadline - time.monotonic()))
        answers = []
        left_out = {False: 0, True: 0}
        for future in waiting:
            if future.cancel():
                plan = submitted.pop(future)
                left_out[plan.templated] += 1
                answers.append(_Answer(plan, {}, (
                    f"Prometheus at {self.shown_url} failed: not started within {budget:g}s, this "
                    "cycle's budget, behind slower queries")))
        for templated, group in order.items():
            self._turns[templated] += len(group) - left_out[templated]
        # One that started runs to its timeout, which requests applies to each read: an
        # answer sent slowly (a proxy, a slow link) never reaches it, and held the batch,
        # and every evaluation waiting for it, for as long as it took. It has its timeout and
        # a half from its start (requests' own timeout says so first when nothing comes).
        allowed = self.timeout_s * ANSWER_TIMEOUTS
        for future, plan in submitted.items():
            started = began.get(id(plan), time.monotonic())  # just starting, if not known
            try:
                answers.append(future.result(
                    timeout=max(0.0, started + allowed - time.monotonic())))
            except FutureTimeout:
                answers.append(_Answer(plan, {}, (
                    f"Prometheus at {self.shown_url} failed: its answer did not arrive in full "
                    f"within {allowed:g}s (it answers, but slowly)")))
        return answers

    def _plans(self, targets: Sequence[MetricsTarget]) -> list[tuple[QueryPlan, _Query]]:
        """The plans for `targets` and their query text, kept while the same target objects
        are asked for again (the operator caches them per tuning generation): planning and
        escaping a thousand names is a good part of a cycle otherwise. The kept tuple holds
        the targets, so their identities cannot be reused by other objects meanwhile."""
        known, plans = self._planned
        if len(known) == len(targets) and all(map(operator.is_, known, targets)):
            return plans
        plans = [(plan, _built(plan)) for plan in plan_queries(targets, self.resolution_s)]
        self._planned = (tuple(targets), plans)
        self._floor_texts = {id(plan): _floor_text(plan) for plan, _ in plans}
        self._bounds_queries = {}
        # Kept for the bounds still stored (they may be borrowed) and the plans of now.
        self._floor_family = {text: family for text, family in self._floor_family.items()
                              if text in self._floors}
        for plan, _ in plans:
            text = self._floor_texts[id(plan)]
            if text is not None:
                self._floor_family[text] = _floor_text(plan, anywhere=True)
        return plans

    def _run(self, plan: QueryPlan, query: _Query, now: float) -> _Answer:
        if query is None:
            return _Answer(plan, {}, "the engine exports no such metric")
        if isinstance(query, _Unbuildable):
            return _Answer(plan, {}, f"the query cannot be built: {query.problem}")
        end: float = math.floor(now)
        if plan.window and end % plan.step_s:
            # A subquery's steps are the multiples of its step: its newest is `end` only when
            # `end` is one. Else a series that began after that step had a `last` and no
            # steps at all, whose `samples`, then not returned, read as a full window.
            end = math.floor(now / plan.step_s) * plan.step_s
        _said.warnings = ()
        # Prometheus's own limit, so a query this side gave up on stops there too (its
        # default is 2 minutes, every cycle).
        server_side = {"timeout": f"{self.timeout_s:g}",  # seconds; "2.5s" is refused
                       **WHOLE_ANSWERS}
        try:
            if plan.window:
                result = self._client.custom_query(query, params={"time": end, **server_side},
                                                   timeout=self.timeout_s)
            else:
                start = end - plan.lookback_s
                # The client rounds start and end to whole seconds; an interval such as 1.5s
                # puts start between two, and the points then missed `end` every other cycle
                # (the newest one read as stale). Sent exactly, they override its values.
                # The step goes as a duration in milliseconds, as Prometheus keeps time: as
                # seconds it was cut to 6 digits (1234.567 sent as 1234.57), and Prometheus
                # truncates seconds it multiplied out in floating point (1.001 steps 1 s).
                result = self._client.custom_query_range(
                    query, start_time=datetime.fromtimestamp(start, tz=UTC),
                    end_time=datetime.fromtimestamp(end, tz=UTC), step=duration(plan.step_s),
                    params={"start": f"{start:.3f}", "end": str(end), **server_side},
                    timeout=self.timeout_s)
        except (requests.RequestException, Urllib3Error, OSError, PrometheusApiClientException,
                ValueError, LookupError, TypeError, ArithmeticError) as exc:
            return _Answer(plan, {}, f"Prometheus at {self.shown_url} failed: "
                                     f"{_describe(exc, self.timeout_s)}")
        except RecursionError as exc:  # JSON nested too deeply for the decoder: not an answer
            return _Answer(plan, {}, f"Prometheus at {self.shown_url} failed: {_not_a_result(exc)}")
        try:
            found = _windows(result, plan, end) if plan.window else _series(result, plan, end)
        except (ValueError, LookupError, TypeError, ArithmeticError, AttributeError) as exc:
            if histograms := _native_histograms(result):
                return _Answer(plan, {}, histograms)
            return _Answer(plan, {}, f"Prometheus at {self.shown_url} failed: {_not_a_result(exc)}")
        return _Answer(plan, found, None, _warnings(_said.warnings))


ANSWER_READ = 64 * 1024
"""The most read from the socket at once while an answer is read within its time."""


class _AnswerWithin(HTTPAdapter):
    """requests' adapter, which reads each answer whole within `within_s` of the request or
    ends it (closing the connection), without retries. requests' timeout applies to each
    read: an answer sent a little at a time (a slow proxy or link) never reaches it, so the
    query's thread read it for as long as it took after the batch had given up on it; a few
    held the pool (the next cycles' queries were not started within their budget), and
    `autoscale evaluate` printed its answer and then did not exit.

    The body is read as it comes (one read of the socket at a time, each within the request's
    timeout) and decoded once it is all there (`_decoded`, a step at a time within the same
    time): urllib3, decoding as it reads, reads on by itself until the decoder has something
    to give, which a gzip header and block tables sent slowly never did. So only what this
    decodes is asked for (Prometheus gzips)."""

    def __init__(self, within_s: float) -> None:
        super().__init__(max_retries=Retry(total=False))
        self.within_s = within_s

    def send(self, request: requests.PreparedRequest, stream: bool = False,
             timeout: Any = None, verify: Any = True, cert: Any = None,
             proxies: Any = None) -> requests.Response:
        started = time.monotonic()
        if request.headers.get("Accept-Encoding") == requests.utils.DEFAULT_ACCEPT_ENCODING:
            # requests' own (br and zstd too, where their modules are installed); one given
            # with --prometheus-header is sent as it is.
            request.headers["Accept-Encoding"] = ACCEPTED_ENCODINGS
        response = super().send(request, stream=True, timeout=timeout, verify=verify,
                                cert=cert, proxies=proxies)
        if stream:
            return response
        body = bytearray()
        try:
            while chunk := response.raw.read1(ANSWER_READ, decode_content=False):
                body += chunk
                if len(body) > MOST_DECODED:
                    # Not a query API's answer (a stream, a file server): unbounded, it took
                    # gigabytes of memory before the time ran out, and was said as slow.
                    raise DecodeError(f"the answer is more than {MOST_DECODED >> 20} MiB "
                                      "(is this a Prometheus query API? check the URL)")
                if time.monotonic() - started > self.within_s:
                    raise requests.exceptions.ReadTimeout(
                        f"the answer did not arrive in full within {self.within_s:g}s",
                        request=request)
            content = _decoded(bytes(body), response.headers.get("Content-Encoding", ""),
                               started + self.within_s)
        except BaseException as exc:
            response.close()
            # As requests says them when it reads a body (Response.iter_content).
            if isinstance(exc, ProtocolError):
                raise requests.exceptions.ChunkedEncodingError(exc) from exc
            if isinstance(exc, DecodeError | zlib.error):
                raise requests.exceptions.ContentDecodingError(exc) from exc
            if isinstance(exc, ReadTimeoutError):
                raise requests.exceptions.ReadTimeout(exc, request=request) from exc
            if isinstance(exc, Urllib3SSLError):
                raise requests.exceptions.SSLError(exc, request=request) from exc
            raise
        response._content = content
        response.raw.release_conn()
        response.__class__ = _QueryAnswer  # what the client reads with .json()
        return response


class _QueryAnswer(requests.Response):
    """A response of the query API as the client reads it (`json()`, then its
    data.result): the `warnings` of an answer (a remote read that failed or a Thanos
    partial response, so the data may be incomplete; Prometheus 3's PromQL warnings), which
    the client drops, are kept for the query's thread (`_said`); an answer of status "error"
    sent with HTTP 200 (a proxy or a Prometheus-compatible server) raises `_ErrorAnswer` with
    its words, where the client's missing "data" said only that the answer was no query
    result."""

    def json(self, **kwargs: Any) -> Any:
        answer = super().json(**kwargs)
        if isinstance(answer, dict):
            warned = answer.get("warnings")
            if isinstance(warned, list) and warned:
                _said.warnings = tuple(str(w) for w in warned[:MOST_WARNINGS])
            if answer.get("status") == "error":
                said = answer.get("error")
                raise _ErrorAnswer(str(answer.get("errorType") or "error"),
                                   said if isinstance(said, str) else "(no words)")
        return answer


WARNING_LOGGED_S = 600.0
"""A warning is logged again once no batch has had it for this long (`_log_warnings`)."""
MOST_WARNINGS = 3
"""The most warnings of one answer kept (each cut to WARNING_CHARS): they go into the
MetricsAvailable message of every tuning the query read."""
WARNING_CHARS = 300


class _Said(threading.local):
    warnings: tuple[str, ...] = ()
    """The warnings of the answer this thread read last (`_QueryAnswer`)."""


_said = _Said()


class _ErrorAnswer(ValueError):
    """An answer of status "error" with HTTP 200."""

    def __init__(self, error_type: str, error: str) -> None:
        super().__init__(error)
        self.error_type, self.error = error_type, error


GZIP_MAGIC = b"\x1f\x8b"
ACCEPTED_ENCODINGS = "gzip, deflate"
"""What `_AnswerWithin` asks for and decodes (requests would also ask for br and zstd where
their modules are installed)."""


def _decoded(body: bytes, content_encoding: str, deadline: float = math.inf) -> bytes:
    """`body` decoded as its Content-Encoding says (the last applied first), a step at a time:
    within `deadline` (monotonic) and MOST_DECODED, or not at all (a few MiB of gzip that
    decode to GiB took the operator's memory, and the time the batch had given up on)."""
    for coding in reversed([c.strip().lower() for c in content_encoding.split(",")]):
        out = bytearray()
        if coding in ("gzip", "x-gzip"):
            # Several gzip members may follow one another; what follows the first that is no
            # member (a newline, padding) is left, as urllib3 leaves it.
            rest, first = body, True
            while rest and (first or rest.startswith(GZIP_MAGIC)):
                mark = len(out)
                try:
                    rest, ended = _inflate(rest, 16 + zlib.MAX_WBITS, out, deadline)
                except zlib.error:
                    if first:
                        raise
                    ended = False
                if not ended:
                    if first:
                        raise DecodeError("the gzip stream is cut short")
                    del out[mark:]
                    break
                first = False
        elif coding == "deflate":
            if not body:  # an error page without one (its status says what went wrong)
                continue
            try:  # zlib-wrapped, as the RFC says; raw deflate, as some servers send
                _, ended = _inflate(body, zlib.MAX_WBITS, out, deadline)
            except zlib.error:
                out = bytearray()
                _, ended = _inflate(body, -zlib.MAX_WBITS, out, deadline)
            if not ended:
                raise DecodeError("the deflate stream is cut short")
        elif coding in ("", "identity"):
            continue
        else:
            raise DecodeError(f"Content-Encoding {coding!r} was not asked for")
        body = bytes(out)
    return body


DECODE_STEP = 1 << 20
"""How much is decoded at once (then the time and the size are checked)."""
MOST_DECODED = 256 << 20
"""The most an answer may decode to: a 1000-tuning batch's are a few MiB."""


def _inflate(data: bytes, wbits: int, out: bytearray, deadline: float) -> tuple[bytes, bool]:
    """Append to `out` what the zlib stream (`wbits`) at the start of `data` decodes to, a
    step at a time, `out` at most MOST_DECODED in all; (what follows the stream, whether it
    ended)."""
    inflate = zlib.decompressobj(wbits)
    while data and not inflate.eof:
        out += inflate.decompress(data, DECODE_STEP)
        if len(out) > MOST_DECODED:
            raise DecodeError(f"the answer decodes to more than {MOST_DECODED >> 20} MiB")
        if time.monotonic() > deadline:
            raise requests.exceptions.ReadTimeout("the answer was not decoded within its time")
        data = inflate.unconsumed_tail
    if not inflate.eof:
        # Ended (it has nothing more to give then): flushed, zlib added what follows the
        # stream to unused_data a second time.
        out += inflate.flush()
    return inflate.unused_data, inflate.eof


class _Answer:
    """One plan's result: `hits` holds the usable data by (namespace, Deployment), and
    `missing` says why a target has none."""

    def __init__(self, plan: QueryPlan, found: Mapping[SeriesKey, SignalData],
                 error: str | None, warnings: tuple[str, ...] = ()) -> None:
        self.plan, self.found, self.error = plan, found, error
        self.warnings = warnings
        """What Prometheus warned of with the answer (`_warnings`)."""
        self.hits = {} if error is not None else {
            key: data for key, data in found.items() if data.problem is None}

    def missing(self, target: MetricsTarget) -> SignalData:
        got = self.found.get(target.series_key)
        try:
            query = self.plan.query_for(target)
        except (ValueError, ArithmeticError):  # said in the error already
            query = ""
        missing = Window.missing if self.plan.window else Series.missing
        if self.error is not None:
            return missing(self.error, query)
        if got is not None:
            return missing(got.problem or "", query)
        said = f"no series for Deployment {target.namespace}/{target.deployment}"
        names = _metric_names(self.plan.signal, target)
        if names:
            # The metric first: the query that follows is long, and what a person checks is
            # whether the pods export that name and are scraped.
            said = (f"no series of {' or '.join(names)} for the pods of Deployment "
                    f"{target.namespace}/{target.deployment} ({target.deployment}-*): are "
                    "they scraped, and do they export it?")
            if self.plan.signal in (Signal.LATENCY, Signal.REQUEST_RATE):
                # A rate over a window that holds one scrape is empty, for pods that are
                # scraped and export it (Prometheus's default interval is the default 1m).
                said += (f" Or is spec.metrics.window ({target.window}) under two scrape "
                         "intervals? rate() needs two samples in it")
        if self.plan.templated and (
                dropped := [label for label, gone in (
                    (f"{target.namespace_label!r} label (spec.metrics.namespaceLabel)",
                     any(not namespace for namespace, _ in self.found)),
                    (f"{target.pod_label!r} label (spec.metrics.podLabel)",
                     any(not deployment for _, deployment in self.found))) if gone]):
            # Its answer has series, which cannot be told apart by Deployment: the template
            # summed the pod or namespace label away (the docs ask it to keep both).
            said += (f": the template's result has series without the {' or the '.join(dropped)}; "
                     f"keep {target.namespace_label!r} and {target.pod_label!r} in the "
                     f"result, for example sum by ({target.namespace_label}, "
                     f"{target.pod_label}) (...)")
        return missing(said, query)


def _metric_names(signal: Signal, target: MetricsTarget) -> tuple[str, ...]:
    """The metric names a preset's (or spec.metrics') query of `signal` reads for `target`,
    each in both spellings of the colon trap; () for a template's."""
    metrics = target.metrics
    read: object = {Signal.QUEUE: metrics.queue_depth, Signal.RUNNING: metrics.running,
                    Signal.REQUEST_RATE: requests_counter(metrics.latency)}.get(
        signal, metrics.latency)
    base: tuple[str, ...]
    if isinstance(read, str):
        base = (read,)
    elif isinstance(read, HistogramLatency):
        base = (f"{read.name}_bucket",)
    elif isinstance(read, MeanLatency):
        base = (read.total, read.requests)
    else:
        return ()
    try:
        return tuple(spelling for name in base for spelling in spellings(name))
    except ValueError:
        return ()


class _Floors(NamedTuple):
    read_at: float
    """When last read (monotonic)."""
    due_at: float
    """When to read again (monotonic)."""
    bounds: dict[SeriesKey, float]
    """The lowest finite bucket bound of each target's latency histogram."""
    asked: frozenset[SeriesKey] = frozenset()
    """The targets that had latency data when they were read: one that has data now and
    was not among them is read at once."""
    error: str = ""
    """Why the last read failed ("" when it did not)."""


class _Unbuildable(NamedTuple):
    problem: str


_Query = str | None | _Unbuildable
"""A plan's query text; None when the engine has no such metric; `_Unbuildable` when a
member's spec cannot be put into PromQL (the spec validation should have refused it)."""


def _built(plan: QueryPlan) -> _Query:
    """The plan's query, or why it cannot be built: that fails the plan's members only, never
    the other tunings of the batch."""
    try:
        return plan.query()
    except (ValueError, ArithmeticError) as exc:
        return _Unbuildable(str(exc)[:300])


def _floor_text(plan: QueryPlan, anywhere: bool = False) -> str | None:
    """The plan's floor query (promql.latency_floor_query), None when it has none or it
    cannot be built (its own query says why). `anywhere`: over every namespace and
    Deployment, which names the histogram and labels it reads and nothing else."""
    try:
        if anywhere:
            scope = replace(plan.scope(), namespaces=(), deployments=())
            return None if plan.floor is None else plan.floor(scope)
        return plan.floor_query()
    except (ValueError, ArithmeticError):
        return None


def _series(result: list[dict[str, Any]], plan: QueryPlan,
            end: float) -> dict[SeriesKey, Series]:
    namespace_label = plan.members[0].namespace_label
    out: dict[SeriesKey, Series] = {}
    step, fresh = plan.step_s, end - plan.step_s / 2
    isfinite = math.isfinite
    for item in result:  # a few thousand per cycle: written for speed (as Series.of)
        labels = item["metric"]
        key = (labels.get(namespace_label, ""), labels.get(TARGET_LABEL, ""))
        points = tuple([(float(t), value) for t, v in item["values"]
                        if isfinite(value := float(v))])
        if not points:
            out[key] = Series.missing(ONLY_NAN)
        elif (low := min(points, key=_value)[1]) < 0:
            out[key] = Series.missing(f"{NEGATIVE} ({low:g})")
        elif points[-1][0] < fresh:
            newest = format_time(points[-1][0])
            out[key] = Series.missing(f"{STALE}the newest sample is from {newest}")
        else:
            out[key] = Series(points, step)
    return out


_value = operator.itemgetter(1)
"""A point's value."""


def _windows(result: list[dict[str, Any]], plan: QueryPlan,
             end: float) -> dict[SeriesKey, Window]:
    """Windows from the `infertune_stat` series of a window query (promql.window_query)."""
    namespace_label = plan.members[0].namespace_label
    stats: dict[SeriesKey, dict[str, float]] = {}
    for item in result:  # several per target: written for speed
        labels = item["metric"]
        key = (labels.get(namespace_label, ""), labels.get(TARGET_LABEL, ""))
        got = stats.get(key)
        if got is None:
            got = stats[key] = {}
        got[labels.get(STAT_LABEL, "")] = float(item["value"][1])
    out: dict[SeriesKey, Window] = {}
    span, step, threshold = plan.lookback_s, plan.step_s, plan.threshold
    full = full_window_steps(span, step)  # `samples` is returned only under it
    isfinite = math.isfinite
    for key, got in stats.items():
        last = got.get("last")
        if last is None:
            # No mean now while pods export it: every value now is NaN (or +Inf), which the
            # mean leaves out (promql._finite_mean). Else only `peak` is left over from
            # earlier in the window: the series is gone now.
            out[key] = Window.missing(
                ONLY_NAN if "pods" in got else f"{STALE}no sample now, only earlier in the window")
            continue
        if not isfinite(last):
            out[key] = Window.missing(ONLY_NAN)
            continue
        if last < 0:
            out[key] = Window.missing(f"{NEGATIVE} ({last:g})")
            continue
        pods = got.get("pods")
        # Positional (last, end, span, step, threshold, dip, samples, peak, query, problem,
        # pods, rise): keywords cost more, once per target per cycle.
        out[key] = Window(last, end, span, step, threshold, got.get("dip"),
                          int(got.get("samples", full)), got.get("peak"), "", None,
                          None if pods is None else int(pods), got.get("rise"))
    return out


def _without_userinfo(url: str) -> str:
    """`url` with a user and password in it replaced by `***`."""
    # Without a scheme too: "user:pw@prometheus:9090" is refused with the URL in the message.
    # Up to the last "@" of all: a password may hold one, or a "/" urlsplit ends the host at
    # (refused then for its port, with this in the message). An "@" in a path is rare, and
    # is better hidden than a password shown.
    return re.sub(r"^((?:[A-Za-z][A-Za-z0-9+.-]*://)?).*@", r"\1***@", url, flags=re.DOTALL)


def check_access(url: str, access: PrometheusAccess) -> None:
    """Raise AccessError when an option of `access` cannot be used with `url` (a CA or a
    client certificate for a URL that is not https): the command line checks it before it
    reads anything, as the source does when it is made."""
    for option, given in ((CA_OPTION, access.ca_file), (CERT_OPTION, access.client_cert)):
        if given is not None and not url.startswith("https://"):
            raise AccessError(option, f"is for an https URL, and {_without_userinfo(url)} is "
                              "not one; use https:// or drop the option")


def _describe(exc: Exception, timeout_s: float) -> str:
    """A short cause: requests puts the whole (long) query URL into its messages."""
    # Checked first: urllib3 2 makes NameResolutionError a NewConnectionError, and that a
    # subclass of its TimeoutError.
    if isinstance(exc, _ErrorAnswer):
        return f"answered with an error {_error_said(exc.error_type, exc.error)}"
    reason = getattr(exc.args[0], "reason", None) if exc.args else None  # a MaxRetryError's
    if isinstance(exc, NameResolutionError) or isinstance(reason, NameResolutionError):
        # A Service name mistyped, or without its namespace: it read as Prometheus being
        # down ("refused or unreachable").
        return ("cannot resolve its host name; check the URL (a Service in another "
                "namespace is <name>.<namespace>, for example prometheus.monitoring)")
    if isinstance(exc, NewConnectionError | ConnectionRefusedError):
        return "cannot connect (refused or unreachable)"
    if isinstance(exc, requests.exceptions.SSLError):  # before ConnectionError, its base
        reason = str(exc).rsplit("(Caused by SSLError(", 1)[-1]
        while reason.endswith(")") and reason.count(")") > reason.count("("):
            reason = reason[:-1]  # the wrappers' own, not the cause's "(_ssl.c:1006)"
        return f"TLS failed ({reason[:200]}); check the URL and {CA_OPTION}"
    if isinstance(exc, requests.Timeout | Urllib3Timeout):
        return f"timed out after {timeout_s:g}s"
    if isinstance(exc, requests.exceptions.JSONDecodeError):  # before OSError, one of its bases
        return ("answered with something other than JSON (a login page, or another service at "
                "that address?); check the URL")
    if isinstance(exc, requests.exceptions.ContentDecodingError):  # an OSError too
        return f"answered, but its answer could not be decoded ({str(exc)[:200]})"
    if isinstance(exc, requests.exceptions.ChunkedEncodingError):  # an OSError too
        return "answered, but its answer was cut off before its end"
    if isinstance(exc, LookupError | TypeError):  # the client's ["data"]["result"]
        return _not_a_result(exc)
    if isinstance(exc, requests.ConnectionError) and isinstance(reason or (
            exc.args[0] if exc.args else None), ProtocolError):
        # Connected, and the other end closed without an answer: "refused or unreachable"
        # sent the reader to the network, not to a Prometheus (or proxy) that crashed.
        return ("connected, but the connection was closed without an answer (Prometheus, or "
                "a proxy in front of it, restarting or failing?)")
    if isinstance(exc, requests.ConnectionError | OSError):
        return "cannot connect (refused or unreachable)"
    if isinstance(exc, PrometheusApiClientException) and str(exc).startswith(_REFUSED):
        return (f"{str(exc)[:len('HTTP Status Code 401')]}: the credentials were refused; "
                f"check {CREDENTIALS_OPTION} and {AUTH_TYPE_OPTION}")
    text = str(exc) or type(exc).__name__
    if isinstance(exc, PrometheusApiClientException) and text.startswith(_STATUS):
        status = text[:len(_STATUS) + 3]
        if status.endswith("404"):
            return (f"{status}: no Prometheus query API at that address (another service, or "
                    "a path prefix missing from the URL?); check the URL")
        if status.endswith("414"):
            # Only a template's query grows past plan.MAX_QUERY_URL: the others stop naming
            # the namespaces first, and a template's keeps its own (plan.QueryPlan.query).
            return (f"{status}: the query is longer than Prometheus, or a proxy in front "
                    "of it, takes in a URL; its PromQL template is repeated in it, so shorten "
                    "spec.metrics.queries or raise the proxy's limit")
        if "<html" in text.lower() or "<!doctype" in text.lower():
            # A proxy's or another service's page: its markup says nothing (and it filled
            # the condition with 300 characters of escaped HTML).
            return f"{status}, with an HTML page instead of Prometheus's answer; check the URL"
        said = _prometheus_error(text)
        if said is not None:
            # Its words, not the client's dump of the body's bytes (b'{"status":"error",...
            # \\u003cby\\u003e...').
            return f"{status} {_error_said(*said)}"
    # Cleaned as a server's own words are: any exception's text may carry what a server or
    # proxy sent (a redirect's Location, a header), and a newline in it printed lines that
    # read as the evaluation's own.
    return _cut_clean(text, 300)


def _warnings(said: tuple[str, ...]) -> tuple[str, ...]:
    """An answer's warnings as MetricsAvailable says them: without the label sets they may
    name (as errors are, `_without_label_sets`) or control characters, each cut to
    WARNING_CHARS, the same ones once."""
    if not said:
        return ()
    return tuple(dict.fromkeys(_cut_clean(warning, WARNING_CHARS) for warning in said))


def _error_said(error_type: str, error: str) -> str:
    """Prometheus's errorType and error as messages give them: "(execution): ..."."""
    return f"({_cut_clean(error_type, 40)}): {_cut_clean(error, 300)}"


def _cut_clean(text: str, most: int) -> str:
    """`text` from a server for a message: without the label sets it may name
    (`_without_label_sets`) or control characters (`printable`), cut to `most` characters.
    Cut first to a few times that: cleaned whole, 89 MB of warning took minutes of CPU."""
    text = printable(_without_label_sets(text[:most * 4]))
    return text if len(text) <= most else text[:most] + "..."


def _without_label_sets(text: str) -> str:
    """`text` with every label set in it (`{__name__="up", team="payments"}`) cut to `{...}`.
    A Prometheus error names the series it met ("found duplicate series ... [{...}]"), and
    it goes into the tuning's status: a tenant's PromQL template that met another's series
    read their label values there, where only numbers were meant to come back. The query is
    in the message; Prometheus itself shows the series to whoever may read them. A set ends
    at the `}` outside its quoted values (`uri="/users/{id}"` holds braces of its own)."""
    out: list[str] = []
    i = 0
    while (start := text.find("{", i)) != -1:
        end, quoted, j = -1, False, start + 1
        while j < len(text):
            c = text[j]
            if quoted and c == "\\":
                j += 2
                continue
            if c == '"':
                quoted = not quoted
            elif c == "}" and not quoted:
                end = j
                break
            j += 1
        if end == -1:  # not closed: the rest is cut (it may hold a value)
            out.append(text[i:start] + ("{...}" if "=" in text[start:] else text[start:]))
            return "".join(out)
        inner = text[start + 1:end]
        out.append(text[i:start] + ("{...}" if "=" in inner else text[start:end + 1]))
        i = end + 1
    out.append(text[i:])
    return "".join(out)


def _prometheus_error(text: str) -> tuple[str, str] | None:
    """(errorType, error) of the error answer prometheus-api-client puts into its message as
    the body's bytes (`HTTP Status Code 400 (b'{"status":"error",...}')`); None when it holds
    none."""
    found = re.search(r"\((b'.*'|b\".*\")\)\s*$", text, flags=re.DOTALL)
    if found is None:
        return None
    try:
        answer = json.loads(ast.literal_eval(found.group(1)))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if not isinstance(answer, dict) or not isinstance(answer.get("error"), str):
        return None
    return str(answer.get("errorType") or "error"), answer["error"]


def _native_histograms(result: Any) -> str | None:
    """What to do when `result` holds native histograms where numbers were asked for (a PromQL
    template over a native histogram returns them: a result Prometheus answers in its own
    right, which read as an answer that is no query result, "check the URL"); else None."""
    if isinstance(result, list) and any(
            isinstance(item, dict) and ("histogram" in item or "histograms" in item)
            for item in result):
        return ("the query returns native histograms, not numbers: give the template a "
                "function of them that is a number (histogram_quantile, histogram_count, "
                "histogram_sum)")
    return None


def _not_a_result(exc: Exception) -> str:
    return (f"answered with JSON that is not a Prometheus query result "
            f"({type(exc).__name__}: {str(exc)[:200]}); check the URL")


_STATUS = "HTTP Status Code "
_REFUSED = (f"{_STATUS}401", f"{_STATUS}403")
"""How prometheus-api-client words a refusal (PrometheusApiClientException)."""


def _window_s(window: str) -> float:
    """spec.metrics.window in seconds (TargetSignals.latency_window_s); 0 for one that does not
    read as a duration (a window the queries refuse already says so in MetricsAvailable)."""
    try:
        return duration_seconds(window)
    except ValueError:
        return 0.0
