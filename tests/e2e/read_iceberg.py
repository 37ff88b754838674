"""A Ray Data driver on the end-to-end run's live cluster: registers the published Iceberg
tables (the metadata files `afterglow publish` printed) in a PyIceberg SQL catalog (a SQLite
file) and reads each one with `ray.data.read_iceberg`, printing what identifies its rows as
JSON: {"task_attempts": [[cluster, task_id, attempt_number, type], ...],
"jobs": [[cluster, job_id], ...]}.

Usage: RAY_ADDRESS=... read_iceberg.py CATALOG_DB METADATA_JSON...
"""
import json
import os
import sys

import ray
from pyiceberg.catalog.sql import SqlCatalog

# What identifies a row of each table read (and an attempt's type: the table keeps drivers'
# own attempts, which Ray's lists and /api/tasks leave out).
IDENTITY = {
    "task_attempts": ["cluster", "task_id", "attempt_number", "type"],
    "jobs": ["cluster", "job_id"],
}


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    database, locations = sys.argv[1], sys.argv[2:]
    properties = {
        "uri": f"sqlite:///{database}",
        "warehouse": f"file://{os.path.dirname(os.path.abspath(database))}",
    }
    catalog = SqlCatalog("afterglow", **properties)
    catalog.create_namespace_if_not_exists("afterglow")
    ray.init(log_to_driver=False)
    answer = {}
    for location in locations:
        name = location.rsplit("/metadata/", 1)[0].rsplit("/", 1)[-1]
        catalog.register_table(f"afterglow.{name}", location)
        dataset = ray.data.read_iceberg(
            table_identifier=f"afterglow.{name}",
            catalog_kwargs={"name": "afterglow", "type": "sql", **properties},
        )
        columns = IDENTITY[name]
        answer[name] = [[row[column] for column in columns]
                        for row in dataset.select_columns(columns).take_all()]
    print(json.dumps(answer))


if __name__ == "__main__":
    main()
