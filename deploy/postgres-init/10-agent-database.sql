-- The agent's own database on the stack's PostgreSQL (the session store and the export
-- sink, see deploy/worker.toml); Temporal keeps its own. The image runs this once, when it
-- initialises an empty data volume: on a volume from before, run
--   docker compose exec postgresql createdb -U "$POSTGRES_USER" agent
CREATE DATABASE agent;
