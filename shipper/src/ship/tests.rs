use std::io::Write as _;
use std::sync::Mutex;

use super::*;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const SESSION: &str = "session_2026-11-23_10-00-00_000001_4242";

fn node_id() -> String {
    "ab".repeat(28)
}

/// Stores each piece as the store would (at its offset, a gap or a different overlap refused),
/// answers per piece, and can be told to fail a request or to refuse a file.
#[derive(Default)]
struct Recorder {
    files: Mutex<BTreeMap<(String, String), Vec<u8>>>,
    /// Pieces per request answered, in order.
    requests: Mutex<Vec<usize>>,
    /// The outcomes of the next requests (`false`: the endpoint is down); then all succeed.
    script: Mutex<std::collections::VecDeque<bool>>,
    /// Files whose pieces are refused.
    refuse: Mutex<BTreeSet<String>>,
    /// Answers pieces `queued` (an endpoint with a log queue), not `stored`.
    queues: std::sync::atomic::AtomicBool,
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

    fn requests(&self) -> Vec<usize> {
        self.requests
            .lock()
            .map(|requests| requests.clone())
            .unwrap_or_default()
    }

    fn then(&self, outcomes: &[bool]) {
        if let Ok(mut script) = self.script.lock() {
            script.extend(outcomes);
        }
    }

    fn refuse(&self, name: &str) {
        if let Ok(mut refuse) = self.refuse.lock() {
            refuse.insert(name.to_owned());
        }
    }

    fn store(&self, session: &str, piece: &crate::frames::ReadPiece<'_>) -> PieceOutcome {
        let refused = |reason: String| PieceOutcome::Refused { reason };
        if self
            .refuse
            .lock()
            .is_ok_and(|refuse| refuse.contains(piece.file.as_str()))
        {
            return refused("told to refuse".into());
        }
        let Ok(mut files) = self.files.lock() else {
            return refused("poisoned".into());
        };
        let stored = files
            .entry((session.to_owned(), piece.file.to_string()))
            .or_default();
        let Ok(offset) = usize::try_from(piece.offset) else {
            return refused("offset".into());
        };
        // A gap or a different overlap would be a shipper bug: refuse, so tests see it.
        if offset > stored.len() {
            return refused(format!("gap before {offset}"));
        }
        let overlap = (stored.len() - offset).min(piece.bytes.len());
        if stored.get(offset..offset + overlap) != piece.bytes.get(..overlap) {
            return refused(format!("different bytes at {offset}"));
        }
        let new = piece.bytes.get(overlap..).unwrap_or_default();
        stored.extend_from_slice(new);
        let end = piece.offset + piece.bytes.len() as u64;
        if self.queues.load(std::sync::atomic::Ordering::Relaxed) {
            return PieceOutcome::Queued { end };
        }
        PieceOutcome::Stored {
            stored: new.len(),
            end,
        }
    }
}

#[async_trait]
impl LogSink for Recorder {
    async fn send(&self, batch: LogBatch<'_>) -> Result<BodyAnswer, SendError> {
        let up = self
            .script
            .lock()
            .map_err(|_| SendError::Retry("poisoned".into()))?
            .pop_front()
            .unwrap_or(true);
        if !up {
            return Err(SendError::Retry("endpoint down".into()));
        }
        let pieces = crate::frames::read_body(batch.body)
            .map_err(|err| SendError::Retry(format!("unreadable body: {err}")))?;
        if let Ok(mut requests) = self.requests.lock() {
            requests.push(pieces.len());
        }
        let session = batch.session.to_string();
        Ok(BodyAnswer {
            pieces: pieces
                .iter()
                .map(|piece| crate::frames::PieceAnswer {
                    file: piece.file.to_string(),
                    offset: piece.offset,
                    outcome: self.store(&session, piece),
                })
                .collect(),
        })
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

    fn settings(&self, body_bytes: usize) -> ShipSettings {
        ShipSettings {
            ray_dir: self.ray_dir.clone(),
            node_id: None,
            state_file: self.ray_dir.join("afterglow-ship-logs.json"),
            body_bytes,
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

/// The smallest body: bounds are tested with it.
const SMALL: usize = crate::frames::MIN_BODY_BYTES;

#[tokio::test]
async fn appended_bytes_are_sent_once_each_in_bounded_bodies() -> TestResult {
    let node = Node::new()?;
    let sink = Recorder::default();
    let mut shipper = Shipper::new(node.settings(SMALL))?;
    let long = "x".repeat(2_500);
    node.append("worker-a-01000000-1.out", &long)?;
    let first = shipper.pass(&sink).await?;
    assert_eq!(first.bytes, 2_500);
    assert_eq!(
        first.requests, 3,
        "2 500 bytes take three bodies of {SMALL}"
    );
    node.append("worker-a-01000000-1.out", "world\n")?;
    node.append("raylet.out", "started\n")?;
    let second = shipper.pass(&sink).await?;
    assert_eq!((second.requests, second.pieces), (1, 2));
    let idle = shipper.pass(&sink).await?;
    assert_eq!(idle.requests, 0, "an idle node sends nothing");
    assert_eq!(
        sink.file("worker-a-01000000-1.out"),
        format!("{long}world\n").as_bytes()
    );
    assert_eq!(sink.file("raylet.out"), b"started\n");
    assert_eq!(sink.requests(), vec![1, 1, 1, 2]);
    Ok(())
}

#[tokio::test]
async fn one_request_per_pass_carries_every_file_that_grew() -> TestResult {
    let node = Node::new()?;
    let sink = Recorder::default();
    let mut shipper = Shipper::new(node.settings(1024 * 1024))?;
    let names: Vec<String> = (0..32)
        .map(|worker| format!("worker-{worker:02x}-01000000-{worker}.out"))
        .collect();
    for pass in 0..3 {
        for name in &names {
            node.append(name, &format!("{name} line {pass}\n"))?;
        }
        let report = shipper.pass(&sink).await?;
        assert_eq!((report.requests, report.pieces), (1, 32));
    }
    shipper.pass(&sink).await?;
    assert_eq!(
        sink.requests(),
        vec![32, 32, 32],
        "one request per pass, none idle"
    );
    for name in &names {
        let expected: String = (0..3).map(|pass| format!("{name} line {pass}\n")).collect();
        assert_eq!(sink.file(name), expected.as_bytes());
    }
    Ok(())
}

#[tokio::test]
async fn a_shipper_started_before_ray_waits_for_its_directory() -> TestResult {
    let dir = tempfile::tempdir()?;
    let ray_dir = dir.path().join("ray");
    let settings = ShipSettings {
        ray_dir: ray_dir.clone(),
        node_id: None,
        state_file: ray_dir.join("afterglow-ship-logs.json"),
        body_bytes: SMALL,
    };
    let sink = Recorder::default();
    let mut shipper = Shipper::new(settings)?;
    let waiting = shipper.pass(&sink).await?;
    assert!(waiting.awaiting_ray);
    assert_eq!(waiting.requests, 0);
    assert!(!ray_dir.exists(), "the shipper made Ray's directory itself");

    // `ray start` makes the directory and a session: the same shipper ships it.
    let logs = ray_dir.join(SESSION).join("logs");
    std::fs::create_dir_all(&logs)?;
    std::fs::write(
        ray_dir
            .join(SESSION)
            .join(format!("metrics_agent_port_{}", node_id())),
        "4000",
    )?;
    std::fs::write(logs.join("worker-a-01000000-1.out"), "hello\n")?;
    let shipped = shipper.pass(&sink).await?;
    assert!(!shipped.awaiting_ray);
    assert_eq!(sink.file("worker-a-01000000-1.out"), b"hello\n");
    assert!(ray_dir.join("afterglow-ship-logs.json").is_file());
    Ok(())
}

#[tokio::test]
async fn a_refused_file_holds_no_other_back_and_is_not_sent_again() -> TestResult {
    let node = Node::new()?;
    let sink = Recorder::default();
    let mut shipper = Shipper::new(node.settings(SMALL))?;
    node.append("worker-a-01000000-1.out", "a\n")?;
    node.append("worker-b-01000000-2.out", "b\n")?;
    sink.refuse("worker-a-01000000-1.out");
    let report = shipper.pass(&sink).await?;
    assert_eq!((report.requests, report.pieces), (1, 1));
    assert_eq!(sink.file("worker-b-01000000-2.out"), b"b\n");
    node.append("worker-a-01000000-1.out", "more a\n")?;
    node.append("worker-b-01000000-2.out", "more b\n")?;
    shipper.pass(&sink).await?;
    assert_eq!(
        sink.requests(),
        vec![2, 1],
        "the refused file is not sent again"
    );
    assert_eq!(sink.file("worker-b-01000000-2.out"), b"b\nmore b\n");
    Ok(())
}

#[tokio::test]
async fn a_request_the_endpoint_cannot_take_now_is_sent_whole_later() -> TestResult {
    let node = Node::new()?;
    let sink = Recorder::default();
    let mut shipper = Shipper::new(node.settings(SMALL))?;
    node.append("worker-a-01000000-1.out", "a\n")?;
    node.append("worker-b-01000000-2.out", "b\n")?;
    sink.then(&[false]);
    let failed = shipper.pass(&sink).await;
    assert!(
        matches!(failed, Err(ShipError::Retry { ref session, .. }) if session == SESSION),
        "{failed:?}"
    );
    assert!(sink.names().is_empty());
    shipper.pass(&sink).await?;
    assert_eq!(sink.file("worker-a-01000000-1.out"), b"a\n");
    assert_eq!(sink.file("worker-b-01000000-2.out"), b"b\n");
    assert_eq!(sink.requests(), vec![2]);
    Ok(())
}

#[test]
fn a_file_replaced_between_scan_and_read_is_not_read_as_the_scanned_one() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("worker-a-01000000-1.out");
    std::fs::write(&path, "old generation\n")?;
    let scanned = identity(&std::fs::metadata(&path)?);
    assert_eq!(read_at(&path, scanned, 0, 64)?, b"old generation\n");
    // Rotated: the old file moved away, a new one created under its name.
    std::fs::rename(&path, dir.path().join("worker-a-01000000-1.out.1"))?;
    std::fs::write(&path, "new generation\n")?;
    assert!(
        read_at(&path, scanned, 0, 64).is_err(),
        "the new file's bytes were read as the scanned file's"
    );
    Ok(())
}

#[tokio::test]
async fn a_queued_piece_is_acknowledged_like_a_stored_one() -> TestResult {
    let node = Node::new()?;
    let sink = Recorder {
        queues: true.into(),
        ..Recorder::default()
    };
    node.append("worker-a-01000000-1.out", "one\n")?;
    let first = Shipper::new(node.settings(SMALL))?.pass(&sink).await?;
    assert_eq!((first.pieces, first.bytes), (1, 4));
    node.append("worker-a-01000000-1.out", "two\n")?;
    let mut restarted = Shipper::new(node.settings(SMALL))?;
    let second = restarted.pass(&sink).await?;
    assert_eq!(second.bytes, 4, "only the new line, after a restart too");
    assert_eq!(
        restarted.pass(&sink).await?.requests,
        0,
        "nothing sent again"
    );
    assert_eq!(sink.file("worker-a-01000000-1.out"), b"one\ntwo\n");
    Ok(())
}

#[tokio::test]
async fn a_restarted_shipper_neither_resends_nor_skips() -> TestResult {
    let node = Node::new()?;
    let sink = Recorder::default();
    node.append("worker-a-01000000-1.out", "before\n")?;
    Shipper::new(node.settings(SMALL))?.pass(&sink).await?;
    node.append("worker-a-01000000-1.out", "after\n")?;
    let mut restarted = Shipper::new(node.settings(SMALL))?;
    let report = restarted.pass(&sink).await?;
    assert_eq!(report.bytes, 6, "only the new line");
    assert_eq!(sink.file("worker-a-01000000-1.out"), b"before\nafter\n");
    Ok(())
}

#[tokio::test]
async fn a_shipper_that_lost_its_state_resends_only_what_the_store_finds_equal() -> TestResult {
    let node = Node::new()?;
    let sink = Recorder::default();
    node.append("worker-a-01000000-1.out", "before\n")?;
    Shipper::new(node.settings(SMALL))?.pass(&sink).await?;
    std::fs::remove_file(node.ray_dir.join("afterglow-ship-logs.json"))?;
    node.append("worker-a-01000000-1.out", "after\n")?;
    let report = Shipper::new(node.settings(SMALL))?.pass(&sink).await?;
    assert_eq!(report.pieces, 1, "the file again, from its start");
    assert_eq!(report.bytes, 6, "the store kept only the new line");
    assert_eq!(sink.file("worker-a-01000000-1.out"), b"before\nafter\n");
    Ok(())
}

#[tokio::test]
async fn while_the_endpoint_is_down_nothing_is_acknowledged_and_then_all_arrives() -> TestResult {
    let node = Node::new()?;
    let sink = Recorder::default();
    let mut shipper = Shipper::new(node.settings(SMALL))?;
    let text = "abcdefgh".repeat(300);
    node.append("worker-a-01000000-1.out", &text)?;
    sink.then(&[false]);
    assert!(matches!(
        shipper.pass(&sink).await,
        Err(ShipError::Retry { .. })
    ));
    assert!(sink.requests().is_empty());
    // Down again after the first request: that one stays acknowledged (across a restart
    // too), the rest waits.
    sink.then(&[true, false]);
    assert!(shipper.pass(&sink).await.is_err());
    let first = sink.file("worker-a-01000000-1.out").len();
    assert!(first > 0 && first < text.len());
    let mut restarted = Shipper::new(node.settings(SMALL))?;
    assert_eq!(restarted.pass(&sink).await?.requests, 2);
    assert_eq!(sink.file("worker-a-01000000-1.out"), text.as_bytes());
    assert_eq!(sink.requests(), vec![1, 1, 1], "no piece was sent twice");
    Ok(())
}

#[tokio::test]
async fn a_failed_request_undoes_only_what_it_carried() -> TestResult {
    let node = Node::new()?;
    let sink = Recorder::default();
    let mut shipper = Shipper::new(node.settings(SMALL))?;
    node.append("a.log", "a\n")?;
    node.append("b.log", "long first version\n")?;
    shipper.pass(&sink).await?;
    // b.log is truncated and rewritten while a.log grows; the request carrying both fails.
    node.append("a.log", "a again\n")?;
    std::fs::write(node.logs.join("b.log"), "new\n")?;
    sink.then(&[false]);
    assert!(shipper.pass(&sink).await.is_err());
    // During the outage b.log grows past where its first version ended: the truncation must
    // not be forgotten, or its new bytes would be taken as the old version's continuation.
    node.append("b.log", &format!("{}\n", "x".repeat(30)))?;
    shipper.pass(&sink).await?;
    assert_eq!(sink.file("a.log"), b"a\na again\n");
    assert_eq!(
        sink.file("b.log"),
        format!("long first version\nnew\n{}\n", "x".repeat(30)).as_bytes()
    );
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
async fn the_cluster_events_are_shipped_by_their_names() -> TestResult {
    let node = Node::new()?;
    let sink = Recorder::default();
    let mut shipper = Shipper::new(node.settings(1024))?;
    let events = node.logs.join("events");
    std::fs::create_dir_all(&events)?;
    let line = r#"{"event_id":"a1","source_type":"JOBS","message":"Started a ray job x."}"#;
    std::fs::write(events.join("event_JOBS.log"), format!("{line}\n"))?;
    node.append("raylet.out", "started\n")?;
    shipper.pass(&sink).await?;
    assert_eq!(sink.file("event_JOBS.log"), format!("{line}\n").as_bytes());
    assert_eq!(sink.names(), vec!["event_JOBS.log", "raylet.out"]);
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
    assert_eq!(shipper.pass(&sink).await?.pieces, 0);
    std::fs::write(
        later.join(format!("runtime_env_agent_port_{}", node_id())),
        "1",
    )?;
    assert_eq!(shipper.pass(&sink).await?.pieces, 1);
    Ok(())
}

#[test]
fn backoff_doubles_up_to_its_ceiling() {
    let ceiling = Duration::from_secs(30);
    let waits: Vec<u64> = (0..7).map(|n| backoff(n, ceiling).as_secs()).collect();
    assert_eq!(waits, vec![1, 2, 4, 8, 16, 30, 30]);
    assert_eq!(backoff(u32::MAX, ceiling), ceiling);
}
