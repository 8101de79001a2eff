"""spark-submit entry point: stage one planned batch of one pipeline.

    spark-submit [--master ...] spark_jobs/process_batch.py --pipeline orders --batch-id 42 [--settings-file F]

Settings come from the environment (LEDGERBATCH_DB_URL, KAFKA_BOOTSTRAP_SERVERS,
LEDGERBATCH_PIPELINES_DIR); with --settings-file, the database URL and the Kafka and registry settings
from that file (what the Airflow process task passes: spark/settings_file.py). The logic lives in the
ledgerbatch package.
"""
import argparse
import logging
import sys

from ledgerbatch.config import Settings
from ledgerbatch.errors import LedgerbatchError
from ledgerbatch.ledger.engine import make_engine
from ledgerbatch.spark.session import get_spark
from ledgerbatch.spark.settings_file import with_settings_file
from ledgerbatch.spec.resolve import load_pipeline
from ledgerbatch.stage.process import process_batch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--batch-id", type=int, required=True)
    parser.add_argument("--settings-file", help="JSON of the secret settings, readable only by this user")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        settings = Settings.from_env()
        if args.settings_file:
            settings = with_settings_file(settings, args.settings_file)
        spec = load_pipeline(settings, args.pipeline)
        spark = get_spark(None, f"ledgerbatch-{spec.name}-batch-{args.batch_id}")
        process_batch(spark, make_engine(settings.db_url), spec, args.batch_id, settings.db_url,
                      settings.require_bootstrap())
    except LedgerbatchError as exc:
        print(f"ledgerbatch: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
