//! The published tables in the AWS Glue Data Catalog, where Athena, EMR and Glue Spark, Trino
//! and Ray Data find them by name.
//!
//! The catalog holds a pointer per table to its current metadata file (`metadata_location`).
//! The snapshot producer ([`super::sync`]) commits by creating the next metadata version in the
//! store; the catalog is then pointed at it with `UpdateTable`, conditional on the table version
//! read (Glue's `VersionId`), and redone when another update came between. A pointer is never
//! moved back to an older version of ours (a slower sync may arrive after a faster one), and a
//! pointer to a metadata file Afterglow did not write means another writer committed (an Athena
//! `OPTIMIZE`, a Glue compaction job): that is reported, never overwritten.

use std::collections::HashMap;

use aws_sdk_glue::types::{Column, StorageDescriptor, Table, TableInput};

use super::IcebergError;
use super::schema::hive_type;
use crate::keys;
use crate::storage::Storage;
use crate::tables::published::PublishedTable;

/// Updates that lose a race before pointing a table gives up.
const MAX_RACES: usize = 20;

/// The table parameter naming the current metadata file (Iceberg's Glue catalog convention).
const METADATA_LOCATION: &str = "metadata_location";
/// The table parameter naming the one before it.
const PREVIOUS_METADATA_LOCATION: &str = "previous_metadata_location";

/// A Glue database that holds the published tables.
#[derive(Clone, Debug)]
pub struct GlueCatalog {
    client: aws_sdk_glue::Client,
    database: String,
}

/// What pointing a table did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pointed {
    /// The table was not in the catalog; it is now, at the version.
    Created,
    /// The table pointed at an older version of ours (`from`, or none).
    Moved {
        /// The version it pointed at.
        from: Option<u64>,
    },
    /// The table already pointed at this version, or at a newer one of ours (`at`).
    Current {
        /// The version it points at.
        at: u64,
    },
}

/// The catalog's view of one table.
enum Listed {
    /// Not in the database.
    Absent,
    /// In it (`table`, with Glue's version id of it), pointing at our metadata `version`
    /// (`None`: no pointer yet).
    Ours {
        table: Box<Table>,
        version: Option<u64>,
    },
}

impl GlueCatalog {
    /// The catalog of `database`, through `client`.
    pub fn new(client: aws_sdk_glue::Client, database: impl Into<String>) -> Self {
        Self {
            client,
            database: database.into(),
        }
    }

    /// The catalog of `database`, with the standard AWS configuration chain.
    pub async fn connect(database: impl Into<String>) -> Self {
        let sdk = crate::aws::sdk_config().await;
        Self::new(aws_sdk_glue::Client::new(&sdk), database)
    }

    /// The database's name.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// The version of ours `table` points at (`None`: not in the catalog, or no pointer yet);
    /// an error when it points at another writer's metadata.
    pub async fn current(
        &self,
        storage: &dyn Storage,
        table: &PublishedTable,
    ) -> Result<Option<u64>, IcebergError> {
        Ok(match self.listed(storage, table).await? {
            Listed::Absent => None,
            Listed::Ours { version, .. } => version,
        })
    }

    /// Points `table` at `version` of its metadata (creating it in the catalog if absent),
    /// unless it already points there or at a newer version of ours.
    #[tracing::instrument(name = "glue_point", skip_all, fields(database = %self.database, table = table.name, version))]
    pub async fn point(
        &self,
        storage: &dyn Storage,
        table: &PublishedTable,
        version: u64,
    ) -> Result<Pointed, IcebergError> {
        let location = storage.uri(&keys::iceberg_metadata_key(table.name, version)?);
        for _ in 0..MAX_RACES {
            let (entry, from) = match self.listed(storage, table).await? {
                Listed::Absent => {
                    if self.create(storage, table, &location).await? {
                        return Ok(Pointed::Created);
                    }
                    // Created by another sync since: point it as found.
                    continue;
                }
                Listed::Ours {
                    version: Some(at), ..
                } if at >= version => return Ok(Pointed::Current { at }),
                Listed::Ours { table, version } => (table, version),
            };
            let previous = entry
                .parameters()
                .and_then(|parameters| parameters.get(METADATA_LOCATION))
                .cloned();
            let mut input = self.table_input(storage, table, &location)?;
            if let Some(previous) = previous {
                input = input.parameters(PREVIOUS_METADATA_LOCATION, previous);
            }
            let mut parameters = entry.parameters().cloned().unwrap_or_default();
            parameters.extend(input.get_parameters().clone().unwrap_or_default());
            let input = input
                .set_parameters(Some(parameters))
                .set_description(entry.description().map(str::to_owned))
                .build()
                .map_err(|err| IcebergError::Catalog(format!("table input: {err}")))?;
            let mut update = self
                .client
                .update_table()
                .database_name(&self.database)
                .table_input(input)
                // Every commit would otherwise archive a table version, and Glue keeps at most
                // 100 000 of them per table.
                .skip_archive(true);
            if let Some(version_id) = entry.version_id() {
                update = update.version_id(version_id);
            }
            match update.send().await {
                Ok(_) => {
                    tracing::info!(from, version, "catalog pointed");
                    return Ok(Pointed::Moved { from });
                }
                Err(err)
                    if err
                        .as_service_error()
                        .is_some_and(|err| err.is_concurrent_modification_exception()) =>
                {
                    tracing::info!(version, "lost a catalog update race; redoing");
                }
                Err(err) => {
                    return Err(IcebergError::Catalog(format!(
                        "UpdateTable {}.{}: {}",
                        self.database,
                        table.name,
                        aws_sdk_glue::error::DisplayErrorContext(err)
                    )));
                }
            }
        }
        Err(IcebergError::Contended {
            table: table.name.to_owned(),
            races: MAX_RACES,
        })
    }

    /// The catalog's entry for `table`, with the version of ours it points at.
    async fn listed(
        &self,
        storage: &dyn Storage,
        table: &PublishedTable,
    ) -> Result<Listed, IcebergError> {
        let found = match self
            .client
            .get_table()
            .database_name(&self.database)
            .name(table.name)
            .send()
            .await
        {
            Ok(found) => found,
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|err| err.is_entity_not_found_exception()) =>
            {
                return Ok(Listed::Absent);
            }
            Err(err) => {
                return Err(IcebergError::Catalog(format!(
                    "GetTable {}.{}: {}",
                    self.database,
                    table.name,
                    aws_sdk_glue::error::DisplayErrorContext(err)
                )));
            }
        };
        let listed = found.table.ok_or_else(|| {
            IcebergError::Catalog(format!(
                "GetTable {}.{} answered no table",
                self.database, table.name
            ))
        })?;
        let pointer = listed
            .parameters()
            .and_then(|parameters| parameters.get(METADATA_LOCATION));
        let version = match pointer {
            None => None,
            Some(location) => Some(our_version(storage, table, location).ok_or_else(|| {
                IcebergError::Foreign(format!(
                    "table {}.{} in the Glue catalog points at {location}, which Afterglow did \
                     not write",
                    self.database, table.name
                ))
            })?),
        };
        Ok(Listed::Ours {
            table: Box::new(listed),
            version,
        })
    }

    /// Creates `table` pointing at `location`; false when it exists already.
    async fn create(
        &self,
        storage: &dyn Storage,
        table: &PublishedTable,
        location: &str,
    ) -> Result<bool, IcebergError> {
        let input = self
            .table_input(storage, table, location)?
            .build()
            .map_err(|err| IcebergError::Catalog(format!("table input: {err}")))?;
        match self
            .client
            .create_table()
            .database_name(&self.database)
            .table_input(input)
            .send()
            .await
        {
            Ok(_) => {
                tracing::info!(table = table.name, "catalog table created");
                Ok(true)
            }
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|err| err.is_already_exists_exception()) =>
            {
                Ok(false)
            }
            Err(err) => Err(IcebergError::Catalog(format!(
                "CreateTable {}.{}: {}",
                self.database,
                table.name,
                aws_sdk_glue::error::DisplayErrorContext(err)
            ))),
        }
    }

    /// `table` as the catalog describes an Iceberg table: its pointer, and its columns with
    /// their field ids (for the consoles and crawlers that read Glue's columns rather than
    /// Iceberg's schema).
    fn table_input(
        &self,
        storage: &dyn Storage,
        table: &PublishedTable,
        location: &str,
    ) -> Result<aws_sdk_glue::types::builders::TableInputBuilder, IcebergError> {
        let mut columns = Vec::with_capacity(table.columns.len());
        for column in &table.columns {
            let kind = hive_type(column.sql_type).ok_or_else(|| {
                IcebergError::Unpublishable(format!(
                    "{}.{} has DuckDB type {}, which has no Glue type here",
                    table.name, column.name, column.sql_type
                ))
            })?;
            let column = Column::builder()
                .name(column.name)
                .r#type(kind)
                .parameters("iceberg.field.id", column.id.to_string())
                .parameters("iceberg.field.optional", "true")
                .parameters("iceberg.field.current", "true")
                .build()
                .map_err(|err| IcebergError::Catalog(format!("column: {err}")))?;
            columns.push(column);
        }
        let descriptor = StorageDescriptor::builder()
            .location(storage.uri(&keys::iceberg_table_key(table.name)?))
            .set_columns(Some(columns))
            .build();
        Ok(TableInput::builder()
            .name(table.name)
            .table_type("EXTERNAL_TABLE")
            .set_parameters(Some(HashMap::from([
                ("table_type".to_owned(), "ICEBERG".to_owned()),
                (METADATA_LOCATION.to_owned(), location.to_owned()),
            ])))
            .storage_descriptor(descriptor))
    }
}

/// The version of ours `location` names, if it is one of `table`'s metadata files in
/// `storage`.
fn our_version(storage: &dyn Storage, table: &PublishedTable, location: &str) -> Option<u64> {
    let version = keys::iceberg_metadata_version(table.name, location)?;
    let ours = keys::iceberg_metadata_key(table.name, version).ok()?;
    (storage.uri(&ours) == location).then_some(version)
}
