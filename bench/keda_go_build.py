"""bench/keda_go, the KEDA model in Go (grpc-go, KEDA's own language and library), built for
bench_keda.py's ``--client go`` from Debian's packages."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GO_SOURCE, GO_BUILD = REPO / "bench" / "keda_go", REPO / "build" / "keda_go"
GO_PATH = Path("/usr/share/gocode")  # where Debian's Go library packages put their source
# (protobuf 1.5's APIv1 shim, not 1.3's, which grpc-go's package would pull in: grpc-go's
# codec decodes through it, and 1.3 cannot read messages protoc-gen-go's APIv2 makes)
GO_PACKAGES = ("golang-go", "golang-google-grpc-dev", "golang-google-protobuf-dev",
               "golang-github-golang-protobuf-1-5-dev", "protobuf-compiler", "protoc-gen-go",
               "protoc-gen-go-grpc")


def go_version() -> str:
    """The Go toolchain and grpc-go the Go model is built with."""
    go = subprocess.run(["go", "version"], capture_output=True, text=True, check=True)
    grpc_go = (GO_PATH / "src/google.golang.org/grpc/version.go").read_text()
    return (f"{go.stdout.split()[2]}, grpc-go "
            f"{grpc_go.split('Version = ')[1].split()[0].strip(chr(34))}")


def build_go_client() -> Path:
    """bench/keda_go built against Debian's Go toolchain and grpc-go (packages installed
    with apt-get when missing, as ./dev installs the tests' Prometheus), the stubs made from
    the project's copy of KEDA's proto. GOPATH mode: Debian's packages are the libraries;
    nothing is fetched. Rebuilt when the source, the proto or the toolchain changed."""
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *GO_PACKAGES]
    try:
        have = subprocess.run(["dpkg-query", "-W", "-f", "${Status}\\n", *GO_PACKAGES],
                              capture_output=True, text=True, check=False).stdout.splitlines()
        if len(have) != len(GO_PACKAGES) or any(not h.endswith(" installed") for h in have):
            sudo = [] if os.geteuid() == 0 else ["sudo"]
            print(f"installing Debian packages for the Go KEDA model: {' '.join(GO_PACKAGES)}",
                  flush=True)
            # (an index that cannot be refreshed may still hold the packages: go on)
            subprocess.run([*sudo, "apt-get", "update", "-qq"], check=False)
            subprocess.run([*sudo, "env", "DEBIAN_FRONTEND=noninteractive", *install],
                           check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise SystemExit(f"--client go needs Debian's Go and grpc-go packages (bookworm or "
                         f"newer), installed as root: {' '.join(install)} ({exc})") from exc
    proto = REPO / "src" / "gpuscale" / "proto" / "externalscaler.proto"
    digest = hashlib.sha256((GO_SOURCE / "main.go").read_bytes() + proto.read_bytes()
                            + go_version().encode()).hexdigest()
    binary, stamp = GO_BUILD / "keda_go", GO_BUILD / "stamp"
    if binary.exists() and stamp.exists() and stamp.read_text() == digest:
        return binary
    src = GO_BUILD / "src" / "kedamodel"
    shutil.rmtree(GO_BUILD, ignore_errors=True)
    (src / "externalscaler").mkdir(parents=True)
    shutil.copy(GO_SOURCE / "main.go", src / "main.go")
    where = "Mexternalscaler.proto=kedamodel/externalscaler"
    subprocess.run(["protoc", f"-I{proto.parent}",
                    f"--go_out={src / 'externalscaler'}", "--go_opt=paths=source_relative",
                    f"--go_opt={where}", f"--go-grpc_out={src / 'externalscaler'}",
                    "--go-grpc_opt=paths=source_relative", f"--go-grpc_opt={where}",
                    proto.name], check=True)
    subprocess.run(["go", "build", "-o", str(binary), "."], cwd=src, check=True, env={
        **os.environ, "GOPATH": f"{GO_BUILD}:{GO_PATH}", "GO111MODULE": "off",
        "GOCACHE": str(GO_BUILD / "cache"), "GOFLAGS": ""})
    stamp.write_text(digest)
    return binary
