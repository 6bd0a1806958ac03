"""How to reach a Prometheus that wants more than a URL: a CA bundle for its certificate, a
client certificate, credentials from a file, and extra request headers (a Mimir or Cortex
tenant, say).

The names follow Prometheus's own HTTP client configuration (`tls_config.ca_file`,
`tls_config.cert_file` and `key_file`, `authorization.type` and
`authorization.credentials_file`, `http_headers`), so a setup that
works for a Prometheus scrape or remote-read works here. Everything is checked before the
operator starts; a bad value is an error naming its option, never a first failing cycle.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""An HTTP field name or auth scheme (RFC 9110 token)."""
_UNSAFE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
"""Control characters (tab allowed): a CR or LF in a value would start a header of its own."""
PROMETHEUS_URL_ENV = "INFERTUNE_PROMETHEUS_URL"
"""The Prometheus URL when no option gives it (`run`, `autoscale evaluate`)."""
CREDENTIALS_OPTION = "--prometheus-credentials-file"
AUTH_TYPE_OPTION = "--prometheus-auth-type"
CA_OPTION = "--prometheus-ca-file"
CERT_OPTION = "--prometheus-cert-file"
KEY_OPTION = "--prometheus-key-file"
HEADER_OPTION = "--prometheus-header"
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization"})
"""Headers that carry credentials: never taken from the command line, which every process
list shows (and the chart would write into its Deployment)."""


class AccessError(ValueError):
    """A Prometheus access option that cannot work, with the option it came from."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")
        self.option = option


@dataclass(frozen=True)
class PrometheusAccess:
    ca_file: Path | None = None
    """PEM bundle of the CA that signs Prometheus's certificate (default: the system's)."""
    credentials_file: Path | None = None
    """File holding the credentials sent as `Authorization: <auth_type> <credentials>`;
    read again whenever it changes, as projected ServiceAccount tokens rotate."""
    auth_type: str = "Bearer"
    headers: tuple[tuple[str, str], ...] = ()
    client_cert: tuple[Path, Path] | None = None
    """(certificate, key) PEM files the operator presents, for a Prometheus that verifies
    its clients (mutual TLS)."""

    @classmethod
    def parse(cls, *, ca_file: str | None = None, credentials_file: str | None = None,
              auth_type: str | None = None, headers: Sequence[str] = (),
              cert_file: str | None = None, key_file: str | None = None) -> PrometheusAccess:
        """The options as given on the command line; AccessError names the one that is
        wrong and what to do."""
        parsed = tuple(_header(text) for text in headers)
        names = [name.lower() for name, _ in parsed]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise AccessError(HEADER_OPTION, f"{', '.join(duplicates)} given more than once; "
                              "give each header once")
        if auth_type is not None and credentials_file is None:
            raise AccessError(AUTH_TYPE_OPTION, f"needs {CREDENTIALS_OPTION}, the file with the "
                              "credentials it qualifies")
        scheme = auth_type or "Bearer"
        if not _TOKEN.fullmatch(scheme):
            raise AccessError(AUTH_TYPE_OPTION, f"{scheme!r} is not an HTTP auth scheme; use "
                              "Bearer (the default) or Basic")
        access = cls(_ca(ca_file), None if credentials_file is None else Path(credentials_file),
                     scheme, parsed, _client_cert(cert_file, key_file))
        if access.credentials_file is not None:
            read_credentials(access.credentials_file)  # fails now rather than in a cycle
        return access

    @property
    def session_verify(self) -> str | bool:
        """What requests' Session.verify takes: the bundle, or True for the system's CAs."""
        return True if self.ca_file is None else str(self.ca_file)


NO_ACCESS_OPTIONS = PrometheusAccess()
"""A Prometheus that wants a URL only (the system's CAs, no credentials, no headers)."""


def _header(text: str) -> tuple[str, str]:
    name, colon, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not colon:
        # Not even its start: a value given without its name may be the secret itself. A
        # credential header's name, which is no secret, is said.
        words = text.split()
        named = (f" ({words[0]!r} with no ':' after it)"
                 if words and words[0].lower() in CREDENTIAL_HEADERS else "")
        raise AccessError(HEADER_OPTION, f"a header is not NAME: VALUE{named}: it has no ':' "
                          "(the rest is not shown, in case it is a secret); for example "
                          "'X-Scope-OrgID: team-a'")
    if not _TOKEN.fullmatch(name):
        # Only its leading run of name characters: `X-Api-Key=s3cr3t: x` put the secret
        # before the colon.
        lead = re.match(r"[-!#$%&'*+.^_`|~0-9A-Za-z]*", name)
        shown = "" if lead is None else lead.group(0)[:40]
        raise AccessError(HEADER_OPTION, f"a header is not NAME: VALUE: the name starting "
                          f"{shown!r} is not an HTTP header name; for example "
                          "'X-Scope-OrgID: team-a'")
    if name.lower() in CREDENTIAL_HEADERS:
        raise AccessError(HEADER_OPTION, f"{name} carries credentials, and a command-line "
                          "argument is shown in every process list; put them in a file and give "
                          f"it with {CREDENTIALS_OPTION} (sent as Authorization; chart: "
                          "prometheus.credentialsSecret or prometheus.credentialsFile)")
    if _UNSAFE.search(value):
        raise AccessError(HEADER_OPTION, f"the value of {name} holds a control character (a line "
                          "break would add a header of its own); remove it")
    if not _latin1(value):
        raise AccessError(HEADER_OPTION, f"the value of {name} has characters an HTTP header "
                          "cannot carry (Latin-1 only); use ASCII")
    return name, value


def _latin1(text: str) -> bool:
    """Whether http.client can send `text` in a header (it encodes them as Latin-1: any
    other character failed every query with a codec error naming no option)."""
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def _ca(path: str | None) -> Path | None:
    if path is None:
        return None
    import ssl  # here, not at the top: every command's parser imports this module
    try:
        ssl.create_default_context(cafile=path)
    except FileNotFoundError:
        raise AccessError(CA_OPTION, f"{path} does not exist; give the PEM file of the CA that "
                          "signs Prometheus's certificate") from None
    except (OSError, ssl.SSLError) as exc:
        raise AccessError(CA_OPTION, f"{path} holds no usable PEM certificate ({exc}); give "
                          "the CA bundle in PEM form") from None
    return Path(path)


def _client_cert(cert: str | None, key: str | None) -> tuple[Path, Path] | None:
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        given, missing = (KEY_OPTION, CERT_OPTION) if cert is None else (CERT_OPTION, KEY_OPTION)
        raise AccessError(missing, f"{given} is given without it; a client certificate needs "
                          "both the certificate and its key")
    import ssl

    for option, path in ((CERT_OPTION, cert), (KEY_OPTION, key)):
        if not Path(path).is_file():
            raise AccessError(option, f"{path} does not exist or is not a file")
    try:
        ssl.create_default_context().load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise AccessError(CERT_OPTION, f"{cert} and {key} are not a PEM certificate and its "
                          f"private key ({exc}); give the pair Prometheus's CA signed") from None
    return Path(cert), Path(key)


def read_credentials(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise AccessError(CREDENTIALS_OPTION, f"cannot read {path}: "
                          f"{getattr(exc, 'strerror', None) or exc}") from None
    if not text:
        raise AccessError(CREDENTIALS_OPTION, f"{path} is empty; it must hold the token (or, "
                          f"with {AUTH_TYPE_OPTION} Basic, base64 of user:password)")
    if _UNSAFE.search(text) or "\t" in text:
        raise AccessError(CREDENTIALS_OPTION, f"{path} holds more than one line or a control "
                          "character; it must hold the credentials alone")
    if not _latin1(text):
        raise AccessError(CREDENTIALS_OPTION, f"{path} has characters an HTTP header cannot "
                          "carry (Latin-1 only); a token or base64 is ASCII")
    return text


class Credentials:
    """The Authorization value from `access`, read again when the file changes. A file that
    cannot be read at that moment (a rotation in progress) keeps the last good credentials and
    is logged; Prometheus refusing them shows as an HTTP 401 in the conditions."""

    def __init__(self, access: PrometheusAccess) -> None:
        assert access.credentials_file is not None
        self._path, self._scheme = access.credentials_file, access.auth_type
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._value = ""
        self.current()

    def current(self) -> str:
        with self._lock:
            try:
                st = os.stat(self._path)
                seen = (st.st_mtime_ns, st.st_size, st.st_ino)
                if seen != self._seen:
                    self._value = f"{self._scheme} {read_credentials(self._path)}"
                    self._seen = seen
            except (OSError, AccessError) as exc:
                if not self._value:
                    raise
                logger.warning("keeping the last Prometheus credentials: %s", exc)
            return self._value


def add_templates_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--no-promql-templates, for the operator and for the preview of its evaluation."""
    parser.add_argument("--no-promql-templates", action="store_true",
                        help="do not run the PromQL templates of spec.metrics.queries: they "
                        "run with the operator's access to Prometheus, and whoever may "
                        "create InferenceTunings may read any series through one; tunings "
                        "with templates report MetricsAvailable=False")


def add_access_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The access options, for every command that queries Prometheus."""
    parser.add_argument(CA_OPTION, metavar="PEM", help="CA bundle that signs Prometheus's "
                        "certificate, for an https URL (default: the system's CAs)")
    parser.add_argument(CERT_OPTION, metavar="PEM", help="client certificate, for a Prometheus "
                        "that verifies its clients (mutual TLS); with " + KEY_OPTION)
    parser.add_argument(KEY_OPTION, metavar="PEM", help="private key of " + CERT_OPTION)
    parser.add_argument(CREDENTIALS_OPTION, metavar="FILE",
                        help="file with the credentials sent in the Authorization header, for "
                             "example a ServiceAccount token; read again when it changes")
    parser.add_argument(AUTH_TYPE_OPTION, metavar="SCHEME",
                        help="Authorization scheme of the credentials (default Bearer; Basic "
                             "takes base64 of user:password)")
    parser.add_argument(HEADER_OPTION, action="append", default=[], metavar="'NAME: VALUE'",
                        dest="prometheus_headers",
                        help="extra request header, repeatable; for example "
                             "'X-Scope-OrgID: team-a' for Mimir or Cortex (not Authorization: "
                             f"credentials come from {CREDENTIALS_OPTION})")


def access_from_args(args: argparse.Namespace) -> PrometheusAccess:
    return PrometheusAccess.parse(ca_file=args.prometheus_ca_file,
                                  cert_file=args.prometheus_cert_file,
                                  key_file=args.prometheus_key_file,
                                  credentials_file=args.prometheus_credentials_file,
                                  auth_type=args.prometheus_auth_type,
                                  headers=args.prometheus_headers)
