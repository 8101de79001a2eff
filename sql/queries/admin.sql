-- Server-level statements (run on the `postgres` database, outside a transaction).

-- name: drop_database
DROP DATABASE IF EXISTS {database} WITH (FORCE);

-- name: create_database
CREATE DATABASE {database};
