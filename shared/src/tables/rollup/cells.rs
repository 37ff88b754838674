//! A rollup's rows, counted in Rust from the source rows DuckDB streams: one pass over them,
//! each row added to its cell in every grouping set, each cell keeping its extremes with how
//! many rows hold them.
//!
//! Counting the holders in DuckDB means joining every row back to its cell and grouping again,
//! per grouping set, a large share of every fold and run. A running extreme with its count
//! needs no second pass.
//!
//! How rows are split among counting threads depends on how many rows a cell has ([`Split`]).

mod cell;
mod columns;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::SyncSender;

use duckdb::Connection;
use duckdb::arrow::array::RecordBatch;
use duckdb::arrow::compute::cast;
use duckdb::arrow::datatypes::{DataType, Field, Float64Type, Int32Type, Int64Type, Schema};
use foldhash::fast::FixedState;

use self::cell::{Cell, Extreme};
use self::columns::{Texts, column, flags, integers, value};
use super::{GroupingSet, Measure, Slice, Summed, TOTALS, grouping_sets, round_up};
use crate::tables::TableError;
use crate::tables::newest::read_parquet;
use crate::tables::parquet::{ArrowRows, Layout, ParquetFile};

/// The columns of a rollup row as they are counted (DuckDB types), in the file's order. The
/// [`HOLDERS`] are counted as integers and written as `DOUBLE`, the type DuckDB's `count_if`
/// (a `HUGEINT`) was written as, so files of either build read alike.
const COUNTED: [(&str, &str); 21] = [
    ("grouping", "VARCHAR"),
    ("group_key", "VARCHAR"),
    ("job_id", "VARCHAR"),
    ("state", "VARCHAR"),
    ("type", "VARCHAR"),
    ("complete", "BOOLEAN"),
    ("error_type", "VARCHAR"),
    ("retried", "BOOLEAN"),
    ("dated", "BOOLEAN"),
    ("rounded", "BIGINT"),
    ("sign", "INTEGER"),
    ("n", "BIGINT"),
    ("d_min", "BIGINT"),
    ("d_max", "BIGINT"),
    ("c_min", "BIGINT"),
    ("l_max", "BIGINT"),
    ("example", "VARCHAR"),
    ("d_min_n", "BIGINT"),
    ("d_max_n", "BIGINT"),
    ("c_min_n", "BIGINT"),
    ("l_max_n", "BIGINT"),
];

/// The columns of [`COUNTED`] that count the holders of an extreme.
const HOLDERS: [&str; 4] = ["d_min_n", "d_max_n", "c_min_n", "l_max_n"];

/// Rows per row group of a rollup: small, so that a set's rows are a few of them (see
/// [`Cells::rows`]).
pub(super) const ROW_GROUP_ROWS: u64 = 8192;

/// The source rows' text columns a cell is keyed by besides its grouping key, and the key
/// columns of every grouping set.
const TEXTS: [&str; 9] = [
    "job_id",
    "state",
    "type",
    "error_type",
    "name",
    "func_or_class_name",
    "node_id",
    "worker_id",
    "fingerprint",
];

/// Positions in [`TEXTS`] of the cell's own text columns.
const JOB: usize = 0;
const STATE: usize = 1;
const TYPE: usize = 2;
const ERROR_TYPE: usize = 3;

/// The select list that streams `source` (a relation with the derived source columns and
/// `sign`) to [`write`].
pub(super) fn select_list() -> String {
    let mut columns: Vec<String> = TEXTS.iter().map(|column| (*column).to_owned()).collect();
    columns.extend(
        [
            "complete",
            "attempt_number >= 1 AS retried",
            "sign",
            "error_message",
            "creation_time_ms",
            "last_ms",
        ]
        .map(str::to_owned),
    );
    // The measures are rounded while they are counted ([`round_up`], tested equal to the
    // `rounded` SQL): two columns fewer to compute and stream.
    columns.extend(
        [Measure::Duration, Measure::Wait]
            .into_iter()
            .filter_map(Measure::column)
            .map(str::to_owned),
    );
    columns.join(", ")
}

/// Counts the rows `query` streams (its columns [`select_list`]'s) into rollup cells on
/// `threads` threads, adds in the cells of the stored rollups `previous`, and writes them to
/// `path` as Parquet. Returns the rollup's row count.
pub(super) fn write(
    connection: &Connection,
    query: &str,
    previous: &[PathBuf],
    path: &Path,
    threads: usize,
) -> Result<u64, TableError> {
    write_on(connection, query, previous, path, threads).map(|(rows, _)| rows)
}

/// [`write`], also returning how many threads counted any rows.
pub(super) fn write_on(
    connection: &Connection,
    query: &str,
    previous: &[PathBuf],
    path: &Path,
    threads: usize,
) -> Result<(u64, usize), TableError> {
    let sets = sets()?;
    let (counted, counters) = count(connection, Some(query), previous, &sets, threads)?;
    Ok((store(&counted, &sets, path)?, counters))
}

/// Writes to `path` the rollup of a fold's new base from the stored rollups `replaced` (those
/// that add up to the files it replaces: [`crate::tables::manifest::TableFiles::rollups`]):
/// their cells summed, each minus cell taken from its plus cell. Counting the new base again
/// would cost a large share of a big fold for few rollup rows' worth of news.
///
/// A cell whose extreme (or example) only superseded versions held cannot tell the next one.
/// A cell's state and completeness are part of its key, so the cells of such a [`Slice`] are
/// counted again from the rows `recount` streams for those slices, and the rollup is row for
/// row the one a full count writes. (But for one thing: a failure's example may be a
/// superseded version's message of the same fingerprint, which a delta's replacement that
/// changed only the message's numbers leaves in place, as any stored rollup may.) An error
/// means `replaced` do not add up (a cell with more rows taken than counted, say) and the
/// caller counts the base instead.
///
/// The sum is checked against `base_rows`, the new base's rows by slice: rollups that add up
/// to other rows (a span recorded wrong, a rollup replaced by another) would otherwise be
/// carried into every base after this one.
pub(super) fn write_summed(
    connection: &Connection,
    replaced: &[PathBuf],
    base_rows: &BTreeMap<Slice, i64>,
    recount: impl FnOnce(&[Slice]) -> String,
    path: &Path,
    threads: usize,
) -> Result<Summed, TableError> {
    let sets = sets()?;
    let (mut summed, _) = count(connection, None, replaced, &sets, threads)?;
    let mut stale = Vec::new();
    for cells in &mut summed {
        for slice in cells.net()? {
            if !stale.contains(&slice) {
                stale.push(slice);
            }
        }
    }
    let summed_rows = slice_rows(&summed, &sets);
    if &summed_rows != base_rows {
        return Err(TableError::Corrupt(format!(
            "rollups summed: {} rows by state and completeness, the new base {}",
            summed_rows.values().sum::<i64>(),
            base_rows.values().sum::<i64>()
        )));
    }
    stale.sort();
    if !stale.is_empty() {
        for cells in &mut summed {
            cells.drop_slices(&stale);
        }
        let (recounted, _) = count(connection, Some(&recount(&stale)), &[], &sets, threads)?;
        summed.extend(recounted);
    }
    Ok(Summed {
        rows: store(&summed, &sets, path)?,
        recounted: stale,
    })
}

/// Writes to `path` the cells of the stored rollups `stored` summed, for the grouping sets named
/// in `only` (rows of the others are not read), each minus cell taken from its plus cell. A
/// cell whose extreme only superseded versions held cannot tell the next one, and is an error:
/// the sum would not be the one a count writes. Returns the rollup's row count.
pub(super) fn write_sum(
    connection: &Connection,
    stored: &[PathBuf],
    only: &[&str],
    path: &Path,
    threads: usize,
) -> Result<u64, TableError> {
    let sets: Vec<Set> = grouping_sets()
        .filter(|set| only.contains(&set.name))
        .map(Set::new)
        .collect::<Result<_, _>>()?;
    let (mut summed, _) = count(connection, None, stored, &sets, threads)?;
    for cells in &mut summed {
        if !cells.net()?.is_empty() {
            return Err(TableError::Corrupt(
                "rollups summed: an extreme only superseded versions held".into(),
            ));
        }
    }
    store(&summed, &sets, path)
}

/// The rows `summed` (netted cells) count by slice, from the summary's set, which counts every
/// row once.
fn slice_rows(summed: &[Cells], sets: &[Set]) -> BTreeMap<Slice, i64> {
    let totals = sets.iter().position(|set| set.name == TOTALS);
    let mut rows = BTreeMap::new();
    for cells in summed {
        for (key, cell) in &cells.cells {
            if Some(key.set) == totals {
                let slice = Slice {
                    state: cells.value(key.state).map(String::from),
                    complete: key.complete,
                };
                *rows.entry(slice).or_default() += cell.n;
            }
        }
    }
    rows.retain(|_, rows| *rows != 0);
    rows
}

/// Every grouping set with its columns found among the streamed rows.
fn sets() -> Result<Vec<Set>, TableError> {
    grouping_sets().map(Set::new).collect()
}

/// Writes `counted` (cells of disjoint keys) to `path` as a rollup. Returns its row count.
fn store(counted: &[Cells], sets: &[Set], path: &Path) -> Result<u64, TableError> {
    let rows = written(&Cells::rows(counted, sets)?)?;
    // Written by the parquet crate: DuckDB's appender and `COPY` cost per value, a noticeable
    // share of every run.
    let layout = Layout {
        row_group_rows: ROW_GROUP_ROWS as usize,
        unique: &[],
        ordered: &[],
        columns: &[],
    };
    let mut file = ParquetFile::create(path, rows.schema(), &layout)?;
    file.write(&rows)?;
    file.finish()
}

/// `rows` (of [`COUNTED`] columns) as the file holds them: the holder counts as `DOUBLE`.
fn written(rows: &RecordBatch) -> Result<RecordBatch, TableError> {
    let mut fields = Vec::with_capacity(COUNTED.len());
    let mut columns = Vec::with_capacity(COUNTED.len());
    for (field, values) in rows.schema().fields().iter().zip(rows.columns()) {
        if HOLDERS.contains(&field.name().as_str()) {
            fields.push(Field::new(field.name(), DataType::Float64, true));
            columns.push(cast(values, &DataType::Float64)?);
        } else {
            fields.push(field.as_ref().clone());
            columns.push(Arc::clone(values));
        }
    }
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

/// A batch for a counting thread.
enum Batch {
    /// Rows of a stored rollup, each a cell.
    Stored(RecordBatch),
    /// Source rows, to count.
    Source(RecordBatch),
}

/// How a count's rows are split among its threads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Split {
    /// Each thread counts a share of the batches into every grouping set; their cells are
    /// combined at the end. For many rows per cell (a large base), where combining costs
    /// little and every row is decoded once.
    Rows,
    /// Each thread counts every batch into a share of the grouping sets ([`shares`]): their
    /// cells are disjoint and never combined, and stored cells are added in on every thread at
    /// once. For about one row per cell (a run's delta, adding in the cells of the deltas
    /// before it), where combining two threads' cells and the stored ones would be a large
    /// share of the rollup. A fold counted this way is slower than by rows.
    Sets,
}

/// Counts the cells of the stored rollups `previous` and the rows `query` streams (if any) on
/// `threads` threads: split by sets when adding in stored cells (a delta's rollup), else by
/// rows ([`Split`]). This thread only fetches the batches: DuckDB converts its rows to Arrow
/// on the thread that fetches them, a good share of the work. Returns cells of
/// disjoint grouping sets and how many threads counted any rows.
///
/// Counting is hash-map work, and on one thread it would keep one core busy while DuckDB's
/// threads stream the rows to it at a fraction of another, setting the pace of a fold's
/// rollup. Every part of a cell is a sum, an extreme or a least example, so cells counted
/// apart combine into the same rows.
fn count(
    connection: &Connection,
    query: Option<&str>,
    previous: &[PathBuf],
    sets: &[Set],
    threads: usize,
) -> Result<(Vec<Cells>, usize), TableError> {
    let split = if previous.is_empty() {
        Split::Rows
    } else {
        Split::Sets
    };
    let shares = match split {
        Split::Rows => vec![(0..sets.len()).collect(); threads.max(1)],
        Split::Sets => shares(sets.len(), threads),
    };
    let counted = std::thread::scope(|scope| {
        let (senders, helpers): (Vec<_>, Vec<_>) = shares
            .into_iter()
            .map(|share| {
                // Two batches in hand each: enough to keep a helper busy, bounded memory.
                let (sender, receiver) = std::sync::mpsc::sync_channel::<Batch>(2);
                let helper = scope.spawn(move || -> Result<Cells, TableError> {
                    let mut cells = Cells::of_share(&share, sets);
                    for rows in receiver {
                        match rows {
                            Batch::Stored(batch) => cells.add_stored(&batch, sets)?,
                            Batch::Source(batch) => cells.add(&batch, sets)?,
                        }
                    }
                    Ok(cells)
                });
                (sender, helper)
            })
            .unzip();
        let fed = feed(connection, query, previous, sets, &senders, split);
        drop(senders);
        // Every helper joined before an error is reported: one left to the scope that had
        // panicked would panic the scope. A helper that stopped stopped the feed: its error is
        // the one to report.
        let joined: Vec<Result<Cells, TableError>> = helpers
            .into_iter()
            .map(|helper| {
                helper.join().unwrap_or_else(|_| {
                    Err(TableError::Corrupt("a rollup counter panicked".into()))
                })
            })
            .collect();
        let counted = joined.into_iter().collect::<Result<Vec<_>, _>>()?;
        fed.map(|()| counted)
    })?;
    let counters = counted.iter().filter(|cells| cells.counted).count();
    if split == Split::Sets {
        return Ok((counted, counters));
    }
    // The first counter's cells take in the others'.
    let mut counted = counted.into_iter();
    let mut cells = counted.next().unwrap_or_default();
    for other in counted {
        cells.merge(other);
    }
    Ok((vec![cells], counters))
}

/// Hands the helpers the rows of the stored rollups at `previous`, then those `query` (if
/// any) streams: every batch to every helper when they split the sets, else each to the next in
/// turn. Stops early, without an error, when a helper stopped (it reports why).
fn feed(
    connection: &Connection,
    query: Option<&str>,
    previous: &[PathBuf],
    sets: &[Set],
    helpers: &[SyncSender<Batch>],
    split: Split,
) -> Result<(), TableError> {
    let mut turns = helpers.iter().cycle();
    let mut send = |batch: &RecordBatch, stored: bool| {
        let to: Vec<&SyncSender<Batch>> = match split {
            Split::Sets => helpers.iter().collect(),
            Split::Rows => turns.next().into_iter().collect(),
        };
        to.into_iter().all(|helper| {
            let batch = batch.clone();
            let rows = if stored {
                Batch::Stored(batch)
            } else {
                Batch::Source(batch)
            };
            helper.send(rows).is_ok()
        })
    };
    if !previous.is_empty() {
        let columns: Vec<&str> = COUNTED.iter().map(|(name, _)| *name).collect();
        // Every set counted reads every row (one of an unknown set is an error); fewer read
        // only their own.
        let only = if sets.len() < grouping_sets().count() {
            let names: Vec<String> = sets.iter().map(|set| format!("'{}'", set.name)).collect();
            format!(" WHERE grouping IN ({})", names.join(", "))
        } else {
            String::new()
        };
        let stored = format!(
            "SELECT {} FROM {}{only}",
            columns.join(", "),
            read_parquet(
                &previous.iter().map(PathBuf::as_path).collect::<Vec<_>>(),
                ""
            )
        );
        let mut statement = connection.prepare(&stored)?;
        for batch in statement.stream_arrow([])? {
            if !send(&batch?, true) {
                return Ok(());
            }
        }
    }
    let Some(query) = query else { return Ok(()) };
    let mut statement = connection.prepare(query)?;
    for batch in statement.stream_arrow([])? {
        if !send(&batch?, false) {
            return Ok(());
        }
    }
    Ok(())
}

/// The grouping sets (by position) each of `threads` counting threads counts: dealt in turn,
/// so that each holds sets keyed by large groups (names, nodes) and small ones (totals).
fn shares(sets: usize, threads: usize) -> Vec<Vec<usize>> {
    let helpers = threads.clamp(1, sets.max(1));
    (0..helpers)
        .map(|helper| (helper..sets).step_by(helpers).collect())
        .collect()
}

/// A grouping set with its columns found among the streamed rows.
struct Set {
    name: &'static str,
    /// Position in [`TEXTS`] of its key.
    key: Option<usize>,
    measure: Measure,
    required: bool,
    examples: bool,
}

impl Set {
    fn new(set: GroupingSet) -> Result<Self, TableError> {
        let position = |key: &str| {
            TEXTS
                .iter()
                .position(|column| *column == key)
                .ok_or_else(|| {
                    TableError::Corrupt(format!("grouping set {} by {key}: not streamed", set.name))
                })
        };
        let key = set.key.map(position).transpose()?;
        Ok(Self {
            name: set.name,
            key,
            measure: set.measure,
            required: set.required,
            examples: set.keeps_examples(),
        })
    }
}

/// One streamed row's values, texts as ids (see [`Cells::text_id`]).
#[derive(Clone, Copy)]
struct Row {
    texts: [Option<u32>; TEXTS.len()],
    complete: Option<bool>,
    retried: Option<bool>,
    sign: Option<i32>,
    created: Option<i64>,
    last: Option<i64>,
    duration: Option<i64>,
    rounded_duration: Option<i64>,
    wait: Option<i64>,
    rounded_wait: Option<i64>,
}

impl Row {
    /// The row's measure and its rounding, for `measure`.
    fn measure(&self, measure: Measure) -> (Option<i64>, Option<i64>) {
        match measure {
            Measure::Duration => (self.duration, self.rounded_duration),
            Measure::Wait => (self.wait, self.rounded_wait),
            Measure::Nothing => (None, None),
        }
    }
}

/// What a cell counts rows alike in (`CELL`), its texts as ids.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct CellKey {
    /// The grouping set's position.
    set: usize,
    group: Option<u32>,
    job: Option<u32>,
    state: Option<u32>,
    kind: Option<u32>,
    complete: Option<bool>,
    error_type: Option<u32>,
    retried: Option<bool>,
    /// Whether the rows have a creation time; `None` in rollups of formats that did not keep
    /// it apart.
    dated: Option<bool>,
    rounded: Option<i64>,
    sign: Option<i32>,
}

/// Every cell of a share of the grouping sets counted so far, and the texts their ids stand
/// for.
#[derive(Default)]
struct Cells {
    /// By position, whether a grouping set is counted here.
    owned: Vec<bool>,
    /// Which of [`TEXTS`] the sets counted here read.
    read: [bool; TEXTS.len()],
    /// Whether any source rows were counted.
    counted: bool,
    cells: HashMap<CellKey, Cell, FixedState>,
    /// Text → id; ids index `values`.
    ids: HashMap<Box<str>, u32, FixedState>,
    values: Vec<Box<str>>,
    /// Each text column's last id: rows come sorted by job and creation, so a column often
    /// repeats and its lookup is a comparison.
    recent: [Option<u32>; TEXTS.len()],
}

impl Cells {
    /// No cells yet of the grouping sets at positions `share` among `sets`.
    fn of_share(share: &[usize], sets: &[Set]) -> Self {
        let mut read = [false; TEXTS.len()];
        for slot in [JOB, STATE, TYPE, ERROR_TYPE] {
            read[slot] = true;
        }
        let mut owned = vec![false; sets.len()];
        for &index in share {
            if let Some(owned) = owned.get_mut(index) {
                *owned = true;
            }
            if let Some(key) = sets.get(index).and_then(|set| set.key) {
                read[key] = true;
            }
        }
        Self {
            owned,
            read,
            ..Self::default()
        }
    }

    /// Counts the rows of `batch` in this share's grouping sets.
    fn add(&mut self, batch: &RecordBatch, sets: &[Set]) -> Result<(), TableError> {
        let texts = TEXTS
            .iter()
            .zip(self.read)
            .map(|(name, read)| read.then(|| Texts::of(column(batch, name)?)).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        let complete = flags(column(batch, "complete")?)?;
        let retried = flags(column(batch, "retried")?)?;
        let sign = integers::<Int32Type>(column(batch, "sign")?, "INTEGER")?;
        let message = Texts::of(column(batch, "error_message")?)?;
        let big_ints = |name: &str| integers::<Int64Type>(column(batch, name)?, "BIGINT");
        let measure = |measure: Measure| match measure.column() {
            Some(name) => big_ints(name),
            None => Err(TableError::Corrupt(format!("{measure:?} is not streamed"))),
        };
        let duration = measure(Measure::Duration)?;
        let wait = measure(Measure::Wait)?;
        let created = big_ints("creation_time_ms")?;
        let last = big_ints("last_ms")?;
        self.counted |= batch.num_rows() > 0;
        let owned = self.owned.clone();
        for at in 0..batch.num_rows() {
            let mut ids = [None; TEXTS.len()];
            for (slot, (id, array)) in ids.iter_mut().zip(&texts).enumerate() {
                if let Some(array) = array {
                    *id = self.text_id(slot, array.get(at));
                }
            }
            let duration = value(duration, at);
            let wait = value(wait, at);
            let row = Row {
                texts: ids,
                complete: value(complete, at),
                retried: value(retried, at),
                sign: value(sign, at),
                created: value(created, at),
                last: value(last, at),
                duration,
                rounded_duration: duration.map(round_up),
                wait,
                rounded_wait: wait.map(round_up),
            };
            let example = message.get(at);
            for (index, set) in sets.iter().enumerate() {
                if owned.get(index) == Some(&true) {
                    self.count(index, set, &row, example);
                }
            }
        }
        Ok(())
    }

    /// Takes in the rows of a stored rollup (of [`COUNTED`] columns, holders as written), each
    /// the cell it was counted as.
    fn add_stored(&mut self, batch: &RecordBatch, sets: &[Set]) -> Result<(), TableError> {
        let text = |name: &str| Texts::of(column(batch, name)?);
        let (grouping, group, example) = (text("grouping")?, text("group_key")?, text("example")?);
        let (job, state) = (text(TEXTS[JOB])?, text(TEXTS[STATE])?);
        let (kind, error_type) = (text(TEXTS[TYPE])?, text(TEXTS[ERROR_TYPE])?);
        let complete = flags(column(batch, "complete")?)?;
        let retried = flags(column(batch, "retried")?)?;
        // Rollups of formats before `dated` have no such column.
        let dated = batch.column_by_name("dated").map(flags).transpose()?;
        let sign = integers::<Int32Type>(column(batch, "sign")?, "INTEGER")?;
        let big_ints = |name: &str| integers::<Int64Type>(column(batch, name)?, "BIGINT");
        let (rounded, n) = (big_ints("rounded")?, big_ints("n")?);
        let values = [
            big_ints("d_min")?,
            big_ints("d_max")?,
            big_ints("c_min")?,
            big_ints("l_max")?,
        ];
        let holders = |name: &str| integers::<Float64Type>(column(batch, name)?, "DOUBLE");
        let holders = [
            holders(HOLDERS[0])?,
            holders(HOLDERS[1])?,
            holders(HOLDERS[2])?,
            holders(HOLDERS[3])?,
        ];
        for at in 0..batch.num_rows() {
            let name = grouping.get(at);
            let set = sets
                .iter()
                .position(|set| Some(set.name) == name)
                .ok_or_else(|| TableError::Corrupt(format!("rollup row of grouping {name:?}")))?;
            if self.owned.get(set) != Some(&true) {
                continue;
            }
            let key = CellKey {
                set,
                group: group.get(at).map(|text| self.intern(text)),
                job: self.text_id(JOB, job.get(at)),
                state: self.text_id(STATE, state.get(at)),
                kind: self.text_id(TYPE, kind.get(at)),
                complete: value(complete, at),
                error_type: self.text_id(ERROR_TYPE, error_type.get(at)),
                retried: value(retried, at),
                dated: dated.and_then(|dated| value(dated, at)),
                rounded: value(rounded, at),
                sign: value(sign, at),
            };
            let extreme = |which: usize| Extreme {
                value: values.get(which).and_then(|values| value(*values, at)),
                // Whole numbers of rows, written as `DOUBLE` ([`written`]).
                holders: holders
                    .get(which)
                    .and_then(|holders| value(*holders, at))
                    .map_or(0, |holders| holders as i64),
            };
            let cell = Cell {
                n: value(n, at).unwrap_or(0),
                measure_min: extreme(0),
                measure_max: extreme(1),
                created_min: extreme(2),
                last_max: extreme(3),
                example: example.get(at).map(Box::from),
            };
            self.cells.entry(key).or_default().merge(cell);
        }
        Ok(())
    }

    /// Counts `row` in the set at `index`, unless the set leaves it out.
    fn count(&mut self, index: usize, set: &Set, row: &Row, example: Option<&str>) {
        let group = set
            .key
            .and_then(|key| row.texts.get(key).copied().flatten());
        let (measure, rounded) = row.measure(set.measure);
        let missing = (set.key.is_some() && group.is_none())
            || (set.measure != Measure::Nothing && measure.is_none());
        if set.required && missing {
            return;
        }
        let key = CellKey {
            set: index,
            group,
            job: row.texts[JOB],
            state: row.texts[STATE],
            kind: row.texts[TYPE],
            complete: row.complete,
            error_type: row.texts[ERROR_TYPE],
            retried: row.retried,
            dated: Some(row.created.is_some()),
            rounded,
            sign: row.sign,
        };
        let example = example.filter(|_| set.examples);
        self.cells
            .entry(key)
            .or_default()
            .add(row, measure, example);
    }

    /// Takes in the cells `other` counted from other rows, its texts' ids made ours.
    fn merge(&mut self, other: Self) {
        let ids: Vec<u32> = other.values.iter().map(|text| self.intern(text)).collect();
        let ours = |id: Option<u32>| id.and_then(|id| ids.get(id as usize).copied());
        for (key, cell) in other.cells {
            let key = CellKey {
                group: ours(key.group),
                job: ours(key.job),
                state: ours(key.state),
                kind: ours(key.kind),
                error_type: ours(key.error_type),
                ..key
            };
            self.cells.entry(key).or_default().merge(cell);
        }
        self.counted |= other.counted;
    }

    /// Takes each minus cell (summed stored rollups' counts of superseded versions) from its
    /// plus cell, leaving the counts of the newest versions, as a base's rollup holds them.
    /// Returns the slices of the cells whose extremes or example are no longer known.
    fn net(&mut self) -> Result<Vec<Slice>, TableError> {
        let minus: Vec<CellKey> = self
            .cells
            .keys()
            .filter(|key| key.sign != Some(1))
            .copied()
            .collect();
        let mut stale: Vec<(Option<u32>, Option<bool>)> = Vec::new();
        for key in minus {
            if key.sign != Some(-1) {
                return Err(TableError::Corrupt(format!(
                    "rollups summed: a cell of sign {:?}",
                    key.sign
                )));
            }
            // Every row is complete or not; a slice of neither could not be counted again.
            if key.complete.is_none() {
                return Err(TableError::Corrupt(
                    "rollups summed: a cell of unknown completeness".into(),
                ));
            }
            let Some(gone) = self.cells.remove(&key) else {
                continue;
            };
            let plus = CellKey {
                sign: Some(1),
                ..key
            };
            let Some(cell) = self.cells.get_mut(&plus) else {
                return Err(TableError::Corrupt(
                    "rollups summed: superseded rows never counted".into(),
                ));
            };
            let known = cell.subtract(gone)?;
            let slice = (key.state, key.complete);
            if cell.n == 0 {
                self.cells.remove(&plus);
            } else if !known && !stale.contains(&slice) {
                stale.push(slice);
            }
        }
        Ok(stale
            .into_iter()
            .map(|(state, complete)| Slice {
                state: self.value(state).map(String::from),
                complete,
            })
            .collect())
    }

    /// Drops the cells of `slices`.
    fn drop_slices(&mut self, slices: &[Slice]) {
        // A state this share never saw has no id here, and no cells to drop.
        let dropped: Vec<(Option<u32>, Option<bool>)> = slices
            .iter()
            .filter_map(|slice| {
                let state = match &slice.state {
                    Some(state) => Some(*self.ids.get(state.as_str())?),
                    None => None,
                };
                Some((state, slice.complete))
            })
            .collect();
        self.cells
            .retain(|key, _| !dropped.contains(&(key.state, key.complete)));
    }

    /// The id of `text` in the column at `slot`.
    fn text_id(&mut self, slot: usize, text: Option<&str>) -> Option<u32> {
        let text = text?;
        if let Some(Some(id)) = self.recent.get(slot)
            && self.value(Some(*id)) == Some(text)
        {
            return Some(*id);
        }
        let id = self.intern(text);
        if let Some(recent) = self.recent.get_mut(slot) {
            *recent = Some(id);
        }
        Some(id)
    }

    /// The id of `text`, a new one if it has none yet.
    fn intern(&mut self, text: &str) -> u32 {
        if let Some(id) = self.ids.get(text) {
            return *id;
        }
        let id = u32::try_from(self.values.len()).unwrap_or(u32::MAX);
        self.values.push(text.into());
        self.ids.insert(text.into(), id);
        id
    }

    /// The text an id stands for.
    fn value(&self, id: Option<u32>) -> Option<&str> {
        id.and_then(|id| self.values.get(id as usize))
            .map(|text| &**text)
    }

    /// Every cell of `counted` (cells of disjoint keys) as one batch of [`COUNTED`]
    /// rows, ordered by grouping set, then job. A read names one set (the summary only
    /// `totals`, a few of a large base rollup's rows); with each set's rows together in row
    /// groups of their own, the others' row groups are skipped by their statistics. In hash
    /// order every row group would hold every set, and the summary would read them all.
    fn rows(counted: &[Self], sets: &[Set]) -> Result<RecordBatch, TableError> {
        let total = counted.iter().map(|cells| cells.cells.len()).sum();
        let mut rows = ArrowRows::new(&COUNTED, total)?;
        let name = |key: &CellKey| sets.get(key.set).map(|set| set.name);
        let mut ordered: Vec<(&Self, &CellKey, &Cell)> = counted
            .iter()
            .flat_map(|cells| {
                cells
                    .cells
                    .iter()
                    .map(move |(key, cell)| (cells, key, cell))
            })
            .collect();
        ordered.sort_unstable_by_key(|(cells, key, _)| (name(key), cells.value(key.job)));
        for (cells, key, cell) in ordered {
            let name = name(key);
            rows.text(name)?;
            rows.text(cells.value(key.group))?;
            rows.text(cells.value(key.job))?;
            rows.text(cells.value(key.state))?;
            rows.text(cells.value(key.kind))?;
            rows.boolean(key.complete)?;
            rows.text(cells.value(key.error_type))?;
            rows.boolean(key.retried)?;
            rows.boolean(key.dated)?;
            rows.big_int(key.rounded)?;
            rows.integer(key.sign)?;
            rows.big_int(Some(cell.n))?;
            rows.big_int(cell.measure_min.value)?;
            rows.big_int(cell.measure_max.value)?;
            rows.big_int(cell.created_min.value)?;
            rows.big_int(cell.last_max.value)?;
            rows.text(cell.example.as_deref())?;
            for extreme in [
                cell.measure_min,
                cell.measure_max,
                cell.created_min,
                cell.last_max,
            ] {
                // DuckDB's `count_if` over nothing but nulls was null, not 0.
                rows.big_int(extreme.value.map(|_| extreme.holders))?;
            }
            rows.end_row()?;
        }
        rows.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cell of `n` rows whose extremes are `low` and `high`, each held by `holders` rows,
    /// with an example.
    fn cell(n: i64, (low, high): (i64, i64), holders: i64, example: &str) -> Cell {
        let extreme = |value: i64| Extreme {
            value: Some(value),
            holders,
        };
        Cell {
            n,
            measure_min: extreme(low),
            measure_max: extreme(high),
            created_min: extreme(low),
            last_max: extreme(high),
            example: Some(example.into()),
        }
    }

    /// Taking superseded rows out of a cell keeps its extremes and example only while a row
    /// left can hold them, and refuses rows the cell never counted.
    #[test]
    fn a_cell_less_its_superseded_rows_knows_what_its_rows_left_hold() {
        let subtract =
            |mut plus: Cell, minus: Cell| plus.subtract(minus).map(|known| (known, plus));
        let plus = || cell(5, (0, 10), 2, "a");
        // Superseded rows inside the extremes, a larger example: all still known.
        let left = subtract(plus(), cell(2, (3, 7), 1, "b"));
        assert!(
            matches!(&left, Ok((true, cell)) if cell.n == 3 && cell.measure_min.holders == 2),
            "{left:?}"
        );
        // One of two holders of each extreme superseded: one left holds it.
        let left = subtract(plus(), cell(1, (0, 10), 1, "b"));
        assert!(
            matches!(&left, Ok((true, cell)) if cell.measure_max.holders == 1),
            "{left:?}"
        );
        // Every holder superseded: the next extreme is not known.
        let left = subtract(plus(), cell(2, (0, 7), 2, "b"));
        assert!(matches!(&left, Ok((false, _))), "{left:?}");
        // The example a superseded row had: another row may or may not have it too. Or one
        // below it, which a replacement that changed only the message's numbers left stored.
        for example in ["a", "0"] {
            let left = subtract(plus(), cell(1, (3, 7), 1, example));
            assert!(matches!(&left, Ok((false, _))), "{example}: {left:?}");
        }
        // Rows the cell never counted: an extreme beyond its own, more holders or rows than
        // it has.
        for minus in [
            cell(1, (-1, 7), 1, "b"),
            cell(1, (3, 11), 1, "b"),
            cell(1, (0, 7), 3, "b"),
            cell(6, (3, 7), 1, "b"),
        ] {
            let left = subtract(plus(), minus);
            assert!(matches!(&left, Err(TableError::Corrupt(_))), "{left:?}");
        }
    }

    /// Every grouping set is counted by exactly one thread, and no thread is left idle while
    /// there are sets for it.
    #[test]
    fn shares_deal_each_set_to_exactly_one_thread() {
        let sets = grouping_sets().count();
        for threads in 0..=sets + 2 {
            let shares = shares(sets, threads);
            assert_eq!(shares.len(), threads.clamp(1, sets), "threads {threads}");
            let mut dealt: Vec<usize> = shares.iter().flatten().copied().collect();
            dealt.sort_unstable();
            assert_eq!(dealt, (0..sets).collect::<Vec<_>>(), "threads {threads}");
            assert!(shares.iter().all(|share| !share.is_empty()));
        }
    }
}
