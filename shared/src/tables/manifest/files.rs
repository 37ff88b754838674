//! The files of one table as a manifest names them: data files with their deletion vectors,
//! rollups and key indexes (and the sizes of each), a base and the deltas written since.

use serde::{Deserialize, Serialize};

use crate::storage::ObjectKey;

/// A live data file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataFile {
    /// Its key.
    pub key: ObjectKey,
    /// Rows in it.
    pub rows: u64,
    /// Its size.
    pub bytes: u64,
    /// For a `task_attempts` delta: the stored rows it supersedes, so that a read drops them by
    /// position instead of comparing keys. `None` on bases, entity files, and deltas of an
    /// older format (a session with such a delta is read by key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletes: Option<Deletes>,
    /// For a `task_attempts` base or delta: its rollup (see [`crate::tables::rollup`]). `None`
    /// on entity files and on files of an older format (a session with such a file is counted
    /// by scanning it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollup: Option<ObjectKey>,
    /// The format of `rollup` ([`crate::tables::rollup::FORMAT`] when this build wrote it);
    /// absent for the first format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollup_format: Option<u32>,
    /// For a delta: how many deltas its rollup counts, itself and those just before it.
    /// Compaction adds some earlier deltas' rollups into each new one
    /// ([`TableFiles::rollups_to_add_in`]), so a read sums a few rollups instead of one per
    /// delta. Always written with rollup format 3; a format-3 rollup without it (a build that
    /// knows no such field rewrote the manifest) is not read, as its span is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollup_covers: Option<u32>,
    /// For a `task_attempts` base or delta: its key index (see
    /// [`crate::tables::key_index`]). `None` on entity files and on files of an older format (a
    /// session with such a file is looked up by scanning).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_index: Option<ObjectKey>,
    /// The size of `rollup`; `None` when written by a build that did not record it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollup_bytes: Option<u64>,
    /// The size of `key_index`; `None` when written by a build that did not record it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_index_bytes: Option<u64>,
}

impl DataFile {
    /// The size of `key`, one of this file's objects ([`Self::keys`]). Where the manifest
    /// does not record it, the data file's own size stands in: every companion object holds
    /// less than the rows it describes, so a read's planned bytes are never underestimated.
    pub fn size_of(&self, key: &ObjectKey) -> u64 {
        let recorded = if self.rollup.as_ref() == Some(key) {
            self.rollup_bytes
        } else if self.key_index.as_ref() == Some(key) {
            self.key_index_bytes
        } else if self
            .deletes
            .as_ref()
            .and_then(|deletes| deletes.key.as_ref())
            == Some(key)
        {
            self.deletes.as_ref().and_then(|deletes| deletes.bytes)
        } else {
            Some(self.bytes)
        };
        recorded.unwrap_or(self.bytes)
    }

    /// The objects this file consists of: its data, and its deletion vector, rollup and key
    /// index if it has them.
    pub fn keys(&self) -> impl Iterator<Item = &ObjectKey> {
        std::iter::once(&self.key)
            .chain(
                self.deletes
                    .as_ref()
                    .and_then(|deletes| deletes.key.as_ref()),
            )
            .chain(self.rollup.as_ref())
            .chain(self.key_index.as_ref())
    }

    /// Its rollup, if it has one in a format this build reads.
    pub fn current_rollup(&self) -> Option<&ObjectKey> {
        self.rollup.as_ref().filter(|_| {
            self.rollup_format
                .is_some_and(crate::tables::rollup::reads_format)
        })
    }

    /// How many deltas its rollup counts ([`DataFile::rollup_covers`]): one for format 2,
    /// which counted its own file alone; `None` when unknown.
    fn rollup_span(&self) -> Option<usize> {
        match self.rollup_format? {
            2 => Some(1),
            3..=crate::tables::rollup::FORMAT => self
                .rollup_covers
                .and_then(|covers| usize::try_from(covers).ok())
                .filter(|covers| *covers >= 1),
            _ => None,
        }
    }
}

/// The rows one delta supersedes: a Parquet file of `(file, row)` pairs, `file` being the
/// superseded row's file as a position in [`TableFiles::all`] when the delta was committed and
/// `row` its row number there. Positions stay valid until the next base, which replaces every
/// file at once (only deltas are appended in between).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deletes {
    /// The vector's key; `None` when the delta supersedes nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<ObjectKey>,
    /// Pairs in it.
    pub rows: u64,
    /// The vector's size; `None` when written by a build that did not record it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

/// The files of one table: one base (possibly several files) and the deltas written
/// since, oldest first. A key's newest row is in the newest file that has it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableFiles {
    /// Files of the base.
    pub base: Vec<DataFile>,
    /// Delta files, oldest first.
    pub deltas: Vec<DataFile>,
}

impl TableFiles {
    /// Every live file, oldest first.
    pub fn all(&self) -> impl Iterator<Item = &DataFile> {
        self.base.iter().chain(&self.deltas)
    }

    /// True when every delta says which rows it supersedes, so the table reads without a
    /// key join (see [`crate::tables::newest`]).
    pub fn has_deletion_vectors(&self) -> bool {
        self.deltas.iter().all(|delta| delta.deletes.is_some())
    }

    /// True when a tidy folds this table: it has deltas, or a base of an older format (its
    /// rollup in an older format, or no key index), which is written again once so that every
    /// session ends up read the fast way.
    pub fn needs_fold(&self) -> bool {
        let current_base = self.dated_rollups().is_some() && self.has_key_indexes();
        !self.deltas.is_empty() || (!self.base.is_empty() && !current_base)
    }

    /// True when every file has a key index.
    pub fn has_key_indexes(&self) -> bool {
        self.all().all(|file| file.key_index.is_some())
    }

    /// True when every file has a rollup this build reads (they then add up to the table's
    /// counts).
    pub fn has_rollups(&self) -> bool {
        self.all().all(|file| file.current_rollup().is_some())
    }

    /// The rollups whose counts add up to the table's: every base file's, and
    /// [`TableFiles::delta_rollups`]. `None` unless [`TableFiles::has_rollups`].
    pub fn rollups(&self) -> Option<Vec<&ObjectKey>> {
        if !self.has_rollups() {
            return None;
        }
        let mut keys: Vec<&ObjectKey> = self
            .base
            .iter()
            .filter_map(DataFile::current_rollup)
            .collect();
        keys.extend(self.delta_rollups()?);
        Some(keys)
    }

    /// [`TableFiles::rollups`] when every one keeps apart the attempts with a creation time
    /// (format [`crate::tables::rollup::DATED`]), as a time range reads them and as a fold sums
    /// them.
    pub fn dated_rollups(&self) -> Option<Vec<&ObjectKey>> {
        let dated = self.all().all(|file| {
            file.rollup_format
                .is_some_and(|format| format >= crate::tables::rollup::DATED)
        });
        self.rollups().filter(|_| dated)
    }

    /// The rollups that count every delta once, oldest first: the newest delta's, then the
    /// rollup of the newest delta it does not cover, and so on. `None` when a delta has no
    /// rollup this build reads.
    pub fn delta_rollups(&self) -> Option<Vec<&ObjectKey>> {
        Some(
            self.delta_rollup_spans()?
                .into_iter()
                .filter_map(|(delta, _)| delta.current_rollup())
                .collect(),
        )
    }

    /// The rollups a new delta's rollup adds in, oldest first, and how many deltas it then
    /// counts, itself included: the newest of [`TableFiles::delta_rollups`] for as long as
    /// each counts no more deltas than those gathered before it. As with a binary counter's
    /// carries, a delta's cells are rewritten only when the span they are in doubles, so a
    /// run rewrites few cells and a read sums one rollup per bit of the number of deltas.
    /// None to add in (and only itself) when a delta has no rollup this build reads; only
    /// rollups of the format this build writes are added in.
    pub fn rollups_to_add_in(&self) -> (Vec<&ObjectKey>, usize) {
        let spans = self.delta_rollup_spans().unwrap_or_default();
        let mut covers = 1;
        let mut keys = Vec::new();
        for (delta, span) in spans.into_iter().rev() {
            let key = delta
                .current_rollup()
                .filter(|_| delta.rollup_format == Some(crate::tables::rollup::FORMAT));
            let Some(key) = key.filter(|_| span <= covers) else {
                break;
            };
            covers += span;
            keys.push(key);
        }
        keys.reverse();
        (keys, covers)
    }

    /// [`TableFiles::delta_rollups`], each with how many deltas it counts. `None` also when
    /// a rollup's span is unknown or reaches past the first delta (the deltas before it were
    /// folded into the base, which would count them twice).
    fn delta_rollup_spans(&self) -> Option<Vec<(&DataFile, usize)>> {
        if self
            .deltas
            .iter()
            .any(|delta| delta.current_rollup().is_none())
        {
            return None;
        }
        let mut spans = Vec::new();
        let mut uncovered = self.deltas.len();
        while let Some(newest) = uncovered.checked_sub(1) {
            let delta = self.deltas.get(newest)?;
            let span = delta.rollup_span()?;
            uncovered = uncovered.checked_sub(span)?;
            spans.push((delta, span));
        }
        spans.reverse();
        Some(spans)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tables::rollup;

    /// A delta with a rollup: `format`, covering `covers` deltas (`None`: unsaid).
    fn delta(name: &str, format: Option<u32>, covers: Option<u32>) -> DataFile {
        let key = |kind: &str| ObjectKey::new(format!("tables/t/{kind}-{name}.parquet"));
        DataFile {
            key: key("delta").expect("a key"),
            rows: 1,
            bytes: 1,
            deletes: None,
            rollup: Some(key("rollup").expect("a key")),
            rollup_format: format,
            rollup_covers: covers,
            key_index: None,
            rollup_bytes: None,
            key_index_bytes: None,
        }
    }

    fn names(keys: &[&ObjectKey]) -> Vec<String> {
        keys.iter()
            .map(|key| key.as_str().trim_start_matches("tables/t/").to_owned())
            .collect()
    }

    #[test]
    fn the_rollups_read_count_each_delta_once_whatever_the_previous_build_wrote() {
        let base = DataFile {
            rollup_covers: None,
            ..delta("base", Some(2), None)
        };
        // Two deltas of a build whose rollups each counted themselves, then this build's: the
        // third counts all three, the fourth all four; the fifth only itself (its run could not
        // read the others' rollups).
        let table = TableFiles {
            base: vec![base],
            deltas: vec![
                delta("1", Some(2), None),
                delta("2", Some(2), None),
                delta("3", Some(rollup::FORMAT), Some(3)),
                delta("4", Some(rollup::FORMAT), Some(4)),
                delta("5", Some(rollup::FORMAT), Some(1)),
            ],
        };
        let read = table.rollups().expect("readable rollups");
        assert_eq!(
            names(&read),
            [
                "rollup-base.parquet",
                "rollup-4.parquet",
                "rollup-5.parquet"
            ]
        );
        // The fourth counting only itself and the third: the two before are read on their own.
        let mut partly = table.clone();
        partly.deltas[3].rollup_covers = Some(2);
        assert_eq!(
            names(&partly.rollups().expect("readable rollups")),
            [
                "rollup-base.parquet",
                "rollup-1.parquet",
                "rollup-2.parquet",
                "rollup-4.parquet",
                "rollup-5.parquet"
            ]
        );
        // A rollup counting more deltas than there are (some were folded since), or a
        // format-3 rollup whose span a build that knows no `rollup_covers` dropped: its span
        // is unknown, so nothing adds up and reads scan.
        for covers in [Some(3), None, Some(0)] {
            let unknown = TableFiles {
                base: Vec::new(),
                deltas: vec![
                    delta("1", Some(2), None),
                    delta("2", Some(rollup::FORMAT), covers),
                ],
            };
            assert!(unknown.delta_rollups().is_none(), "covers {covers:?}");
            assert!(unknown.rollups().is_none(), "covers {covers:?}");
            assert_eq!(unknown.rollups_to_add_in(), (Vec::new(), 1));
        }
        // Runs that each add a delta whose rollup adds in what `rollups_to_add_in` names: after
        // n runs a read sums one rollup per bit of n, each counting a power of two deltas.
        let mut runs = TableFiles::default();
        for run in 1..=40_u32 {
            let (added, covers) = runs.rollups_to_add_in();
            let added = added.len();
            let mut new = delta(&run.to_string(), Some(rollup::FORMAT), None);
            new.rollup_covers = Some(u32::try_from(covers).expect("a small span"));
            runs.deltas.push(new);
            let read = runs.delta_rollups().expect("readable");
            assert_eq!(read.len(), run.count_ones() as usize, "after {run} runs");
            // Adding in takes the rollups of the carried bits: as many as trailing ones.
            assert_eq!(added, (run - 1).trailing_ones() as usize, "run {run}");
            let spans: Vec<usize> = runs
                .delta_rollup_spans()
                .expect("readable")
                .into_iter()
                .map(|(_, span)| span)
                .collect();
            let bits: Vec<usize> = (0..32)
                .rev()
                .map(|bit| 1_usize << bit)
                .filter(|span| run as usize & span != 0)
                .collect();
            assert_eq!(spans, bits, "after {run} runs");
        }
        // A rollup of the first format (or none) anywhere: nothing adds up.
        let mut old = table.clone();
        old.deltas[0].rollup_format = None;
        assert!(old.rollups().is_none() && old.delta_rollups().is_none());
        let mut newer = table;
        newer.deltas[4].rollup_format = Some(rollup::FORMAT + 1);
        assert!(newer.rollups().is_none());
    }

    #[test]
    fn a_range_and_a_fold_read_rollups_only_when_every_one_keeps_dates_apart() {
        let base = DataFile {
            rollup_covers: None,
            ..delta("base", Some(rollup::DATED), None)
        };
        let table = TableFiles {
            base: vec![base.clone()],
            deltas: vec![
                delta("1", Some(3), Some(1)),
                delta("2", Some(rollup::DATED), Some(1)),
            ],
        };
        assert!(table.rollups().is_some());
        assert!(table.dated_rollups().is_none());
        // A new delta adds in the dated rollup before it, and stops at the format-3 one.
        let (added, covers) = table.rollups_to_add_in();
        assert_eq!(
            (names(&added), covers),
            (vec!["rollup-2.parquet".to_owned()], 2)
        );
        let mut dated = table;
        dated.deltas[0].rollup_format = Some(rollup::DATED);
        assert_eq!(
            names(&dated.dated_rollups().expect("dated rollups")),
            [
                "rollup-base.parquet",
                "rollup-1.parquet",
                "rollup-2.parquet"
            ]
        );
        assert_eq!(dated.rollups_to_add_in().1, 3);
        // A base whose rollup does not keep dates apart is folded once, to write one that does.
        let indexed = |format| TableFiles {
            base: vec![DataFile {
                key_index: Some(ObjectKey::new("tables/t/index.parquet").expect("a key")),
                rollup_format: Some(format),
                ..base.clone()
            }],
            deltas: Vec::new(),
        };
        assert!(indexed(3).needs_fold());
        assert!(!indexed(rollup::DATED).needs_fold());
    }
}
