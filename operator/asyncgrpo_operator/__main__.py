"""`python -m asyncgrpo_operator`: run the operator (the same as `kopf run -m asyncgrpo_operator.main`).

Options: --namespace NS (repeatable; default all namespaces), --liveness URL (default
http://0.0.0.0:8080/healthz), --log-format json|text (default json: one object per line, for log
pipelines), --metrics-port PORT (serve Prometheus /metrics; default $ASYNCGRPO_METRICS_PORT, else
none), --progress-url-template URL (where the driver's /progress is read; default
http://{pod_ip}:{port}/progress, see progress.py), --verbose. Each option's environment variable
works too, which is how the chart sets them.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import kopf

from asyncgrpo_operator import logs, metrics, progress, runtime
from asyncgrpo_operator import main as _handlers  # noqa: F401 - registers the kopf handlers


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
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
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
