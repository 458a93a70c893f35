# gpuscale: one image for both roles (`gpuscale agent`, `gpuscale scaler`).
# NVML needs no CUDA base image: the NVIDIA container runtime injects libnvidia-ml.so.1
# when the container sets NVIDIA_DRIVER_CAPABILITIES=utility and NVIDIA_VISIBLE_DEVICES=all.
# Not built on the project's machines (no Docker engine there). Measured instead
# (2026-11-23): a clean install less pip, setuptools and __pycache__, as the build stage
# leaves it, is 58 MiB (grpcio 18 MiB, lightkube with its models 2 MiB; the
# kubernetes_asyncio it replaced was 48 MiB alone) on top of python:3.11-slim.

FROM python:3.11.7-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md deploy/image-constraints.txt ./
COPY src ./src
# Every runtime dependency pinned (deploy/image-constraints.txt: `pip freeze` of a clean
# install of the package; regenerate when pyproject.toml's dependencies change).
RUN python -m venv /opt/gpuscale \
 && /opt/gpuscale/bin/pip install --no-cache-dir --upgrade pip==25.3 \
 && /opt/gpuscale/bin/pip install --no-cache-dir -c image-constraints.txt . \
 && /opt/gpuscale/bin/pip uninstall -y -q pip setuptools \
 && find /opt/gpuscale -name '__pycache__' -prune -exec rm -rf {} +

# `docker build --target rocm -t ghcr.io/gpuscale/gpuscale:<tag>-rocm .`: the agent for AMD
# Instinct nodes (DaemonSet gpuscale-agent-amd). The amdsmi package reads GPUs through ROCm's
# libamd_smi.so, which no Python wheel carries: this stage adds it from AMD's apt
# repository, the ROCm release the amdsmi package in image-constraints.txt was made for
# (the agent refuses another major.minor: the package declares the library's structures).
# ROCm publishes Ubuntu packages; jammy's need glibc 2.35, bookworm has 2.36.
# Not built on the project's machines either (no Docker engine, no access to
# repo.radeon.com): build and try it on an AMD node first (docs/amd.md).
FROM python:3.11.7-slim-bookworm AS rocm
ARG ROCM_VERSION=7.0.2
COPY --from=build /opt/gpuscale /opt/gpuscale
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl gnupg \
 && install -d -m 0755 /etc/apt/keyrings \
 && curl -fsSL https://repo.radeon.com/rocm/rocm.gpg.key \
    | gpg --dearmor -o /etc/apt/keyrings/rocm.gpg \
 && echo "deb [arch=amd64 signed-by=/etc/apt/keyrings/rocm.gpg] https://repo.radeon.com/rocm/apt/${ROCM_VERSION} jammy main" \
    > /etc/apt/sources.list.d/rocm.list \
 && apt-get update \
 && apt-get install -y --no-install-recommends amd-smi-lib rocm-core \
 && apt-get purge -y curl gnupg && apt-get autoremove -y \
 && rm -rf /var/lib/apt/lists/* \
 && ln -sfn "$(ls -d /opt/rocm-* | head -n1)" /opt/rocm \
 && test -e /opt/rocm/lib/libamd_smi.so
ENV PATH=/opt/gpuscale/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    ROCM_PATH=/opt/rocm
USER 65532:65532
EXPOSE 9400 9401
ENTRYPOINT ["gpuscale"]
CMD ["agent", "--gpu-backend=amd", "--stream-insecure"]

# The default target (last stage): the image for the scaler and the NVIDIA agent.
FROM python:3.11.7-slim-bookworm
COPY --from=build /opt/gpuscale /opt/gpuscale
ENV PATH=/opt/gpuscale/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_DRIVER_CAPABILITIES=utility \
    NVIDIA_VISIBLE_DEVICES=all
# Non-root; a read-only root filesystem works (nothing is written outside /tmp).
USER 65532:65532
EXPOSE 9400 9401 9402 6000
ENTRYPOINT ["gpuscale"]
CMD ["agent", "--gpu-backend=nvml", "--stream-insecure"]

