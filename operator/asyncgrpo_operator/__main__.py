"""`python -m asyncgrpo_operator`: run the operator (the same as `kopf run -m asyncgrpo_operator.main`).

Options: --namespace NS (repeatable; default all namespaces), --liveness URL (default
http://0.0.0.0:8080/healthz), --log-format json|text (default json: one object per line, for log
pipelines), --metrics-port PORT (serve Prometheus /metrics; default $ASYNCGRPO_METRICS_PORT, else
none), --progress-url-template URL (where the driver's /progress is read; default
http://{pod_ip}:{port}/progress, see progress.py), --role all|reconciler|webhook (default all:
reconcile and serve admission; the chart runs a Deployment of each of the other two, so that
nothing that takes the reconciler down takes admission with it), --verbose. Each option's
environment variable works too, which is how the chart sets them.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

import kopf

from asyncgrpo_operator import logs, metrics, progress, runtime

ROLES = {
    "all": "asyncgrpo_operator.main",
    "reconciler": "asyncgrpo_operator.reconciling",
    "webhook": "asyncgrpo_operator.admission_only",
}
"""Each role's kopf module: importing it registers that role's handlers, and only those."""
ROLE_ENV = "ASYNCGRPO_ROLE"


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m asyncgrpo_operator")
    parser.add_argument("-n", "--namespace", action="append", default=[], help="watch only these namespaces")
    parser.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="liveness endpoint URL")
    parser.add_argument("--log-format", choices=("json", "text"), default="json")
    parser.add_argument("--metrics-port", type=int, help=f"serve /metrics on this port (${metrics.PORT_ENV})")
    parser.add_argument(
        "--progress-url-template",
        help=f"where to read a driver's /progress (${progress.URL_TEMPLATE_ENV}; placeholders "
        f"{', '.join('{' + p + '}' for p in sorted(progress.PLACEHOLDERS))})",
    )
    parser.add_argument(
        "--role",
        choices=sorted(ROLES),
        default=os.environ.get(ROLE_ENV) or "all",
        help=f"reconcile, serve admission, or both (${ROLE_ENV}; default all)",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.role not in ROLES:
        parser.error(f"${ROLE_ENV}={args.role!r}: the role is one of {', '.join(sorted(ROLES))}")
    importlib.import_module(ROLES[args.role])
    logs.configure(
        json_lines=args.log_format == "json", level=logging.DEBUG if args.verbose else logging.INFO
    )
    if args.namespace:
        os.environ[runtime.WATCH_NAMESPACES_ENV] = ",".join(args.namespace)
    if args.metrics_port is not None:
        os.environ[metrics.PORT_ENV] = str(args.metrics_port)
    if args.progress_url_template:
        try:
            progress.check_url_template(args.progress_url_template)
        except ValueError as exc:
            parser.error(str(exc))
        os.environ[progress.URL_TEMPLATE_ENV] = args.progress_url_template
    kopf.run(
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness or None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
