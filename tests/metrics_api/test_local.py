"""Local mode of the metrics API: loopback only, its own certificate, a token."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gpuscale.common.errors import ConfigError
from gpuscale.metrics_api.answers import MetricAnswers
from gpuscale.metrics_api.authz import Attributes
from gpuscale.metrics_api.local import LOCAL_USER, LocalAccess, check_loopback
from gpuscale.metrics_api.server import MetricsApiServer
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.state.fleet import FleetView


@pytest.mark.parametrize("host", ["127.0.0.1", "127.5.6.7", "::1", "[::1]", "localhost"])
def test_loopback_addresses_are_accepted(host: str) -> None:
    check_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "192.168.0.1", "example.com",
                                  ""])
def test_any_other_address_is_refused(host: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="binds loopback only"):
        check_loopback(host)
    access = LocalAccess.create(tmp_path / "local")
    with pytest.raises(ConfigError, match="binds loopback only"):
        MetricsApiServer(MetricAnswers(Answers(FleetView()), None), None, None, access.cert,
                         access.key, host, 0, local=access)


async def test_only_the_token_is_the_local_user_and_the_files_are_private(
        tmp_path: Path) -> None:
    access = LocalAccess.create(tmp_path / "local")
    assert len(access.token) >= 40
    bearer = [("Authorization", f"Bearer {access.token}")]
    assert access.authenticate(None, bearer) == LOCAL_USER
    for headers in ([], [("Authorization", f"Bearer {access.token}x")],
                    [("Authorization", f"Basic {access.token}")],
                    [("X-Remote-User", "system:admin")]):
        assert access.authenticate(None, headers) is None
    assert (await access.check(LOCAL_USER, Attributes("get", path="/apis"))).allowed
    kubeconfig = access.write_kubeconfig(6443)
    for path in (access.key, kubeconfig):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(access.dir.stat().st_mode) == 0o700
    assert access.context() is not None  # the certificate and key load
    other = LocalAccess.create(tmp_path / "other")
    assert other.token != access.token


def test_a_header_that_is_not_ascii_is_no_user_not_an_error(tmp_path: Path) -> None:
    access = LocalAccess.create(tmp_path / "local")
    for value in ("Bearer \udcff\udcfe", f"Bearer {access.token}\u00e9", "Bearer \u0663"):
        assert access.authenticate(None, [("Authorization", value)]) is None
