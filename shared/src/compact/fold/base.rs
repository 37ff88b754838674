//! A fold's new base: every live `task_attempts` file of a session written as one file of the
//! newest rows ([`write_newest_rows`]), with its rollup and key index, and uploaded. The rows
//! never become merge state: every delta row was written fully merged, so picking each key's
//! newest version is the whole fold.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

use duckdb::Connection;

use super::interleave::interleave_newest;
use crate::compact::scratch::run_blocking;
use crate::compact::{CompactError, Compactor};
use crate::keys::{ClusterName, SessionName, TableFile};
use crate::storage::ObjectKey;
use crate::tables::TableError;
use crate::tables::key_index::{self, KeyIndex};
use crate::tables::manifest::{DataFile, Manifest};
use crate::tables::newest::{self, LocalDeletes, LocalFiles, TableFiles};
use crate::tables::rollup::{self, RowsByFile};
use crate::tables::task_attempts;

impl Compactor {
    /// Folds every live `task_attempts` file of `manifest` into one new base file, the newest
    /// version of each key ([`write_newest_rows`]: the sorted files interleaved, or sorted by
    /// DuckDB when they cannot be), and uploads it with its rollup and key index: the rows never
    /// become merge state, so a base of millions of attempts costs a pass over its files, not
    /// memory for every attempt.
    pub(in crate::compact) async fn fold_base(
        &self,
        cluster: &ClusterName,
        session: &SessionName,
        manifest: &Manifest,
    ) -> Result<DataFile, CompactError> {
        let table = &manifest.task_attempts;
        let base = self.fetch(table.base.iter()).await?;
        let deltas = self.fetch(table.deltas.iter()).await?;
        // Each delta's vector, with the position of the delta that wrote it.
        let vectors: Vec<(usize, &ObjectKey, u64)> = table
            .deltas
            .iter()
            .enumerate()
            .filter_map(|(offset, delta)| {
                let deletes = delta.deletes.as_ref()?;
                Some((
                    table.base.len() + offset,
                    deletes.key.as_ref()?,
                    deletes.rows,
                ))
            })
            .collect();
        let vector_files = self
            .fetch_keys(vectors.iter().map(|(_, key, _)| *key))
            .await?;
        let deletes = table.has_deletion_vectors().then(|| {
            vectors
                .iter()
                .zip(vector_files.files())
                .map(|((position, _, rows), path)| LocalDeletes {
                    path: path.clone(),
                    rows: *rows,
                    // One session, every file fetched: positions are read indices.
                    files: (0..*position).map(Some).collect(),
                })
                .collect()
        });
        let attempts = LocalFiles {
            base: base.files().clone(),
            deltas: deltas.files().clone(),
            one_session: true,
            deletes,
        };
        // The new base's rollup is summed from the rollups that add up to the files it
        // replaces. Those are an optimization: any that cannot be fetched (or that do not keep
        // apart what this build's rollups do) only means the base is counted.
        let replaced = match table.dated_rollups() {
            Some(keys) if table.has_deletion_vectors() => {
                match self.fetch_keys(keys.into_iter()).await {
                    Ok(replaced) => Some(replaced),
                    Err(err) => {
                        tracing::warn!(error = %err, "rollups not fetched; the new base is counted");
                        None
                    }
                }
            }
            _ => None,
        };
        let replaced_paths = replaced
            .as_ref()
            .map(|replaced| replaced.files().clone())
            .unwrap_or_default();
        let (key, path) = self.new_attempts_file(cluster, session, TableFile::Base)?;
        let write_path = path.clone();
        let (rollup_key, rollup_path) =
            self.new_attempts_file(cluster, session, TableFile::Rollup)?;
        let write_rollup_path = rollup_path.clone();
        let (index_key, index_path) =
            self.new_attempts_file(cluster, session, TableFile::KeyIndex)?;
        let write_index_path = index_path.clone();
        let spill = self.scratch.join("duckdb-spill");
        let memory_limit = self.settings.memory_limit_mib;
        let (rows, summed) = run_blocking(move || -> Result<(u64, bool), CompactError> {
            let connection = crate::tables::open_duckdb()?;
            let mut setup = format!("SET temp_directory = {};", newest::path_literal(&spill));
            if let Some(memory) = memory_limit {
                setup.push_str(&format!(" SET memory_limit = '{memory}MiB';"));
            }
            connection.execute_batch(&setup).map_err(TableError::from)?;
            let started = Instant::now();
            let (rows, index) = write_newest_rows(&connection, &attempts.files(), &write_path)?;
            let written = started.elapsed();
            let recounted = write_base_rollup(
                &connection,
                &write_path,
                &replaced_paths,
                &write_rollup_path,
            )?;
            let summed = recounted.is_some();
            let rolled_up = started.elapsed();
            match index {
                Some(index) => index.write(&write_index_path)?,
                None => {
                    key_index::write_key_index(&connection, &write_path, rows, &write_index_path)?
                }
            };
            // Where a fold's time goes, as for a run's files (`the run's files written`).
            tracing::debug!(
                rows,
                rollups = replaced_paths.len(),
                summed,
                recounted = ?recounted.unwrap_or_default(),
                base_ms = written.as_millis(),
                rollup_ms = (rolled_up - written).as_millis(),
                key_index_ms = (started.elapsed() - rolled_up).as_millis(),
                "the fold's files written"
            );
            Ok((rows, summed))
        })
        .await?;
        if summed {
            self.folds_summed.fetch_add(1, Ordering::Relaxed);
        }
        // The rollups summed stay in the cache until the sum is done.
        drop(replaced);
        // The rollup and key index first: a base is only ever installed with them.
        let rollup_bytes = self.upload(&rollup_path, &rollup_key).await?;
        let _ = tokio::fs::remove_file(&rollup_path).await;
        let key_index_bytes = self.upload(&index_path, &index_key).await?;
        let _ = tokio::fs::remove_file(&index_path).await;
        let bytes = self.upload(&path, &key).await?;
        let _ = tokio::fs::remove_file(&path).await;
        Ok(DataFile {
            key,
            rows,
            bytes,
            deletes: None,
            rollup: Some(rollup_key),
            rollup_format: Some(rollup::FORMAT),
            rollup_covers: None,
            key_index: Some(index_key),
            rollup_bytes: Some(rollup_bytes),
            key_index_bytes: Some(key_index_bytes),
        })
    }
}

/// Writes the newest rows of a table's base and deltas (see [`crate::tables::newest`]) as one
/// file at `path`, without turning rows back into merge state. The sorted files are interleaved
/// in Rust ([`super::interleave`]); files it cannot interleave (deltas without a deletion
/// vector, other columns) are sorted again by DuckDB, as are files it finds out of order or
/// cannot read. Returns the row count, and the rows' key index when they were interleaved in
/// Rust (DuckDB's file is indexed by [`key_index::write_key_index`]).
pub(super) fn write_newest_rows(
    connection: &Connection,
    files: &TableFiles<'_>,
    path: &Path,
) -> Result<(u64, Option<KeyIndex>), TableError> {
    match interleave_newest(
        connection,
        files,
        &task_attempts::SORT_KEY,
        &task_attempts::LAYOUT,
        path,
    ) {
        Ok(Some((rows, index))) => return Ok((rows, Some(index))),
        Ok(None) => {}
        // Nothing of the interleave is left; DuckDB sorts whatever it is given.
        Err(err) => tracing::warn!(error = %err, "fold not interleaved; DuckDB sorts it instead"),
    }
    let rows = newest::write_newest(
        connection,
        files,
        &task_attempts::sort_order(),
        task_attempts::PARQUET_OPTIONS,
        &task_attempts::STORED_COLUMNS,
        path,
    )?;
    Ok((rows, None))
}

/// Writes the rollup of a fold's new base at `path` to `rollup_path`: summed from the rollups
/// `replaced` when there are any ([`rollup::write_summed_rollup`]), else counted. Rollups that
/// do not add up must not wedge the session, so the base is then counted. Returns the slices
/// counted again after a sum, or `None` when the whole base was counted.
fn write_base_rollup(
    connection: &Connection,
    path: &Path,
    replaced: &[PathBuf],
    rollup_path: &Path,
) -> Result<Option<Vec<rollup::Slice>>, CompactError> {
    if !replaced.is_empty() {
        match rollup::write_summed_rollup(connection, path, replaced, rollup_path) {
            Ok(summed) => return Ok(Some(summed.recounted)),
            Err(err) => {
                tracing::warn!(error = %err, "rollups not summed; the new base is counted");
            }
        }
    }
    rollup::write_rollup(connection, path, &RowsByFile::new(), &[], rollup_path)?;
    Ok(None)
}
