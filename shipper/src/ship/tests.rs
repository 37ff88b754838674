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
async fn a_shipper_started_before_ray_waits_for_its_directory() -> TestResult {
    let dir = tempfile::tempdir()?;
    let ray_dir = dir.path().join("ray");
    let settings = ShipSettings {
        ray_dir: ray_dir.clone(),
        node_id: None,
        state_file: ray_dir.join("afterglow-ship-logs.json"),
        chunk_bytes: 1024,
    };
    let sink = Recorder::default();
    let mut shipper = Shipper::new(settings)?;
    let waiting = shipper.pass(&sink).await?;
    assert!(waiting.awaiting_ray);
    assert_eq!(waiting.chunks, 0);
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
async fn a_file_the_endpoint_cannot_take_now_holds_no_other_back() -> TestResult {
    let node = Node::new()?;
    let sink = Recorder::default();
    let mut shipper = Shipper::new(node.settings(1024))?;
    node.append("worker-a-01000000-1.out", "a\n")?;
    node.append("worker-b-01000000-2.out", "b\n")?;
    // Files are sent in name order: the first send, worker-a's, is asked to retry.
    sink.then(&[false]);
    let failed = shipper.pass(&sink).await;
    assert!(
        matches!(failed, Err(ShipError::Retry { ref file, .. }) if file.ends_with("worker-a-01000000-1.out")),
        "{failed:?}"
    );
    assert_eq!(sink.file("worker-b-01000000-2.out"), b"b\n");
    assert_eq!(sink.file("worker-a-01000000-1.out"), b"");
    shipper.pass(&sink).await?;
    assert_eq!(sink.file("worker-a-01000000-1.out"), b"a\n");
    assert_eq!(sink.file("worker-b-01000000-2.out"), b"b\n");
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
async fn while_the_endpoint_is_down_nothing_is_acknowledged_and_then_all_arrives() -> TestResult {
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
