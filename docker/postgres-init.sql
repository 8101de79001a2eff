-- Runs once, when the postgres volume is created: Airflow's metadata gets its own database.
CREATE DATABASE airflow OWNER ledgerbatch;
