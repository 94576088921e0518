# syntax=docker/dockerfile:1
# The pipeline image: `prism-pipeline` as the entrypoint, so a container runs one command
# (`worker`, `migrate`, `simulate`, `query ...`). docker-compose.yml builds it.
#
#   docker build -t prism-pipeline:local .
#   docker run --rm prism-pipeline:local --help

FROM python:3.11-slim AS build
# A C compiler for the few dependencies without a wheel on some platforms; it stays in
# this stage only.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/prism
ENV PATH=/opt/prism/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY runtime ./runtime
COPY pipeline ./pipeline
COPY sinks ./sinks
COPY dashboards ./dashboards
COPY devstack ./devstack
RUN --mount=type=cache,target=/root/.cache/pip pip install '.[pipeline,dashboards]'
# The run-semantics core and the fast parser compiled with mypyc into the installed
# package (prism/build/mypyc), as `make compile` does in a checkout: the image runs the
# build `make test` tests on its second pass (13% less CPU in the step, bench/README.md).
# mypyc runs from a venv of its own, which stays in this stage; the build is loaded once
# before the image is made, so a build that cannot load fails here.
RUN --mount=type=cache,target=/root/.cache/pip python -m venv /opt/mypyc \
    && /opt/mypyc/bin/pip install 'mypy>=2.4,<3' 'setuptools>=65'
RUN PYTHONPATH="$(python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
        /opt/mypyc/bin/python -m prism.devstack.compile \
    && PRISM_CORE=compiled python -c 'import prism.pipeline.core as c, prism.schemas as s; assert c.COMPILED and s.COMPILED'

FROM python:3.11-slim
# A fixed non-root user; the state directory exists in the image so a named volume mounted
# there starts out owned by that user.
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/prism --create-home prism \
    && mkdir -p /var/lib/prism/state \
    && chown -R prism:prism /var/lib/prism
COPY --from=build /opt/prism /opt/prism
# PRISM_CORE=compiled: the compiled core or a clear error, never the source by surprise.
ENV PATH=/opt/prism/bin:$PATH \
    PRISM_CORE=compiled \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PRISM_STATE_DIR=/var/lib/prism/state
USER prism
WORKDIR /var/lib/prism
# The worker flushes the ledger and commits offsets on SIGTERM.
STOPSIGNAL SIGTERM
ENTRYPOINT ["prism-pipeline"]
CMD ["--help"]
