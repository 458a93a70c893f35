"""``gpuscale keda``: grpcurl's call to the scaler's KEDA service with what gpuscale
installs. The command the demo prints asks a real demo scaler and gets what KEDA gets; a
request that is not one is refused before any call, one line; nothing listening and the
scaler's own refusal are told apart."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
from typing import Any

import pytest

from gpuscale.common.errors import ConfigError
from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.tools.keda_call import request_from
from tests.support.polling import until_sync
from tests.support.ports import free_port

GPUSCALE = [sys.executable, "-m", "gpuscale.cli"]


@pytest.mark.parametrize(("method", "text", "says"), [
    ("GetMetrics", "{", "not JSON"),
    ("GetMetrics", "[1]", "a JSON object (GetMetricsRequest), not list"),
    ("GetMetrics", '{"metricName": 7}', "not a GetMetricsRequest"),
    ("IsActive", '{"bogus": 1}', "not a ScaledObjectRef"),
    ("IsActive", '{"scalerMetadata": {"a": 1}}', "not a ScaledObjectRef"),
    ("IsActive", '{"name": "' + "x" * 70_000 + '"}', "larger than 65536 bytes"),
    ("IsActive", "[" * 50_000 + "]" * 50_000, "larger than"),
    ("IsActive", "[" * 30_000 + "]" * 30_000, "not JSON"),  # nesting beyond json's depth
    ("StreamIsActive", "{}", "not one of IsActive, GetMetricSpec, GetMetrics"),
])
def test_a_request_that_is_not_one_is_refused(method: str, text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)) as caught:
        request_from(method, text)
    assert "\n" not in str(caught.value)
    assert len(str(caught.value)) < 400


def test_a_request_is_read_as_grpcurl_reads_it() -> None:
    got = request_from("GetMetrics", '{"scaledObjectRef": {"name": "a", "namespace": "b", '
                                     '"scalerMetadata": {"podSelector": "app=x"}}, '
                                     '"metricName": "m"}')
    assert got == pb.GetMetricsRequest(metricName="m", scaledObjectRef=pb.ScaledObjectRef(
        name="a", namespace="b", scalerMetadata={"podSelector": "app=x"}))


def keda(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GPUSCALE, "keda", *argv], capture_output=True, text=True,
                          timeout=60, check=False)


def test_the_printed_command_asks_the_demo_scaler_what_keda_gets() -> None:
    port = free_port()
    proc = subprocess.Popen([*GPUSCALE, "demo", "--scenario", "h100-vllm", "--host",
                             "127.0.0.1", "--port", str(port), "--metrics-port", "0",
                             "--interval", "0.5"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        assert "KEDA external scaler on 127.0.0.1:" in proc.stdout.readline()
        argv = shlex.split(proc.stdout.readline())
        assert argv[:3] == ["gpuscale", "keda", "GetMetrics"]

        def asked() -> dict[str, Any] | None:
            done = keda(*argv[2:])
            reply: dict[str, Any] = json.loads(done.stdout) if done.returncode == 0 else {}
            values = reply.get("metricValues", [{}])
            return reply if values[0].get("metricValueFloat", 0) > 0 else None

        reply = until_sync(asked, 15.0, "a value from the printed command", every=0.3)
        request = json.loads(argv[3])
        assert reply["metricValues"][0]["metricName"] == request["metricName"]
        active = keda("IsActive", json.dumps(request["scaledObjectRef"]), *argv[4:])
        assert (active.returncode, json.loads(active.stdout)) == (0, {"result": True})
        # The scaler's own refusal is its answer, not "start a scaler".
        bad = {**request["scaledObjectRef"], "scalerMetadata": {"profile": "nope"}}
        refused = keda("IsActive", json.dumps(bad), *argv[4:])
        assert refused.returncode == 1
        assert refused.stderr.startswith(
            f"gpuscale: the scaler at 127.0.0.1:{port} answered INVALID_ARGUMENT: ")
        assert refused.stderr.count("\n") == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)


def test_nothing_listening_says_how_to_start_one() -> None:
    done = keda("IsActive", "{}", "--scaler", f"127.0.0.1:{free_port()}")
    assert done.returncode == 1
    assert "did not answer" in done.stderr
    assert "./dev run" in done.stderr
    assert done.stdout == ""
    bad = keda("GetMetrics", "{", "--scaler", "127.0.0.1:1")
    assert (bad.returncode, bad.stderr.count("\n")) == (2, 1)
