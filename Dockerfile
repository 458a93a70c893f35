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
