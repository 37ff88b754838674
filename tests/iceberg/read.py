"""Reads published Iceberg tables with two readers that are not Afterglow's, and prints each
reader's rows as JSON: {"pyiceberg": {table: rows}, "duckdb": {table: rows}}.

Usage: read.py METADATA_JSON...
       read.py --glue DATABASE TABLE...
       read.py --stats METADATA_JSON...
       read.py --count METADATA_JSON...

Given metadata files, PyIceberg 0.12 reads each table's metadata (`StaticTable.from_metadata`,
`scan().to_arrow()`), and DuckDB 1.5.5 with its iceberg, avro and httpfs extensions (from their
PyPI packages, loaded offline) reads the table's directory with `iceberg_scan`. Given a Glue
database, PyIceberg loads each table through its Glue catalog, and DuckDB reads the metadata file
the catalog names (found with boto3). With AWS_ENDPOINT_URL_S3 set, `s3://` paths are read from
that endpoint (SeaweedFS in the tests), and with AWS_ENDPOINT_URL_GLUE the catalog is that
endpoint's (moto in the tests), with the standard AWS credential variables.
"""

import importlib.util
import json
import os
import sys
from pathlib import Path

import duckdb
from pyiceberg.table import StaticTable

DUCKDB_VERSION = "v1.5.5"


def table_location(metadata: str) -> str:
    # {location}/metadata/v{n}.metadata.json, the location ending in iceberg/{table}
    return metadata.rsplit("/metadata/", 1)[0]


def s3_properties() -> dict:
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3")
    if not endpoint:
        return {}
    return {
        "s3.endpoint": endpoint,
        "s3.access-key-id": os.environ["AWS_ACCESS_KEY_ID"],
        "s3.secret-access-key": os.environ["AWS_SECRET_ACCESS_KEY"],
        "s3.region": os.environ.get("AWS_REGION", "us-east-1"),
        "s3.force-virtual-addressing": "false",
    }


def glue_properties() -> dict:
    properties = {
        "type": "glue",
        "glue.region": os.environ.get("AWS_REGION", "us-east-1"),
        "glue.access-key-id": os.environ["AWS_ACCESS_KEY_ID"],
        "glue.secret-access-key": os.environ["AWS_SECRET_ACCESS_KEY"],
    }
    endpoint = os.environ.get("AWS_ENDPOINT_URL_GLUE")
    if endpoint:
        properties["glue.endpoint"] = endpoint
    return {**properties, **s3_properties()}


def glue_metadata(database: str, table: str) -> str:
    import boto3

    glue = boto3.client(
        "glue",
        endpoint_url=os.environ.get("AWS_ENDPOINT_URL_GLUE"),
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
    )
    found = glue.get_table(DatabaseName=database, Name=table)["Table"]
    return found["Parameters"]["metadata_location"]


def with_pyiceberg(metadata: str) -> list:
    table = StaticTable.from_metadata(metadata, properties=s3_properties())
    return table.scan().to_arrow().to_pylist()


def extension(name: str) -> str:
    spec = importlib.util.find_spec(f"duckdb_extension_{name}")
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"the duckdb-extension-{name} package is not installed")
    root = Path(list(spec.submodule_search_locations)[0])
    return str(root / "extensions" / DUCKDB_VERSION / f"{name}.duckdb_extension")


def duckdb_connection() -> duckdb.DuckDBPyConnection:
    connection = duckdb.connect()
    for name in ("httpfs", "avro", "iceberg"):
        connection.execute(f"LOAD '{extension(name)}'")
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3")
    if endpoint:
        host = endpoint.split("://", 1)[-1]
        connection.execute(
            "CREATE SECRET s3 (TYPE s3, KEY_ID ?, SECRET ?, REGION ?, ENDPOINT ?, "
            "URL_STYLE 'path', USE_SSL false)",
            [
                os.environ["AWS_ACCESS_KEY_ID"],
                os.environ["AWS_SECRET_ACCESS_KEY"],
                os.environ.get("AWS_REGION", "us-east-1"),
                host,
            ],
        )
    return connection


def with_duckdb(connection: duckdb.DuckDBPyConnection, location: str) -> list:
    # A metadata file, or the table's directory as the README shows (DuckDB then finds the
    # version by its hint).
    cursor = connection.execute("SELECT * FROM iceberg_scan(?)", [location])
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def stats_of(connection: duckdb.DuckDBPyConnection, metadata: str) -> dict:
    from pyiceberg.expressions import GreaterThanOrEqual, LessThan

    table = StaticTable.from_metadata(metadata, properties=s3_properties())
    files = [row for row in table.inspect.files().to_pylist() if row["content"] == 0]
    columns = [
        (field.name, str(field.field_type))
        for field in table.schema().fields
        if str(field.field_type) in ("string", "long", "int", "boolean", "double")
    ]
    checked, wrong, lowest = 0, [], {}
    for row in files:
        metrics = row["readable_metrics"]
        for name, kind in columns:
            found = metrics[name]
            quoted = '"' + name.replace('"', '""') + '"'
            total, values, least, most = connection.execute(
                f"SELECT count(*), count({quoted}), min({quoted}), max({quoted}) "
                "FROM read_parquet(?)",
                [row["file_path"]],
            ).fetchone()
            checked += 1
            where = f"{row['file_path'].rsplit('/', 1)[-1]} {name}"
            if found["value_count"] != total or found["null_value_count"] != total - values:
                wrong.append(f"{where}: counts {found['value_count']}/{found['null_value_count']}, "
                             f"the file has {total} values, {total - values} null")
            lower, upper = found["lower_bound"], found["upper_bound"]
            if values == 0:
                if lower is not None or upper is not None:
                    wrong.append(f"{where}: bounds {lower!r}..{upper!r} of nulls alone")
                continue
            if lower is None or upper is None:
                wrong.append(f"{where}: no bounds for {values} values")
                continue
            exact = kind != "string"
            if not (lower <= least and upper >= most) or (exact and (lower, upper) != (least, most)):
                wrong.append(f"{where}: bounds {lower!r}..{upper!r}, the file holds {least!r}..{most!r}")
            if kind in ("long", "int"):
                lowest[name] = min(lowest.get(name, lower), lower)
    pruned = None
    bounded = [name for name, kind in columns if name in lowest]
    if bounded:
        name = bounded[0]
        pruned = {
            "column": name,
            "below": len(list(table.scan(row_filter=LessThan(name, lowest[name])).plan_files())),
            "from": len(list(table.scan(row_filter=GreaterThanOrEqual(name, lowest[name])).plan_files())),
        }
    return {"files": len(files), "checked": checked, "wrong": wrong, "pruned": pruned}


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    connection = duckdb_connection()
    answer = {"pyiceberg": {}, "duckdb": {}}
    if sys.argv[1] == "--glue":
        if len(sys.argv) < 4:
            sys.exit(__doc__)
        from pyiceberg.catalog import load_catalog

        database = sys.argv[2]
        catalog = load_catalog("glue", **glue_properties())
        for name in sys.argv[3:]:
            table = catalog.load_table(f"{database}.{name}")
            answer["pyiceberg"][name] = table.scan().to_arrow().to_pylist()
            answer["duckdb"][name] = with_duckdb(connection, glue_metadata(database, name))
        json.dump(answer, sys.stdout)
        return
    if sys.argv[1] == "--count":
        counts = {}
        for metadata in sys.argv[2:]:
            name = table_location(metadata).rsplit("/", 1)[-1]
            counts[name] = {
                "pyiceberg": len(with_pyiceberg(metadata)),
                "duckdb": len(with_duckdb(connection, metadata)),
            }
        json.dump(counts, sys.stdout)
        return
    if sys.argv[1] == "--stats":
        stats = {}
        for metadata in sys.argv[2:]:
            stats[table_location(metadata).rsplit("/", 1)[-1]] = stats_of(connection, metadata)
        json.dump(stats, sys.stdout)
        return
    for metadata in sys.argv[1:]:
        location = table_location(metadata)
        name = location.rsplit("/", 1)[-1]
        answer["pyiceberg"][name] = with_pyiceberg(metadata)
        answer["duckdb"][name] = with_duckdb(connection, location)
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
