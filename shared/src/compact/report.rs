//! What compaction reports: what a run did ([`CompactReport`]), the objects and sessions it
//! could not compact ([`RunOutcome`], [`InRuns`]), and where its time went ([`RunTimes`]).

use std::collections::HashSet;
use std::time::Duration;

use super::CompactError;
use super::schedule::quiet::QuietCheck;
use crate::keys::{ClusterName, SessionName};
use crate::raw::read::RawError;
use crate::storage::ObjectKey;

/// What one run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// Raw objects read.
    pub raw_objects: usize,
    /// Events parsed.
    pub events: usize,
    /// Events dropped as re-deliveries (same `eventId`).
    pub duplicates: usize,
    /// Lines set aside (see the quarantine objects).
    pub quarantined: usize,
    /// Sessions touched.
    pub sessions: usize,
    /// Rows written to delta or base files.
    pub rows_written: u64,
    /// Manifest races lost and redone.
    pub retries: usize,
    /// The sessions this run committed, as it left them: each is to be checked once it has
    /// gone quiet ([`super::Compactor::tidy_if_quiet`]).
    pub committed: Vec<QuietCheck>,
    /// Where the run's time went.
    pub took: RunTimes,
}

impl CompactReport {
    /// Adds what a later run did: counts summed (`sessions` too, so a session two runs
    /// touched counts twice), its commits appended.
    pub fn add(&mut self, run: CompactReport) {
        self.raw_objects += run.raw_objects;
        self.events += run.events;
        self.duplicates += run.duplicates;
        self.quarantined += run.quarantined;
        self.sessions += run.sessions;
        self.rows_written += run.rows_written;
        self.retries += run.retries;
        self.committed.extend(run.committed);
        self.took.add(&run.took);
    }
}

/// What a run did with the raw objects it was given ([`super::Compactor::compact_readable`]).
#[derive(Debug, Default)]
pub struct RunOutcome {
    /// What it did: what it read and the sessions it touched (the failed ones' included),
    /// and the sessions it committed (`committed`) and the rows they wrote.
    pub report: CompactReport,
    /// Objects that could not be read, and why (compacted with none of the others).
    pub unreadable: Vec<(ObjectKey, RawError)>,
    /// Sessions that could not be merged or committed; the run's other sessions were.
    pub failed: Vec<FailedSession>,
}

impl RunOutcome {
    /// The objects not compacted, to be tried again: those that could not be read, and those
    /// holding events of a failed session.
    pub fn not_compacted(&self) -> HashSet<&ObjectKey> {
        self.unreadable
            .iter()
            .map(|(key, _)| key)
            .chain(self.failed.iter().flat_map(|session| &session.keys))
            .collect()
    }
}

/// What [`super::Compactor::compact_in_runs`] did.
#[derive(Debug, Default)]
pub struct InRuns {
    /// What the runs that did not fail as a whole did, together.
    pub outcome: RunOutcome,
    /// The runs that failed as a whole, none of their objects compacted; the later runs ran.
    pub failed_runs: Vec<FailedRun>,
}

impl InRuns {
    /// The objects not compacted, to be tried again: those of [`RunOutcome::not_compacted`]
    /// and of the runs that failed.
    pub fn not_compacted(&self) -> HashSet<&ObjectKey> {
        let mut keys = self.outcome.not_compacted();
        keys.extend(self.failed_runs.iter().flat_map(|run| &run.keys));
        keys
    }
}

/// A run that failed as a whole ([`super::Compactor::compact_readable`]'s error): its quarantine
/// could not be written, or a worker died.
#[derive(Debug)]
pub struct FailedRun {
    /// Its raw objects.
    pub keys: Vec<ObjectKey>,
    /// Why.
    pub error: CompactError,
}

/// A session a run read but could not merge or commit.
#[derive(Debug)]
pub struct FailedSession {
    /// Its cluster.
    pub cluster: ClusterName,
    /// The session.
    pub session: SessionName,
    /// The run's raw objects that hold events of it.
    pub keys: Vec<ObjectKey>,
    /// Why.
    pub error: CompactError,
}

/// Where a run's time went (wall clock; a session's merge summed over its tries): what
/// `afterglow bench` reports of compaction, for profiling without a profiler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunTimes {
    /// Fetching and parsing the raw objects, their events taken into each session's attempts.
    pub read: Duration,
    /// Finding the stored versions of the attempts merged and reading them from the stored
    /// files' local copies (fetching those copies is not counted).
    pub locate: Duration,
    /// Merging the attempts with their stored versions and writing the deltas with their
    /// deletion vectors.
    pub delta: Duration,
    /// Counting the deltas' rollups.
    pub rollup: Duration,
    /// Folding deltas into new bases, all of it: fetching the files, interleaving their rows,
    /// the new base's rollup and key index, and storing them.
    pub fold: Duration,
}

impl RunTimes {
    /// Adds `other`'s times to these.
    pub fn add(&mut self, other: &Self) {
        self.read += other.read;
        self.locate += other.locate;
        self.delta += other.delta;
        self.rollup += other.rollup;
        self.fold += other.fold;
    }
}
