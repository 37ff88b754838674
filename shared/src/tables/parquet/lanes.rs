//! A row group's columns encoded on several threads ("lanes"), each lane encoding the columns
//! given to it, while the thread that writes hands it the next batches.
//!
//! A fold's new base is interleaved on one thread and encoded on another, and one encoder would set
//! the pace: it is busy throughout while the interleave waits for it. Spreading the columns over
//! lanes lets the interleave and the encoders share every core. The columns are dealt to the lanes
//! once, by their sizes in the first batch, and each lane encodes its columns' values in the order
//! they were written.
//!
//! Row groups are pipelined: closing one sends each lane its `Close` and goes on with the next
//! group; the closed group's chunks are appended to the file when the next group closes (or
//! the file does), so the writing thread does not wait at a group's end for its last batches
//! to be encoded. It waits only when a lane has [`QUEUED_BATCHES`] messages unread.

use std::fs::File;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use duckdb::arrow::datatypes::{DataType, FieldRef, SchemaRef};
use duckdb::arrow::record_batch::RecordBatch;
use parquet::arrow::arrow_writer::{
    ArrowColumnChunk, ArrowColumnWriter, ArrowRowGroupWriterFactory, compute_leaves,
};
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::writer::SerializedFileWriter;

/// Batches a lane may hold before the writing thread waits for it: enough to smooth the
/// batches' uneven costs, few enough that the lanes' queues stay small beside a row group.
const QUEUED_BATCHES: usize = 4;

/// What a lane is asked to do, in order.
enum Message {
    /// The writers of the next row group's columns given to this lane, by column position.
    Open(Vec<(usize, ArrowColumnWriter)>),
    /// Encode these rows of the open row group.
    Write(RecordBatch),
    /// Close the open row group's writers and answer with their chunks.
    Close,
}

/// The encoded chunks of a lane's columns of one row group, by column position.
type Chunks = Result<Vec<(usize, ArrowColumnChunk)>, ParquetError>;

/// One encoding thread and the channels to it.
struct Lane {
    sender: SyncSender<Message>,
    chunks: Receiver<Chunks>,
    thread: JoinHandle<()>,
}

/// A Parquet file whose row groups' columns are encoded on several lanes.
pub(super) struct ColumnLanes {
    file: SerializedFileWriter<File>,
    factory: ArrowRowGroupWriterFactory,
    schema: SchemaRef,
    row_group_rows: usize,
    threads: usize,
    /// The lanes, started with the first batch (its columns' sizes decide which lane encodes
    /// which column).
    lanes: Vec<Lane>,
    /// Which lane encodes each column.
    lane_of: Vec<usize>,
    /// Rows sent for the open row group; 0 when none is open.
    group_rows: usize,
    /// Row groups opened so far.
    groups: usize,
    /// A closed row group whose chunks have not been received and appended yet.
    closing: bool,
    /// An error was returned: a group's chunks may be left unread in the lanes, so every later
    /// call fails rather than append chunks of two groups as one.
    failed: bool,
}

impl ColumnLanes {
    /// Writes to `file` with `factory`'s column writers, row groups of `row_group_rows`, on
    /// `threads` lanes. No column of `schema` may be nested: a column and its writer pair one
    /// to one.
    pub(super) fn new(
        file: SerializedFileWriter<File>,
        factory: ArrowRowGroupWriterFactory,
        schema: SchemaRef,
        row_group_rows: usize,
        threads: usize,
    ) -> Self {
        Self {
            file,
            factory,
            schema,
            row_group_rows: row_group_rows.max(1),
            threads: threads.max(1),
            lanes: Vec::new(),
            lane_of: Vec::new(),
            group_rows: 0,
            groups: 0,
            closing: false,
            failed: false,
        }
    }

    /// Appends `batch`'s rows, closing row groups as they fill.
    pub(super) fn write(&mut self, batch: &RecordBatch) -> Result<(), ParquetError> {
        self.unless_failed()?;
        let written = self.write_rows(batch);
        self.failed = written.is_err();
        written
    }

    /// Closes the last row group, stops the lanes and writes the footer.
    pub(super) fn finish(mut self) -> Result<ParquetMetaData, ParquetError> {
        self.unless_failed()?;
        if self.group_rows > 0 {
            self.close_group()?;
        }
        self.append_closed()?;
        for lane in self.lanes.drain(..) {
            drop(lane.sender);
            lane.thread
                .join()
                .map_err(|_| ParquetError::General("a column encoder panicked".into()))?;
        }
        self.file.close()
    }

    /// Closes the open row group and appends row group `group` of the file `source` (whose
    /// footer is `metadata`, with its offset index) as it is encoded there, byte for byte: no
    /// column is decoded. Its columns must be this file's, as its footer describes them.
    pub(super) fn copy_row_group(
        &mut self,
        source: &File,
        metadata: &ParquetMetaData,
        group: usize,
    ) -> Result<(), ParquetError> {
        self.unless_failed()?;
        let copied = self.copy_group(source, metadata, group);
        self.failed = copied.is_err();
        copied
    }

    /// [`ColumnLanes::copy_row_group`], leaving `failed` to its caller.
    fn copy_group(
        &mut self,
        source: &File,
        metadata: &ParquetMetaData,
        group: usize,
    ) -> Result<(), ParquetError> {
        let missing = || ParquetError::General(format!("no row group {group} to copy"));
        let row_group = metadata.row_groups().get(group).ok_or_else(missing)?;
        let rows = u64::try_from(row_group.num_rows()).map_err(|_| missing())?;
        let offsets = metadata.page_index_for_row_group(group);
        if self.group_rows > 0 {
            self.close_group()?;
        }
        self.append_closed()?;
        let mut writer = self.file.next_row_group()?;
        for (column, chunk) in row_group.columns().iter().enumerate() {
            // Without its offset index a copied chunk would leave the file's partial, and
            // lookups find pages through it.
            let offset_index = offsets.offset_index(column).cloned().ok_or_else(|| {
                ParquetError::General(format!("row group {group} has no offset index to copy"))
            })?;
            let chunk_bytes = u64::try_from(chunk.compressed_size()).map_err(|_| {
                ParquetError::General(format!(
                    "a chunk of {} bytes in row group {group}",
                    chunk.compressed_size()
                ))
            })?;
            writer.append_column(
                source,
                ColumnCloseResult {
                    bytes_written: chunk_bytes,
                    rows_written: rows,
                    metadata: chunk.clone(),
                    bloom_filter: None,
                    column_index: None,
                    offset_index: Some(offset_index),
                },
            )?;
        }
        writer.close()?;
        // The factory's column writers are made for a row group's ordinal.
        self.groups += 1;
        Ok(())
    }

    fn unless_failed(&self) -> Result<(), ParquetError> {
        if self.failed {
            return Err(ParquetError::General(
                "the file failed earlier; nothing more is written to it".into(),
            ));
        }
        Ok(())
    }

    fn write_rows(&mut self, batch: &RecordBatch) -> Result<(), ParquetError> {
        // A lane's writer takes the values of its column's type for granted.
        let types = |schema: &SchemaRef| -> Vec<DataType> {
            schema
                .fields()
                .iter()
                .map(|field| field.data_type().clone())
                .collect()
        };
        if types(&batch.schema()) != types(&self.schema) {
            return Err(ParquetError::General(format!(
                "a batch of columns {:?} for a file of {:?}",
                types(&batch.schema()),
                types(&self.schema)
            )));
        }
        if self.lanes.is_empty() {
            self.start(batch)?;
        }
        let mut offset = 0;
        while offset < batch.num_rows() {
            if self.group_rows == 0 {
                self.open_group()?;
            }
            let rows = (batch.num_rows() - offset).min(self.row_group_rows - self.group_rows);
            let part = batch.slice(offset, rows);
            for lane in &self.lanes {
                send(lane, Message::Write(part.clone()))?;
            }
            offset += rows;
            self.group_rows += rows;
            if self.group_rows == self.row_group_rows {
                self.close_group()?;
            }
        }
        Ok(())
    }

    /// Starts the lanes and deals them the columns, largest first to the least loaded, by
    /// their size in `first` (a column's encoding costs about as its bytes do).
    fn start(&mut self, first: &RecordBatch) -> Result<(), ParquetError> {
        let threads = self.threads.min(self.schema.fields().len()).max(1);
        let mut columns: Vec<(usize, usize)> = first
            .columns()
            .iter()
            .map(|column| column.get_array_memory_size())
            .enumerate()
            .collect();
        columns.sort_by_key(|(_, size)| std::cmp::Reverse(*size));
        let mut load = vec![0usize; threads];
        self.lane_of = vec![0; columns.len()];
        for (column, size) in columns {
            let lane = (0..threads).min_by_key(|lane| load[*lane]).unwrap_or(0);
            load[lane] += size;
            self.lane_of[column] = lane;
        }
        let fields: Vec<FieldRef> = self.schema.fields().iter().cloned().collect();
        for index in 0..threads {
            let (sender, messages) = sync_channel(QUEUED_BATCHES);
            // At most one answer is ever unread: the next `Close` is sent after it is read.
            let (answer, chunks) = sync_channel(1);
            let fields = fields.clone();
            let thread = std::thread::Builder::new()
                .name(format!("parquet-lane-{index}"))
                .spawn(move || encode(&fields, &messages, &answer))
                .map_err(|err| {
                    ParquetError::General(format!("cannot start a column encoder: {err}"))
                })?;
            self.lanes.push(Lane {
                sender,
                chunks,
                thread,
            });
        }
        Ok(())
    }

    /// Gives each lane the writers of its columns for the next row group.
    fn open_group(&mut self) -> Result<(), ParquetError> {
        let created = self.factory.create_column_writers(self.groups)?;
        if created.len() != self.lane_of.len() {
            return Err(ParquetError::General(format!(
                "{} column writers for {} columns",
                created.len(),
                self.lane_of.len()
            )));
        }
        let mut writers: Vec<Vec<(usize, ArrowColumnWriter)>> =
            self.lanes.iter().map(|_| Vec::new()).collect();
        for (column, writer) in created.into_iter().enumerate() {
            let lane = self.lane_of.get(column).copied().unwrap_or(0);
            writers
                .get_mut(lane)
                .ok_or_else(|| ParquetError::General(format!("no lane {lane}")))?
                .push((column, writer));
        }
        for (lane, writers) in self.lanes.iter().zip(writers) {
            send(lane, Message::Open(writers))?;
        }
        self.groups += 1;
        Ok(())
    }

    /// Asks the lanes to close the open row group, after appending the one closed before it.
    fn close_group(&mut self) -> Result<(), ParquetError> {
        self.append_closed()?;
        for lane in &self.lanes {
            send(lane, Message::Close)?;
        }
        self.closing = true;
        self.group_rows = 0;
        Ok(())
    }

    /// Appends the closed row group's chunks, in column order, once every lane has them.
    fn append_closed(&mut self) -> Result<(), ParquetError> {
        if !std::mem::take(&mut self.closing) {
            return Ok(());
        }
        // Every lane's answer is read before any error is returned, so none is left behind.
        let answers: Vec<Chunks> = self
            .lanes
            .iter()
            .map(|lane| lane.chunks.recv().unwrap_or_else(|_| Err(stopped())))
            .collect();
        let mut chunks = Vec::with_capacity(self.lane_of.len());
        for answer in answers {
            chunks.extend(answer?);
        }
        chunks.sort_by_key(|(column, _)| *column);
        let mut group = self.file.next_row_group()?;
        for (_, chunk) in chunks {
            chunk.append_to_row_group(&mut group)?;
        }
        group.close()?;
        Ok(())
    }
}

/// A lane: encodes the columns it is given, batch by batch, until its channel closes. After
/// an error it answers the next `Close` with it and ignores the rest of the group.
fn encode(fields: &[FieldRef], messages: &Receiver<Message>, answer: &SyncSender<Chunks>) {
    let mut writers: Vec<(usize, ArrowColumnWriter)> = Vec::new();
    let mut failed: Option<ParquetError> = None;
    for message in messages {
        match message {
            Message::Open(next) => writers = next,
            Message::Write(batch) => {
                if failed.is_some() {
                    continue;
                }
                if let Err(err) = write_columns(fields, &mut writers, &batch) {
                    failed = Some(err);
                }
            }
            Message::Close => {
                let chunks = match failed.take() {
                    Some(err) => Err(err),
                    None => std::mem::take(&mut writers)
                        .into_iter()
                        .map(|(column, writer)| Ok((column, writer.close()?)))
                        .collect(),
                };
                if answer.send(chunks).is_err() {
                    return;
                }
            }
        }
    }
}

/// Encodes `batch`'s values of the columns `writers` write.
fn write_columns(
    fields: &[FieldRef],
    writers: &mut [(usize, ArrowColumnWriter)],
    batch: &RecordBatch,
) -> Result<(), ParquetError> {
    for (column, writer) in writers {
        let (Some(field), Some(array)) = (fields.get(*column), batch.columns().get(*column)) else {
            return Err(ParquetError::General(format!(
                "no column {column} in a batch of {} columns",
                batch.num_columns()
            )));
        };
        for leaf in compute_leaves(field, array)? {
            writer.write(&leaf)?;
        }
    }
    Ok(())
}

/// Hands `message` to `lane`, waiting while its queue is full.
fn send(lane: &Lane, message: Message) -> Result<(), ParquetError> {
    lane.sender.send(message).map_err(|_| stopped())
}

/// A lane's thread ended before the file did: it panicked.
fn stopped() -> ParquetError {
    ParquetError::General("a column encoder stopped".into())
}
