//! The published tables as Apache Iceberg, held to readers that are not ours.

mod glue;
mod published;
mod readers;
