-- Runs once, when the PostgreSQL data volume is first initialised (docker-entrypoint-initdb.d),
-- as POSTGRES_USER inside POSTGRES_DB (the Airflow metadata database).
-- gridcore keeps its own state (queues, claims, ledgers) in a SEPARATE database: Airflow
-- tasks may not touch Airflow's metadata DB. Its schema is created by `gridcore db upgrade`
-- (run by the airflow-init service); this script only creates the empty database.
CREATE DATABASE gridcore;
