# Worker image for durable-agent.
#   docker build -t durable-agent-worker .
# The compose stack (docker-compose.yaml) builds this for the `worker` service.
FROM python:3.11-slim

# Unbuffered output so worker logs reach `docker logs` as they happen rather
# than when a block buffer fills; no .pyc files in a read-only-ish app dir.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# UID/GID default to 1000 so a bind-mounted workspace owned by the usual
# first user of a Linux host is writable from inside the container; override
# with --build-arg when the host user differs.
ARG APP_UID=1000
ARG APP_GID=1000
RUN groupadd --gid "${APP_GID}" agent \
    && useradd --uid "${APP_UID}" --gid "${APP_GID}" --create-home \
        --shell /usr/sbin/nologin agent

WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir .

# Docker seeds an empty named volume from the image's directory at the mount
# point, ownership included. Creating these here, owned by the runtime user,
# is what lets the non-root worker write to /data on first start.
RUN mkdir -p /data/store /data/exports /workspace \
    && chown -R agent:agent /data /workspace

USER agent

CMD ["python", "worker.py"]
