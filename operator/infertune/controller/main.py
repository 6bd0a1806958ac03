"""`infertune run`: start kopf with the handlers of this package."""

from __future__ import annotations

import argparse
import logging

import kopf

from infertune.kube.client import configure


def run_operator(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    configure(args.kubeconfig)
    from infertune.controller import handlers  # noqa: F401  (registers the handlers)

    namespaces = args.namespaces or []
    kopf.run(
        standalone=args.standalone,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=args.liveness,
    )
    return 0
