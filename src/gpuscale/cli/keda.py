"""``gpuscale keda``: ask the scaler what KEDA asks it (grpcurl's call, without grpcurl)."""

from __future__ import annotations

import argparse
from typing import Any

from gpuscale.cli.common import add_scaler_args, fail, scaler_target


def add_parser(sub: Any) -> None:
    k = sub.add_parser("keda", help="ask the scaler what KEDA asks it (IsActive, "
                                    "GetMetricSpec, GetMetrics) and print its JSON reply: "
                                    "grpcurl's call, with what gpuscale installs")
    k.add_argument("method", choices=["IsActive", "GetMetricSpec", "GetMetrics"])
    k.add_argument("request", help="the request as JSON, as grpcurl's -d takes it: a "
                                   "ScaledObjectRef, or for GetMetrics "
                                   "{\"scaledObjectRef\": {...}, \"metricName\": ...}")
    add_scaler_args(k)
    k.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpuscale.common.errors import GpuscaleError
    from gpuscale.tools.keda_call import KedaClient, request_from

    try:
        request = request_from(args.method, args.request)
        client = KedaClient(scaler_target(args))
        try:
            print(client.ask(args.method, request))
        finally:
            client.close()
    except GpuscaleError as exc:
        return fail(exc)
    except ValueError as exc:  # a partial TLS set
        return fail(str(exc), 2)
    return 0
