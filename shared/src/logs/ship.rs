//! The log shipper's logic (`afterglow ship-logs`, docs/architecture.md, "Logs"): follow every Ray
//! session's `logs/` folder on one node and send what is appended to each file, with its byte
//! offset.
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
//! chunks start, so anything sent again is recognised by the store ([`super::store`]). At most
//! one chunk ([`ShipSettings::chunk_bytes`]) is held in memory.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::keys::{LogFileName, NodeId, SessionName};

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
    /// Most bytes sent in one request.
    pub chunk_bytes: usize,
}

/// One piece of a log file, for a [`LogSink`].
#[derive(Clone, Copy, Debug)]
pub struct LogChunk<'a> {
    /// The session the file belongs to.
    pub session: &'a SessionName,
    /// The node the file is on.
    pub node_id: &'a NodeId,
    /// The file's name in the session's `logs/`.
    pub file: &'a LogFileName,
    /// Where `bytes` start in the (stored) file.
    pub offset: u64,
    /// The bytes.
    pub bytes: &'a [u8],
}

/// Why a [`LogSink`] did not store a chunk.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Worth retrying later: the endpoint is down, busy, or failed.
    #[error("{0}")]
    Retry(String),
    /// Refused for good (the endpoint said the request is wrong): the file is not sent again.
    #[error("{0}")]
    Refused(String),
}

/// Where chunks go: the ingest endpoint (`POST /v1/logs/{cluster}`), or a test's recorder.
#[async_trait]
pub trait LogSink: Send + Sync {
    /// Stores the chunk, returning once it is durable.
    async fn send(&self, chunk: LogChunk<'_>) -> Result<(), SendError>;
}

/// Why a pass stopped early.
#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    /// The sink asked to retry: the pass stops, and the next one resumes where this one did.
    #[error("sending {file} failed, will retry: {reason}")]
    Retry {
        /// The file being sent.
        file: String,
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
    /// Chunks acknowledged.
    pub chunks: usize,
    /// Bytes acknowledged.
    pub bytes: u64,
    /// Files followed, in every session.
    pub files: usize,
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

    /// One pass: sends everything appended since the last one, then saves the state. A sink
    /// that asks to retry stops the pass; what was acknowledged before is saved.
    pub async fn pass(&mut self, sink: &dyn LogSink) -> Result<PassReport, ShipError> {
        let mut report = PassReport::default();
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
        for (session, session_dir) in sessions {
            let Some(node_id) = self.node_of(&session, &session_dir) else {
                continue;
            };
            let found = self.files_of(&session_dir);
            let state = self.state.sessions.entry(session.to_string()).or_default();
            let by_identity: HashMap<Identity, &Found> =
                found.values().map(|file| (file.identity, file)).collect();
            follow_new_files(state, &found);
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
                    match next_piece(generation, on_disk.copied(), self.settings.chunk_bytes) {
                        Piece::Send { path, from, len } => {
                            let bytes = match read_at(&path, from, len) {
                                Ok(bytes) if !bytes.is_empty() => bytes,
                                // Gone or shrunk since the scan: the next pass sees why.
                                _ => break,
                            };
                            let chunk = LogChunk {
                                session: &session,
                                node_id: &node_id,
                                file: &file,
                                offset: generation.base + from,
                                bytes: &bytes,
                            };
                            match sink.send(chunk).await {
                                Ok(()) => {
                                    followed.current.shipped = from + bytes.len() as u64;
                                    report.chunks += 1;
                                    report.bytes += bytes.len() as u64;
                                }
                                Err(SendError::Refused(reason)) => {
                                    tracing::error!(session = %session, file = %name, %reason, "the endpoint refused this file; it is not sent again");
                                    followed.refused = true;
                                }
                                Err(SendError::Retry(reason)) => {
                                    return Err(ShipError::Retry {
                                        file: format!("{session}/{name}"),
                                        reason,
                                    });
                                }
                            }
                        }
                        Piece::Truncated => {
                            tracing::warn!(session = %session, file = %name, "file truncated; following what is written from now on");
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
        }
        Ok(())
    }

    /// The node id for `session`: the one configured, or the one its port files name.
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
    /// worker's files): in that order, a file moved meanwhile is seen at least once.
    fn files_of(&mut self, session_dir: &Path) -> BTreeMap<String, Found> {
        let mut found = BTreeMap::new();
        let logs = session_dir.join("logs");
        for dir in [logs.clone(), logs.join("old")] {
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
    /// Send `len` bytes of the file at `path` from `from`.
    Send {
        path: PathBuf,
        from: u64,
        len: usize,
    },
    /// Everything of this inode (`len` bytes) is acknowledged.
    CaughtUp { len: u64 },
    /// The inode is shorter than what was sent: truncated in place.
    Truncated,
    /// The inode is no longer on disk.
    Gone,
}

fn next_piece(generation: Generation, on_disk: Option<&Found>, chunk_bytes: usize) -> Piece {
    let Some(file) = on_disk else {
        return Piece::Gone;
    };
    if file.len < generation.shipped {
        return Piece::Truncated;
    }
    if file.len == generation.shipped {
        return Piece::CaughtUp { len: file.len };
    }
    let left = file.len - generation.shipped;
    Piece::Send {
        path: file.path.clone(),
        from: generation.shipped,
        len: usize::try_from(left).map_or(chunk_bytes, |left| left.min(chunk_bytes)),
    }
}

/// Up to `len` bytes of the file at `path` from `from`.
fn read_at(path: &Path, from: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut file = File::open(path)?;
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
fn node_ids_in(session_dir: &Path) -> Vec<NodeId> {
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
mod tests {
    use std::io::Write as _;
    use std::sync::Mutex;

    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    const SESSION: &str = "session_2026-11-23_10-00-00_000001_4242";

    fn node_id() -> String {
        "ab".repeat(28)
    }

    /// Stores chunks as the store would (each at its offset, re-sends checked), and can be
    /// told to fail.
    #[derive(Default)]
    struct Recorder {
        files: Mutex<BTreeMap<(String, String), Vec<u8>>>,
        sends: Mutex<usize>,
        /// The outcomes of the next sends (`false`: the endpoint is down); then all succeed.
        script: Mutex<std::collections::VecDeque<bool>>,
    }

    impl Recorder {
        fn file(&self, name: &str) -> Vec<u8> {
            self.files
                .lock()
                .ok()
                .and_then(|files| files.get(&(SESSION.to_owned(), name.to_owned())).cloned())
                .unwrap_or_default()
        }

        fn names(&self) -> Vec<String> {
            self.files
                .lock()
                .map(|files| files.keys().map(|(_, name)| name.clone()).collect())
                .unwrap_or_default()
        }

        fn sends(&self) -> usize {
            self.sends.lock().map(|sends| *sends).unwrap_or(0)
        }

        fn then(&self, outcomes: &[bool]) {
            if let Ok(mut script) = self.script.lock() {
                script.extend(outcomes);
            }
        }
    }

    #[async_trait]
    impl LogSink for Recorder {
        async fn send(&self, chunk: LogChunk<'_>) -> Result<(), SendError> {
            let up = self
                .script
                .lock()
                .map_err(|_| SendError::Retry("poisoned".into()))?
                .pop_front()
                .unwrap_or(true);
            if !up {
                return Err(SendError::Retry("endpoint down".into()));
            }
            if let Ok(mut sends) = self.sends.lock() {
                *sends += 1;
            }
            let mut files = self
                .files
                .lock()
                .map_err(|_| SendError::Retry("poisoned".into()))?;
            let stored = files
                .entry((chunk.session.to_string(), chunk.file.to_string()))
                .or_default();
            let offset =
                usize::try_from(chunk.offset).map_err(|_| SendError::Refused("offset".into()))?;
            // A gap or a different overlap would be a shipper bug: refuse, so tests see it.
            if offset > stored.len() {
                return Err(SendError::Refused(format!("gap before {offset}")));
            }
            let overlap = (stored.len() - offset).min(chunk.bytes.len());
            if stored.get(offset..offset + overlap) != chunk.bytes.get(..overlap) {
                return Err(SendError::Refused(format!("different bytes at {offset}")));
            }
            stored.extend_from_slice(chunk.bytes.get(overlap..).unwrap_or_default());
            Ok(())
        }
    }

    struct Node {
        _dir: tempfile::TempDir,
        ray_dir: PathBuf,
        logs: PathBuf,
    }

    impl Node {
        fn new() -> std::io::Result<Self> {
            let dir = tempfile::tempdir()?;
            let ray_dir = dir.path().join("ray");
            let session = ray_dir.join(SESSION);
            let logs = session.join("logs");
            std::fs::create_dir_all(logs.join("old"))?;
            std::fs::write(
                session.join(format!("metrics_agent_port_{}", node_id())),
                "4000",
            )?;
            std::fs::write(session.join("gcs_server_port_not_a_node"), "6379")?;
            Ok(Self {
                _dir: dir,
                ray_dir,
                logs,
            })
        }

        fn settings(&self, chunk_bytes: usize) -> ShipSettings {
            ShipSettings {
                ray_dir: self.ray_dir.clone(),
                node_id: None,
                state_file: self.ray_dir.join("afterglow-ship-logs.json"),
                chunk_bytes,
            }
        }

        fn append(&self, name: &str, text: &str) -> std::io::Result<()> {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.logs.join(name))?;
            file.write_all(text.as_bytes())
        }
    }

    #[tokio::test]
    async fn appended_bytes_are_sent_once_each_in_bounded_chunks() -> TestResult {
        let node = Node::new()?;
        let sink = Recorder::default();
        let mut shipper = Shipper::new(node.settings(4))?;
        node.append("worker-a-01000000-1.out", "hello\n")?;
        let first = shipper.pass(&sink).await?;
        assert_eq!((first.chunks, first.bytes), (2, 6));
        node.append("worker-a-01000000-1.out", "world\n")?;
        node.append("raylet.out", "started\n")?;
        shipper.pass(&sink).await?;
        let idle = shipper.pass(&sink).await?;
        assert_eq!(idle.chunks, 0);
        assert_eq!(sink.file("worker-a-01000000-1.out"), b"hello\nworld\n");
        assert_eq!(sink.file("raylet.out"), b"started\n");
        assert_eq!(sink.sends(), 2 + 2 + 2);
        Ok(())
    }

    #[tokio::test]
    async fn a_restarted_shipper_neither_resends_nor_skips() -> TestResult {
        let node = Node::new()?;
        let sink = Recorder::default();
        node.append("worker-a-01000000-1.out", "before\n")?;
        Shipper::new(node.settings(1024))?.pass(&sink).await?;
        node.append("worker-a-01000000-1.out", "after\n")?;
        let mut restarted = Shipper::new(node.settings(1024))?;
        let report = restarted.pass(&sink).await?;
        assert_eq!(report.bytes, 6, "only the new line");
        assert_eq!(sink.file("worker-a-01000000-1.out"), b"before\nafter\n");
        Ok(())
    }

    #[tokio::test]
    async fn while_the_endpoint_is_down_nothing_is_acknowledged_and_then_all_arrives() -> TestResult
    {
        let node = Node::new()?;
        let sink = Recorder::default();
        let mut shipper = Shipper::new(node.settings(3))?;
        node.append("worker-a-01000000-1.out", "abcdefgh")?;
        sink.then(&[false]);
        assert!(matches!(
            shipper.pass(&sink).await,
            Err(ShipError::Retry { .. })
        ));
        assert_eq!(sink.sends(), 0);
        // Down again after the first chunk: that one stays acknowledged (across a restart
        // too), the rest waits.
        sink.then(&[true, false]);
        assert!(shipper.pass(&sink).await.is_err());
        assert_eq!(sink.file("worker-a-01000000-1.out"), b"abc");
        let mut restarted = Shipper::new(node.settings(3))?;
        assert_eq!(restarted.pass(&sink).await?.chunks, 2);
        assert_eq!(sink.file("worker-a-01000000-1.out"), b"abcdefgh");
        assert_eq!(sink.sends(), 3, "no chunk was sent twice");
        Ok(())
    }

    #[tokio::test]
    async fn a_file_moved_to_old_continues_where_it_was() -> TestResult {
        let node = Node::new()?;
        let sink = Recorder::default();
        let mut shipper = Shipper::new(node.settings(1024))?;
        let name = "worker-b-01000000-2.err";
        node.append(name, "first\n")?;
        shipper.pass(&sink).await?;
        node.append(name, "last words\n")?;
        std::fs::rename(node.logs.join(name), node.logs.join("old").join(name))?;
        shipper.pass(&sink).await?;
        assert_eq!(sink.file(name), b"first\nlast words\n");
        assert_eq!(sink.names(), vec![name.to_owned()]);
        Ok(())
    }

    #[tokio::test]
    async fn a_rotated_file_is_finished_and_the_new_one_follows_it() -> TestResult {
        let node = Node::new()?;
        let sink = Recorder::default();
        let mut shipper = Shipper::new(node.settings(1024))?;
        node.append("python-core-worker-c_3.log", "gen1 a\n")?;
        shipper.pass(&sink).await?;
        // Written, rotated and replaced between two passes.
        node.append("python-core-worker-c_3.log", "gen1 b\n")?;
        std::fs::rename(
            node.logs.join("python-core-worker-c_3.log"),
            node.logs.join("python-core-worker-c_3.log.1"),
        )?;
        node.append("python-core-worker-c_3.log", "gen2\n")?;
        shipper.pass(&sink).await?;
        shipper.pass(&sink).await?;
        assert_eq!(
            sink.file("python-core-worker-c_3.log"),
            b"gen1 a\ngen1 b\ngen2\n"
        );
        assert_eq!(
            sink.names(),
            vec!["python-core-worker-c_3.log".to_owned()],
            "the rotated copy is not a file of its own"
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_truncated_file_continues_after_what_was_sent() -> TestResult {
        let node = Node::new()?;
        let sink = Recorder::default();
        let mut shipper = Shipper::new(node.settings(1024))?;
        node.append("dashboard.log", "long first version\n")?;
        shipper.pass(&sink).await?;
        std::fs::write(node.logs.join("dashboard.log"), "new\n")?;
        shipper.pass(&sink).await?;
        shipper.pass(&sink).await?;
        assert_eq!(sink.file("dashboard.log"), b"long first version\nnew\n");
        Ok(())
    }

    #[tokio::test]
    async fn new_sessions_are_followed_and_the_node_id_comes_from_port_files() -> TestResult {
        let node = Node::new()?;
        let sink = Recorder::default();
        let mut shipper = Shipper::new(node.settings(1024))?;
        shipper.pass(&sink).await?;
        let later = node.ray_dir.join("session_2026-11-23_11-00-00_000002_4343");
        std::fs::create_dir_all(later.join("logs"))?;
        std::fs::write(later.join("logs").join("raylet.out"), "unknown node\n")?;
        // No port file yet: the node cannot be told, so nothing is sent for that session.
        assert_eq!(shipper.pass(&sink).await?.chunks, 0);
        std::fs::write(
            later.join(format!("runtime_env_agent_port_{}", node_id())),
            "1",
        )?;
        assert_eq!(shipper.pass(&sink).await?.chunks, 1);
        Ok(())
    }

    #[test]
    fn backoff_doubles_up_to_its_ceiling() {
        let ceiling = Duration::from_secs(30);
        let waits: Vec<u64> = (0..7).map(|n| backoff(n, ceiling).as_secs()).collect();
        assert_eq!(waits, vec![1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(backoff(u32::MAX, ceiling), ceiling);
    }
}
