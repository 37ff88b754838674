//! The log shipper's logic (`afterglow-ship-logs`, docs/architecture.md, "Logs"): follow every Ray
//! session's `logs/` folder (with `logs/old/` and the cluster events in `logs/events/`) on one
//! node and send what is appended to each file, with its byte
//! offset: one request per session and pass holds a piece of every file that grew
//! ([`crate::frames`]), and a request fills to [`ShipSettings::body_bytes`] before the next one
//! starts, so an idle node sends nothing and a busy one one request per interval.
//!
//! Each file is followed by name within its session. Ray moves a dead worker's files into
//! `logs/old/` (same name, same inode): the file is followed there. A file renamed away by
//! rotation (`x.log` → `x.log.1`, found again by its inode) is finished first, and the new file
//! at the name continues after it, like `tail -F`: the stored file is every generation in turn.
//! A file truncated in place continues the same way. Only the first generation keeps the
//! offsets Ray reports in `taskLogInfo`; Ray rotates workers' stdout and stderr only when
//! `RAY_ROTATION_MAX_BYTES` is set for them.
//!
//! What was acknowledged is kept in a state file, written after each pass, so that a restarted
//! shipper neither re-sends nor skips: it resumes at acknowledged offsets, which are where stored
//! bytes end, so anything sent again is recognised by the store (`shared::logs::store`). At most
//! one request's body is held in memory.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::frames::{Body, BodyAnswer, Piece as FramedPiece, PieceOutcome};
use crate::names::{LogFileName, NodeId, SessionName};

/// How the shipper runs.
#[derive(Clone, Debug)]
pub struct ShipSettings {
    /// Ray's temporary directory (`/tmp/ray` unless `ray start --temp-dir` says otherwise).
    pub ray_dir: PathBuf,
    /// This node's id; when `None`, each session's is read from the port files Ray names after
    /// the node (`metrics_agent_port_{node_id}` and the like).
    pub node_id: Option<NodeId>,
    /// Where acknowledged offsets are kept across restarts.
    pub state_file: PathBuf,
    /// Most bytes in one request's body (kept between [`crate::frames::MIN_BODY_BYTES`] and
    /// [`crate::frames::MAX_BODY_BYTES`]).
    pub body_bytes: usize,
}

/// One request: pieces of any number of a session's files on one node, framed
/// ([`crate::frames`]).
#[derive(Clone, Copy, Debug)]
pub struct LogBatch<'a> {
    /// The session the files belong to.
    pub session: &'a SessionName,
    /// The node the files are on.
    pub node_id: &'a NodeId,
    /// The framed pieces.
    pub body: &'a [u8],
}

/// Why a [`LogSink`] did not take a batch.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Worth retrying later: the endpoint is down, busy, failed, or refused the whole request
    /// (a wrong token is fixed on the endpoint's side, and the shipper then carries on).
    #[error("{0}")]
    Retry(String),
}

/// Where batches go: the ingest endpoint (`POST /v1/logs/{cluster}`), or a test's recorder.
#[async_trait]
pub trait LogSink: Send + Sync {
    /// Stores the batch, returning once it is durable, with what became of each piece.
    async fn send(&self, batch: LogBatch<'_>) -> Result<BodyAnswer, SendError>;
}

/// Why a pass stopped early.
#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    /// The sink asked to retry: the session's sending stops, and the next pass resumes where
    /// it did.
    #[error("sending the logs of {session} failed, will retry: {reason}")]
    Retry {
        /// The session being sent.
        session: String,
        /// What the sink said.
        reason: String,
    },
    /// The state file exists but cannot be read. Starting afresh would send everything again,
    /// so the shipper does not.
    #[error(
        "the shipper's state file {path} is not readable ({reason}); move it away to send every \
         file again from the start"
    )]
    StateUnreadable {
        /// The state file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The state file could not be written.
    #[error("could not save the shipper's state to {path}: {source}")]
    StateNotSaved {
        /// The state file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Requests sent and answered.
    pub requests: usize,
    /// Pieces acknowledged (a request holds a piece of every file that grew).
    pub pieces: usize,
    /// Bytes acknowledged.
    pub bytes: u64,
    /// Files followed, in every session.
    pub files: usize,
    /// Ray's directory does not exist yet (the shipper started before `ray start`, as a
    /// container's entrypoint starts it): nothing was read or saved, and the next pass looks
    /// again.
    pub awaiting_ray: bool,
}

/// A file's identity on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
struct Identity {
    dev: u64,
    ino: u64,
}

/// One generation of a followed file: one inode's bytes, stored from `base` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Generation {
    identity: Identity,
    /// Where this inode's byte 0 is stored (after the earlier generations' bytes).
    base: u64,
    /// This inode's bytes acknowledged.
    shipped: u64,
}

/// A followed file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Followed {
    current: Generation,
    /// The endpoint refused the file: it is not sent again.
    #[serde(default)]
    refused: bool,
    /// The inode was deleted: its number may be reused by an unrelated file, so it no longer
    /// identifies this one. A new file at the name continues after it.
    #[serde(default)]
    gone: bool,
}

/// What survives a restart, per session.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct SessionState {
    /// By file name.
    files: BTreeMap<String, Followed>,
    /// Inodes already sent as an earlier generation of some file (a rotated-away copy): not
    /// files of their own.
    #[serde(default)]
    retired: BTreeSet<Identity>,
}

/// The state file's content.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct State {
    sessions: BTreeMap<String, SessionState>,
}

/// A file found in a session's `logs/` (or `logs/old/`).
#[derive(Clone, Debug)]
struct Found {
    path: PathBuf,
    identity: Identity,
    len: u64,
}

/// Follows the log folders of every session under [`ShipSettings::ray_dir`].
#[derive(Debug)]
pub struct Shipper {
    settings: ShipSettings,
    state: State,
    /// Sessions whose node id could not be told, already warned about.
    unknown_node: BTreeSet<String>,
    /// Files with names that cannot be stored, already warned about.
    unnamable: BTreeSet<PathBuf>,
    /// The state file's content as last written, so that an idle pass writes nothing.
    saved: Vec<u8>,
}

impl Shipper {
    /// A shipper resuming from the state file, if there is one. An unreadable state file is
    /// an error rather than a fresh start, which would send everything again.
    pub fn new(settings: ShipSettings) -> Result<Self, ShipError> {
        let unreadable = |reason: String| ShipError::StateUnreadable {
            path: settings.state_file.clone(),
            reason,
        };
        let (state, saved) = match std::fs::read(&settings.state_file) {
            Ok(bytes) => (
                serde_json::from_slice(&bytes).map_err(|err| unreadable(err.to_string()))?,
                bytes,
            ),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                (State::default(), Vec::new())
            }
            Err(err) => return Err(unreadable(err.to_string())),
        };
        Ok(Self {
            settings,
            state,
            unknown_node: BTreeSet::new(),
            unnamable: BTreeSet::new(),
            saved,
        })
    }

    /// One pass: sends everything appended since the last one, then saves the state. A file
    /// the sink asks to retry waits for the next pass while the others are sent, and the pass
    /// then reports the retry; whatever was acknowledged is saved.
    pub async fn pass(&mut self, sink: &dyn LogSink) -> Result<PassReport, ShipError> {
        let mut report = PassReport::default();
        // The state file is kept in Ray's directory by default, so it cannot be saved either.
        if !self.settings.ray_dir.is_dir() {
            report.awaiting_ray = true;
            return Ok(report);
        }
        let outcome = self.send_all(sink, &mut report).await;
        self.save()?;
        outcome.map(|()| report)
    }

    async fn send_all(
        &mut self,
        sink: &dyn LogSink,
        report: &mut PassReport,
    ) -> Result<(), ShipError> {
        let sessions = sessions(&self.settings.ray_dir);
        // Sessions whose folder is gone (Ray's temp dir cleaned) are forgotten.
        if !sessions.is_empty() {
            self.state
                .sessions
                .retain(|name, _| sessions.iter().any(|(session, _)| session.as_str() == name));
        }
        // The first session the sink asked to retry, reported when the pass ends: the other
        // sessions are still sent.
        let mut retry = None;
        for (session, session_dir) in sessions {
            let Some(node_id) = self.node_of(&session, &session_dir) else {
                continue;
            };
            let found = self.files_of(&session_dir);
            let state = self.state.sessions.entry(session.to_string()).or_default();
            let mut batch = Batch::new(&session, &node_id, self.settings.body_bytes);
            if let Err(reason) = follow_session(state, &found, sink, &mut batch, report).await {
                retry.get_or_insert(ShipError::Retry {
                    session: session.to_string(),
                    reason,
                });
            }
        }
        retry.map_or(Ok(()), Err)
    }

    fn node_of(&mut self, session: &SessionName, dir: &Path) -> Option<NodeId> {
        if let Some(node_id) = &self.settings.node_id {
            return Some(node_id.clone());
        }
        match node_ids_in(dir).as_slice() {
            [only] => Some(only.clone()),
            found => {
                if self.unknown_node.insert(session.to_string()) {
                    tracing::warn!(
                        session = %session,
                        candidates = found.len(),
                        "cannot tell this node's id from the session's port files; \
                         pass --node-id (skipping the session until then)"
                    );
                }
                None
            }
        }
    }

    /// The session's log files by name, in `logs/` and then `logs/old/` (where Ray moves a dead
    /// worker's files): in that order, a file moved meanwhile is seen at least once. Then the
    /// cluster events Ray's processes write to `logs/events/` (`event_GCS.log`, …), whose
    /// names no file in `logs/` takes, which Ray's dashboard lists on its overview.
    fn files_of(&mut self, session_dir: &Path) -> BTreeMap<String, Found> {
        let mut found = BTreeMap::new();
        let logs = session_dir.join("logs");
        for dir in [logs.clone(), logs.join("old"), logs.join("events")] {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let Ok(meta) = entry.metadata() else { continue };
                if !meta.is_file() {
                    continue;
                }
                let path = entry.path();
                let name = entry.file_name().to_string_lossy().into_owned();
                if LogFileName::new(&name).is_err() {
                    if self.unnamable.insert(path.clone()) {
                        tracing::warn!(path = %path.display(), "skipping a log file whose name cannot be stored");
                    }
                    continue;
                }
                found.insert(
                    name,
                    Found {
                        path,
                        identity: identity(&meta),
                        len: meta.len(),
                    },
                );
            }
        }
        found
    }

    /// Writes the state file atomically (a temporary file renamed over it), when it changed.
    fn save(&mut self) -> Result<(), ShipError> {
        let path = &self.settings.state_file;
        let error = |source| ShipError::StateNotSaved {
            path: path.clone(),
            source,
        };
        let bytes = serde_json::to_vec(&self.state).map_err(|err| error(err.into()))?;
        if bytes == self.saved {
            return Ok(());
        }
        let temporary = path.with_extension("tmp");
        std::fs::write(&temporary, &bytes).map_err(error)?;
        std::fs::rename(&temporary, path).map_err(error)?;
        self.saved = bytes;
        Ok(())
    }
}

/// A piece in a batch: its file, offset and length, to match the answer against.
struct Sent {
    file: String,
    offset: u64,
    len: u64,
}

/// A request being filled with one session's pieces, and what to undo if it is not taken.
struct Batch<'a> {
    session: &'a SessionName,
    node_id: &'a NodeId,
    limit: usize,
    body: Body,
    /// Each piece, in the body's order.
    sent: Vec<Sent>,
    /// Each file with a piece in the batch, as it was before its first piece: restored when
    /// the request fails, so that nothing unacknowledged counts as sent. Only those files:
    /// what the others' scans found (a rotation, a truncation) stays found.
    before: BTreeMap<String, Followed>,
}

impl<'a> Batch<'a> {
    fn new(session: &'a SessionName, node_id: &'a NodeId, limit: usize) -> Self {
        Self {
            session,
            node_id,
            limit,
            body: Body::new(limit),
            sent: Vec::new(),
            before: BTreeMap::new(),
        }
    }

    /// Sends what the batch holds and applies the answer: a refused piece's file is not sent
    /// again. On failure, or an answer that does not match the pieces, each file with a piece
    /// in the batch is as it was before its first piece.
    async fn flush(
        &mut self,
        sink: &dyn LogSink,
        state: &mut SessionState,
        report: &mut PassReport,
    ) -> Result<(), String> {
        if self.body.is_empty() {
            return Ok(());
        }
        let body = std::mem::replace(&mut self.body, Body::new(self.limit)).into_bytes();
        let sent = std::mem::take(&mut self.sent);
        let before = std::mem::take(&mut self.before);
        let batch = LogBatch {
            session: self.session,
            node_id: self.node_id,
            body: &body,
        };
        let answered = sink
            .send(batch)
            .await
            .map_err(|SendError::Retry(reason)| reason)
            .and_then(|answer| matching(&sent, answer));
        let answer = match answered {
            Ok(answer) => answer,
            Err(reason) => {
                state.files.extend(before);
                return Err(reason);
            }
        };
        report.requests += 1;
        for (piece, answered) in sent.iter().zip(answer.pieces) {
            match answered.outcome {
                PieceOutcome::Stored { stored, .. } => {
                    report.pieces += 1;
                    report.bytes += stored as u64;
                }
                PieceOutcome::Queued { end } => {
                    report.pieces += 1;
                    report.bytes += end.saturating_sub(piece.offset);
                }
                PieceOutcome::Refused { reason } => {
                    tracing::error!(session = %self.session, file = %piece.file, %reason, "the endpoint refused this file; it is not sent again");
                    if let Some(followed) = state.files.get_mut(&piece.file) {
                        followed.refused = true;
                    }
                }
            }
        }
        Ok(())
    }
}

/// `answer` if it answers each of `sent`, in order: same file and offset, and a stored piece
/// ending where it did.
fn matching(sent: &[Sent], answer: BodyAnswer) -> Result<BodyAnswer, String> {
    if answer.pieces.len() != sent.len() {
        return Err(format!(
            "the endpoint answered {} pieces for {} sent",
            answer.pieces.len(),
            sent.len()
        ));
    }
    for (piece, answered) in sent.iter().zip(&answer.pieces) {
        let ends_right = match answered.outcome {
            PieceOutcome::Stored { end, .. } | PieceOutcome::Queued { end } => {
                end == piece.offset + piece.len
            }
            PieceOutcome::Refused { .. } => true,
        };
        if answered.file != piece.file || answered.offset != piece.offset || !ends_right {
            return Err(format!(
                "the endpoint's answer for {} at {} does not match the piece sent",
                answered.file, answered.offset
            ));
        }
    }
    Ok(answer)
}

/// Puts what each of a session's files appended into requests, filling each before sending it,
/// and sends the last one. Stops at the first request the sink asks to retry.
async fn follow_session(
    state: &mut SessionState,
    found: &BTreeMap<String, Found>,
    sink: &dyn LogSink,
    batch: &mut Batch<'_>,
    report: &mut PassReport,
) -> Result<(), String> {
    let by_identity: HashMap<Identity, &Found> =
        found.values().map(|file| (file.identity, file)).collect();
    follow_new_files(state, found);
    state
        .retired
        .retain(|identity| by_identity.contains_key(identity));
    let names: Vec<String> = state.files.keys().cloned().collect();
    for name in names {
        let Ok(file) = LogFileName::new(&name) else {
            continue;
        };
        let at_name = found.get(&name);
        report.files += 1;
        while let Some(followed) = state.files.get_mut(&name) {
            if followed.refused {
                break;
            }
            if followed.gone {
                match at_name {
                    // Missed by one scan, not deleted.
                    Some(next) if next.identity == followed.current.identity => {
                        followed.gone = false;
                    }
                    Some(next) => {
                        followed.current = Generation {
                            identity: next.identity,
                            base: followed.current.base + followed.current.shipped,
                            shipped: 0,
                        };
                        followed.gone = false;
                    }
                    None => break,
                }
            }
            let generation = followed.current;
            let on_disk = by_identity.get(&generation.identity);
            match next_piece(generation, on_disk.copied()) {
                Piece::Send { path, from, left } => {
                    let room = batch.body.room(&file);
                    if room == 0 {
                        batch.flush(sink, state, report).await?;
                        continue;
                    }
                    let len = usize::try_from(left).map_or(room, |left| left.min(room));
                    let bytes = match read_at(&path, generation.identity, from, len) {
                        Ok(bytes) if !bytes.is_empty() => bytes,
                        // Gone, shrunk or replaced since the scan: the next pass sees why.
                        _ => break,
                    };
                    if let (false, Some(followed)) =
                        (batch.before.contains_key(&name), state.files.get(&name))
                    {
                        batch.before.insert(name.clone(), followed.clone());
                    }
                    let offset = generation.base + from;
                    batch.body.push(FramedPiece {
                        file: &file,
                        offset,
                        bytes: &bytes,
                    });
                    batch.sent.push(Sent {
                        file: name.clone(),
                        offset,
                        len: bytes.len() as u64,
                    });
                    // Counted as sent once the request is answered; undone if it is not.
                    if let Some(followed) = state.files.get_mut(&name) {
                        followed.current.shipped = from + bytes.len() as u64;
                    }
                }
                Piece::Truncated => {
                    tracing::warn!(session = %batch.session, file = %name, "file truncated; following what is written from now on");
                    followed.current = Generation {
                        identity: generation.identity,
                        base: generation.base + generation.shipped,
                        shipped: 0,
                    };
                }
                Piece::CaughtUp { len } => {
                    // Caught up with this inode. When another file now has the name
                    // (rotation), it continues after every byte this one had.
                    match at_name {
                        Some(next) if next.identity != generation.identity => {
                            state.retired.insert(generation.identity);
                            followed.current = Generation {
                                identity: next.identity,
                                base: generation.base + len,
                                shipped: 0,
                            };
                        }
                        _ => break,
                    }
                }
                // Deleted (before it was all sent: what was not sent is lost).
                Piece::Gone => {
                    followed.gone = true;
                }
            }
        }
    }
    batch.flush(sink, state, report).await
}

/// Starts following the files nobody follows yet: new names, except copies left by rotation
/// (their inode was an earlier generation, or is still being finished under its first name).
fn follow_new_files(state: &mut SessionState, found: &BTreeMap<String, Found>) {
    let followed: BTreeSet<Identity> = state
        .files
        .values()
        .filter(|followed| !followed.gone)
        .map(|followed| followed.current.identity)
        .collect();
    for (name, file) in found {
        if state.files.contains_key(name)
            || followed.contains(&file.identity)
            || state.retired.contains(&file.identity)
        {
            continue;
        }
        state.files.insert(
            name.clone(),
            Followed {
                current: Generation {
                    identity: file.identity,
                    base: 0,
                    shipped: 0,
                },
                refused: false,
                gone: false,
            },
        );
    }
}

/// What to do next for one generation.
enum Piece {
    /// The file at `path` has `left` bytes past `from` to send.
    Send { path: PathBuf, from: u64, left: u64 },
    /// Everything of this inode (`len` bytes) is acknowledged.
    CaughtUp { len: u64 },
    /// The inode is shorter than what was sent: truncated in place.
    Truncated,
    /// The inode is no longer on disk.
    Gone,
}

fn next_piece(generation: Generation, on_disk: Option<&Found>) -> Piece {
    let Some(file) = on_disk else {
        return Piece::Gone;
    };
    if file.len < generation.shipped {
        return Piece::Truncated;
    }
    if file.len == generation.shipped {
        return Piece::CaughtUp { len: file.len };
    }
    Piece::Send {
        path: file.path.clone(),
        from: generation.shipped,
        left: file.len - generation.shipped,
    }
}

/// Up to `len` bytes from `from` of the file at `path`, if it is still the file the scan found
/// there (`expected`). A rotation between the scan and the read puts a new file at the path,
/// whose bytes must not be shipped as the old one's.
fn read_at(path: &Path, expected: Identity, from: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut file = File::open(path)?;
    if identity(&file.metadata()?) != expected {
        return Err(std::io::Error::other(
            "the file was replaced since the scan",
        ));
    }
    file.seek(SeekFrom::Start(from))?;
    let mut bytes = Vec::with_capacity(len);
    file.take(len as u64).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The sessions under `ray_dir` (`session_*` folders; the `session_latest` link is one of them
/// again), oldest first.
fn sessions(ray_dir: &Path) -> Vec<(SessionName, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(ray_dir) else {
        return Vec::new();
    };
    let mut sessions: Vec<(SessionName, PathBuf)> = entries
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
        .filter_map(|entry| {
            let name = SessionName::new(&entry.file_name().to_string_lossy()).ok()?;
            (name.as_str() != "session_latest").then(|| (name, entry.path()))
        })
        .collect();
    sessions.sort();
    sessions
}

/// The node ids Ray's port files in a session folder name (`{component}_port_{node_id}`).
pub(crate) fn node_ids_in(session_dir: &Path) -> Vec<NodeId> {
    let Ok(entries) = std::fs::read_dir(session_dir) else {
        return Vec::new();
    };
    let ids: BTreeSet<NodeId> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let (_, id) = name.rsplit_once("_port_")?;
            NodeId::new(id).ok()
        })
        .collect();
    ids.into_iter().collect()
}

fn identity(meta: &std::fs::Metadata) -> Identity {
    Identity {
        dev: meta.dev(),
        ino: meta.ino(),
    }
}

/// How long to wait after `failures` failed passes in a row: doubling from one second, at most
/// `ceiling`.
pub fn backoff(failures: u32, ceiling: Duration) -> Duration {
    Duration::from_secs(1u64 << failures.min(16)).min(ceiling)
}

#[cfg(test)]
mod tests;
