//! Submitted jobs (`ray job submit`), which Ray 2.60 exports no event for: on the head node the
//! shipper reads Ray's job API (`GET /api/jobs/`) every pass and sends what changed of each
//! submission as Ray's own `SUBMISSION_JOB_DEFINITION_EVENT` and
//! `SUBMISSION_JOB_LIFECYCLE_EVENT` to the cluster's export URL, where a Ray that emits them
//! would send them. Drivers are left out: Ray exports them itself.
//!
//! Each event's id is made of what it says, so a re-sent event (after a restart, which forgets
//! what was sent) is the same event again. A state's time is Ray's own where Ray keeps one
//! (`start_time` for `PENDING`, `end_time` for the state a job ends in) and the time it was
//! first seen otherwise (`RUNNING`).

use std::collections::{BTreeMap, HashMap};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;
use serde_json::{Value as Json, json};

use crate::names::SessionName;

/// What Ray's job API says of one job (the fields of its `JobDetails` that are sent).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct JobDetails {
    /// `SUBMISSION` or `DRIVER`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The submission id; `None` for a driver.
    pub submission_id: Option<String>,
    /// `PENDING`, `RUNNING`, `STOPPED`, `SUCCEEDED` or `FAILED`.
    pub status: String,
    /// The entrypoint command.
    pub entrypoint: String,
    /// Ray's message for the status.
    pub message: Option<String>,
    /// Ray's error category, when failed.
    pub error_type: Option<String>,
    /// When it was submitted (ms).
    pub start_time: Option<i64>,
    /// When it ended (ms).
    pub end_time: Option<i64>,
    /// The user's metadata.
    pub metadata: Option<BTreeMap<String, String>>,
    /// The runtime environment, as submitted.
    pub runtime_env: Option<Json>,
    /// The node running the driver (hex).
    pub driver_node_id: Option<String>,
    /// The driver's exit code, once it exited.
    pub driver_exit_code: Option<i32>,
}

/// Ray's token for its dashboard when its token authentication is on (`RAY_AUTH_MODE=token`),
/// found where Ray's own clients look: `RAY_AUTH_TOKEN` (`env_token`), else the file
/// `RAY_AUTH_TOKEN_PATH` names (`token_path`), else `~/.ray/auth_token` under `home`.
pub fn ray_auth_token(
    env_token: Option<String>,
    token_path: Option<std::path::PathBuf>,
    home: Option<std::path::PathBuf>,
) -> Option<String> {
    let nonempty = |token: String| {
        let token = token.trim().to_owned();
        (!token.is_empty()).then_some(token)
    };
    if let Some(token) = env_token.and_then(nonempty) {
        return Some(token);
    }
    let path = token_path.or_else(|| home.map(|home| home.join(".ray").join("auth_token")))?;
    std::fs::read_to_string(path).ok().and_then(nonempty)
}

/// The session `session_latest` points at under `ray_dir`: the one Ray's job API speaks of.
pub fn latest_session(ray_dir: &std::path::Path) -> Option<SessionName> {
    let target = std::fs::read_link(ray_dir.join("session_latest")).ok()?;
    SessionName::new(&target.file_name()?.to_string_lossy()).ok()
}

/// States a job does not leave.
const TERMINAL: [&str; 3] = ["STOPPED", "SUCCEEDED", "FAILED"];

/// What was last sent of one submission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    status: String,
    message: Option<String>,
    driver_exit_code: Option<i32>,
}

impl Sent {
    fn of(job: &JobDetails) -> Self {
        Self {
            status: job.status.clone(),
            message: job.message.clone(),
            driver_exit_code: job.driver_exit_code,
        }
    }
}

/// One submission's events to send, and what is sent once they are stored.
#[derive(Clone, Debug)]
pub struct Change {
    /// The submission id.
    pub submission_id: String,
    /// Ray events, in Ray's JSON.
    pub events: Vec<Json>,
    /// What is then known to be sent.
    pub sent: Sent,
}

/// What has been sent of each submission of the session being followed.
#[derive(Debug, Default)]
pub struct SubmissionLedger {
    session: Option<SessionName>,
    sent: HashMap<String, Sent>,
}

impl SubmissionLedger {
    /// The events that tell what changed in `jobs` (Ray's `GET /api/jobs/` answer) since they
    /// were last sent, for `session`, at `now_ms`. A new session starts afresh.
    pub fn changes(
        &mut self,
        session: &SessionName,
        jobs: &[JobDetails],
        now_ms: i64,
    ) -> Vec<Change> {
        if self.session.as_ref() != Some(session) {
            self.session = Some(session.clone());
            self.sent.clear();
        }
        jobs.iter()
            .filter(|job| job.kind == "SUBMISSION")
            .filter_map(|job| {
                let id = job.submission_id.as_deref().filter(|id| !id.is_empty())?;
                let before = self.sent.get(id);
                let now = Sent::of(job);
                if before == Some(&now) {
                    return None;
                }
                let mut events = Vec::new();
                let mut transitions = Vec::new();
                if before.is_none() {
                    events.push(definition(session, id, job, now_ms));
                    if job.status != "PENDING" {
                        let at = job.start_time.unwrap_or(now_ms);
                        transitions.push(transition("PENDING", at, &JobDetails::default()));
                    }
                }
                let at = if job.status == "PENDING" {
                    job.start_time
                } else if TERMINAL.contains(&job.status.as_str()) {
                    job.end_time
                } else {
                    None
                };
                transitions.push(transition(&job.status, at.unwrap_or(now_ms), job));
                let last = at.unwrap_or(now_ms);
                events.push(event(
                    session,
                    "SUBMISSION_JOB_LIFECYCLE_EVENT",
                    "submissionJobLifecycleEvent",
                    &format!("{id}/{}/{last}", job.status),
                    last,
                    json!({"submissionId": id, "stateTransitions": transitions}),
                ));
                Some(Change {
                    submission_id: id.to_owned(),
                    events,
                    sent: now,
                })
            })
            .collect()
    }

    /// Records that `change` was stored.
    pub fn sent(&mut self, change: Change) {
        self.sent.insert(change.submission_id, change.sent);
    }
}

/// The definition event of a submission.
fn definition(session: &SessionName, id: &str, job: &JobDetails, now_ms: i64) -> Json {
    let at = job.start_time.unwrap_or(now_ms);
    let runtime_env = job
        .runtime_env
        .as_ref()
        .filter(|env| env.as_object().is_some_and(|env| !env.is_empty()))
        .map(Json::to_string)
        .unwrap_or_default();
    event(
        session,
        "SUBMISSION_JOB_DEFINITION_EVENT",
        "submissionJobDefinitionEvent",
        &format!("{id}/definition"),
        at,
        json!({
            "submissionId": id,
            "entrypoint": job.entrypoint,
            "config": {
                "serializedRuntimeEnv": runtime_env,
                "metadata": job.metadata.clone().unwrap_or_default(),
            },
        }),
    )
}

/// One state transition, in Ray's JSON; `job` gives the details of the state it is in now.
fn transition(state: &str, at_ms: i64, job: &JobDetails) -> Json {
    let mut transition = json!({"state": state, "timestamp": rfc3339(at_ms)});
    let fields = [
        ("message", job.message.clone().map(Json::from)),
        ("errorType", job.error_type.clone().map(Json::from)),
        (
            "driverNodeId",
            job.driver_node_id
                .as_deref()
                .and_then(|hex| hex::decode(hex).ok())
                .map(|bytes| Json::from(STANDARD.encode(bytes))),
        ),
        ("driverExitCode", job.driver_exit_code.map(Json::from)),
    ];
    for (name, value) in fields {
        if let Some(value) = value {
            transition[name] = value;
        }
    }
    transition
}

/// A Ray event envelope around `payload`, its id made of `identity`.
fn event(
    session: &SessionName,
    event_type: &str,
    payload_key: &str,
    identity: &str,
    at_ms: i64,
    payload: Json,
) -> Json {
    let mut event = json!({
        "eventId": STANDARD.encode(format!("afterglow-ship-logs/{identity}")),
        "sourceType": "JOBS",
        "eventType": event_type,
        "timestamp": rfc3339(at_ms),
        "severity": "INFO",
        "message": "",
        "sessionName": session.as_str(),
    });
    event[payload_key] = payload;
    event
}

/// Milliseconds since the epoch as RFC 3339 (UTC), as Ray's events carry times.
fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ray 2.60's `GET /api/jobs/` after three submissions that called `ray.init()` (one
    /// succeeded, one exited 3, one stopped), one that did not, and no plain driver.
    const CAPTURED: &str = include_str!("../../tests/fixtures/ray-2.60/jobs/api_jobs.json");

    fn session() -> SessionName {
        SessionName::new("session_2026-12-03_13-15-00_000000_1").expect("a session name")
    }

    #[test]
    fn each_submission_is_sent_once_with_its_states_at_rays_times() -> anyhow::Result<()> {
        let jobs: Vec<JobDetails> = serde_json::from_str(CAPTURED)?;
        let mut ledger = SubmissionLedger::default();
        let changes = ledger.changes(&session(), &jobs, 1);
        let ids: Vec<&str> = changes.iter().map(|c| c.submission_id.as_str()).collect();
        assert_eq!(ids, ["cap-noinit", "cap-fail", "cap-ok", "cap-stop"]);
        let failed = &changes[1].events;
        assert_eq!(failed.len(), 2);
        assert_eq!(failed[0]["eventType"], "SUBMISSION_JOB_DEFINITION_EVENT");
        let config = &failed[0]["submissionJobDefinitionEvent"]["config"];
        assert_eq!(config["metadata"], json!({"owner": "capture"}));
        assert_eq!(
            config["serializedRuntimeEnv"],
            r#"{"env_vars":{"SECRET_TOKEN":"hunter2"}}"#
        );
        let transitions = &failed[1]["submissionJobLifecycleEvent"]["stateTransitions"];
        assert_eq!(transitions[0]["state"], "PENDING");
        assert_eq!(transitions[0]["timestamp"], "2026-12-03T13:16:27.383Z");
        assert_eq!(transitions[1]["state"], "FAILED");
        assert_eq!(transitions[1]["timestamp"], "2026-12-03T13:16:30.473Z");
        assert_eq!(transitions[1]["errorType"], "JOB_ENTRYPOINT_COMMAND_ERROR");
        assert_eq!(transitions[1]["driverExitCode"], 3);
        // 56 hex digits, as bytes in base64.
        assert_eq!(
            transitions[1]["driverNodeId"],
            "/TsKzZ7IEAdsVzMN7thaei3iM92E/pwD/iJj1g=="
        );
        for change in changes {
            ledger.sent(change);
        }
        assert!(ledger.changes(&session(), &jobs, 2).is_empty());
        Ok(())
    }

    #[test]
    fn rays_token_is_found_where_rays_clients_look() -> anyhow::Result<()> {
        let home = tempfile::tempdir()?;
        assert_eq!(
            ray_auth_token(None, None, Some(home.path().to_owned())),
            None
        );
        std::fs::create_dir(home.path().join(".ray"))?;
        std::fs::write(home.path().join(".ray/auth_token"), "from-home\n")?;
        let named = home.path().join("named");
        std::fs::write(&named, " from-path ")?;
        let home = Some(home.path().to_owned());
        assert_eq!(
            ray_auth_token(None, None, home.clone()).as_deref(),
            Some("from-home")
        );
        assert_eq!(
            ray_auth_token(None, Some(named.clone()), home.clone()).as_deref(),
            Some("from-path")
        );
        assert_eq!(
            ray_auth_token(Some("from-env".into()), Some(named), home.clone()).as_deref(),
            Some("from-env")
        );
        assert_eq!(
            ray_auth_token(Some(" ".into()), None, home).as_deref(),
            Some("from-home"),
            "an empty variable is not a token"
        );
        Ok(())
    }

    #[test]
    fn a_change_sends_only_the_new_state_and_a_new_session_starts_afresh() -> anyhow::Result<()> {
        let mut job = JobDetails {
            kind: "SUBMISSION".to_owned(),
            submission_id: Some("s".to_owned()),
            status: "RUNNING".to_owned(),
            start_time: Some(1_000),
            ..JobDetails::default()
        };
        let mut ledger = SubmissionLedger::default();
        for change in ledger.changes(&session(), std::slice::from_ref(&job), 2_000) {
            ledger.sent(change);
        }
        job.status = "SUCCEEDED".to_owned();
        job.end_time = Some(3_000);
        let changes = ledger.changes(&session(), std::slice::from_ref(&job), 4_000);
        assert_eq!(changes.len(), 1);
        let [lifecycle] = changes[0].events.as_slice() else {
            anyhow::bail!("{:?}", changes[0].events);
        };
        let transitions = &lifecycle["submissionJobLifecycleEvent"]["stateTransitions"];
        assert_eq!(
            transitions,
            &json!([{"state": "SUCCEEDED", "timestamp": "1970-01-01T00:00:03.000Z"}])
        );
        let other = SessionName::new("session_2026-12-03_14-00-00_000000_2")?;
        assert_eq!(ledger.changes(&other, &[job], 5_000)[0].events.len(), 2);
        Ok(())
    }
}
