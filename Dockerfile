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

# bubblewrap runs each bash command in a sandbox ([sandbox] in the worker's
# config): in a user namespace, as the worker's user on the host (agent, not
# root: see USER below), bounded in processes, memory, file size and CPU time.
# Inside a container it needs namespaces that Docker's default seccomp and
# AppArmor profiles refuse, and a /proc that Docker has not masked, so the
# compose stack's config (deploy/worker.toml) sets kind = "none"; to sandbox
# bash in a container, run it with --security-opt seccomp=unconfined
# --security-opt apparmor=unconfined --security-opt systempaths=unconfined
# (or profiles that allow user namespaces) and drop that setting. A worker
# whose sandbox cannot start refuses to start, saying why.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# The whole repository: durable_agent/workflows, durable_agent/activities and
# durable_agent/worker.py are relative links to the top-level workflows/,
# activities/ and worker.py, which COPY keeps as links (they resolve in /app).
COPY . /app
# `pip install .` packs the links' targets into the one durable_agent package;
# the import check runs outside /app, so it proves the installed copy is whole.
# The in-tree build leaves build/ and an egg-info behind: not part of the image.
RUN pip install --no-cache-dir . \
    && rm -rf build durable_agent.egg-info \
    && cd / && python -c "import durable_agent.workflows, durable_agent.activities, durable_agent.worker"

# Docker seeds an empty named volume from the image's directory at the mount
# point, ownership included. Creating these here, owned by the runtime user,
# is what lets the non-root worker write to /data on first start.
RUN mkdir -p /data/store /data/exports /workspace \
    && chown -R agent:agent /data /workspace

# The worker runs as agent, never root: a sandboxed command is then agent on
# the host too (root's commands are uid 0 there, whatever the namespace says),
# and the kernel's per-user process limit, which never applies to root, holds.
USER agent

# From /app, as on a checkout (`python -m durable_agent.worker` runs the same code).
CMD ["python", "worker.py"]
