//! Synthetic Ray traffic: the HTTP bodies Ray 2.60's aggregator agents would POST for a cluster
//! running millions of tasks, for `afterglow generate`, `afterglow bench` and the tests.
//!
//! Every event is a typed [`RayEvent`] from Afterglow's own event model, written by its
//! `Serialize` impls in Ray's wire format (camelCase keys, base64 ids, RFC 3339 timestamps, int64
//! as strings; `tests/events.rs` checks that writing a captured event gives Ray's bytes back). So
//! the generator cannot send a field the model does not know, and a change to the model shows up
//! here at compile time.
//!
//! The shape is Ray's too: a task's definition and its owner-side transitions come from the
//! owner's node while its executor-side transitions come from the node that ran it, each node's
//! events are cut into bodies of at most `batch_events`, bodies from different nodes interleave
//! (so a lifecycle often arrives before its definition), failed attempts carry multi-line
//! tracebacks, some failures are retried, and some bodies are sent twice (as Ray does after a
//! timeout). Everything derives from the seed: the same settings give the same bytes. [`Truth`]
//! counts what was generated, independently of how Afterglow will read it.

#![deny(missing_docs, unreachable_pub)]

mod catalog;
mod emit;
mod rng;

use std::collections::{BTreeMap, VecDeque};

use shared::event::encoding::{EventId, Id, Timestamp};
use shared::event::{EventPayload, EventType, RayEvent, Severity, SourceType};

use self::emit::{Job, Worker};
use self::rng::Rng;

/// What to generate.
#[derive(Clone, Debug)]
pub struct SynthSettings {
    /// Task attempts to generate (retries and actor creation tasks count; drivers do not).
    pub attempts: u64,
    /// Jobs (drivers), each with its own actors.
    pub jobs: u32,
    /// Nodes; node 0 is the head and also sends the GCS events.
    pub nodes: u32,
    /// Task-running workers per node.
    pub workers_per_node: u32,
    /// Share of tasks whose first attempt fails.
    pub failure_rate: f64,
    /// Share of tasks that are actor method calls.
    pub actor_share: f64,
    /// Share of normal tasks submitted by an earlier task of their job rather than its driver.
    pub nested_share: f64,
    /// Whether a nested task's submitter is its job's previous task, so that nesting makes
    /// chains as deep as the job (a lineage summary's worst case), rather than one of the
    /// job's 64 most recent tasks.
    pub chained: bool,
    /// Share of bodies delivered twice.
    pub duplicate_rate: f64,
    /// Events per body (Ray ≥ 2.55 sends at most 1000).
    pub batch_events: usize,
    /// Also emit `TASK_PROFILE_EVENT`s (Ray exports them only when asked to).
    pub profile: bool,
    /// Seed of everything random.
    pub seed: u64,
    /// Mean time between task submissions, in microseconds.
    pub mean_gap_us: u64,
    /// When the session starts (ms since the epoch).
    pub start_ms: i64,
}

impl Default for SynthSettings {
    fn default() -> Self {
        Self {
            attempts: 100_000,
            jobs: 8,
            nodes: 16,
            workers_per_node: 16,
            failure_rate: 0.02,
            actor_share: 0.15,
            nested_share: 0.2,
            chained: false,
            duplicate_rate: 0.005,
            batch_events: 1000,
            profile: false,
            seed: 1,
            mean_gap_us: 1000,
            start_ms: START_MS,
        }
    }
}

/// One POST body.
#[derive(Clone, Debug)]
pub struct Body {
    /// The sending node's index.
    pub node: u32,
    /// The JSON array.
    pub json: Vec<u8>,
    /// Events in it.
    pub events: usize,
    /// True when this is a re-delivery of the previous body.
    pub redelivery: bool,
}

/// What was generated, counted as Ray's state API would count it (drivers excluded).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Truth {
    /// The session all events belong to.
    pub session_name: String,
    /// Task attempts.
    pub attempts: u64,
    /// Attempts by final state.
    pub by_state: BTreeMap<String, u64>,
    /// Attempts by task name.
    pub by_name: BTreeMap<String, u64>,
    /// Failed attempts by error type.
    pub by_error_type: BTreeMap<String, u64>,
    /// Events, counting each once.
    pub events: u64,
    /// Bodies, re-deliveries included.
    pub bodies: u64,
    /// Bodies delivered a second time.
    pub redeliveries: u64,
}

/// An event the model could not write. Only a timestamp outside RFC 3339's years could cause
/// it, and the generator's clock never leaves 2026; the iterator ends after reporting it.
#[derive(Debug, thiserror::Error)]
#[error("cannot write a synthetic {event_type} event: {source}")]
pub struct SynthError {
    event_type: String,
    #[source]
    source: serde_json::Error,
}

/// Where the generator is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Start,
    Tasks,
    End,
    Done,
}

/// One node's aggregator: the events it has not sent yet, already written.
#[derive(Clone, Debug, Default)]
struct Outbox {
    json: Vec<u8>,
    events: usize,
}

/// Generates bodies; an iterator, so any size streams in constant memory.
#[derive(Debug)]
pub struct Generator {
    settings: SynthSettings,
    rng: Rng,
    session: String,
    node_ids: Vec<Id>,
    workers: Vec<Vec<Worker>>,
    jobs: Vec<Job>,
    outboxes: Vec<Outbox>,
    ready: VecDeque<Body>,
    clock_ns: i64,
    phase: Phase,
    truth: Truth,
    next_pid: u32,
    failed: Option<SynthError>,
}

/// 2026-11-22T00:00:00Z, the default start of a synthetic session.
pub const START_MS: i64 = 1_795_305_600_000;

impl Generator {
    /// A generator for `settings`.
    pub fn new(settings: SynthSettings) -> Self {
        let mut rng = Rng::new(settings.seed);
        let nodes = settings.nodes.max(1);
        let session = format!(
            "session_2026-11-22_00-00-00_{:06}_{}",
            settings.seed % 1_000_000,
            1000 + settings.seed % 90_000
        );
        let node_ids = (0..nodes).map(|_| random_id(&mut rng, 28)).collect();
        let mut generator = Self {
            outboxes: vec![Outbox::default(); nodes as usize],
            node_ids,
            workers: Vec::new(),
            jobs: Vec::new(),
            ready: VecDeque::new(),
            clock_ns: settings.start_ms.saturating_mul(1_000_000),
            phase: Phase::Start,
            truth: Truth {
                session_name: session.clone(),
                ..Truth::default()
            },
            next_pid: 4000,
            failed: None,
            session,
            rng,
            settings: SynthSettings {
                nodes,
                jobs: settings.jobs.max(1),
                workers_per_node: settings.workers_per_node.max(1),
                batch_events: settings.batch_events.max(1),
                ..settings
            },
        };
        generator.workers = (0..nodes)
            .map(|node| {
                (0..generator.settings.workers_per_node)
                    .map(|_| generator.new_worker(node))
                    .collect()
            })
            .collect();
        generator
    }

    /// What has been generated so far (all of it once the iterator is exhausted).
    pub fn truth(&self) -> &Truth {
        &self.truth
    }

    /// Generates until a body is ready or everything has been sent.
    fn fill(&mut self) {
        while self.ready.is_empty() && self.phase != Phase::Done && self.failed.is_none() {
            match self.phase {
                Phase::Start => {
                    self.start_cluster();
                    self.phase = Phase::Tasks;
                }
                Phase::Tasks => {
                    if self.truth.attempts >= self.settings.attempts {
                        self.phase = Phase::End;
                    } else {
                        self.task();
                    }
                }
                Phase::End => {
                    self.end_cluster();
                    for node in 0..self.outboxes.len() {
                        self.flush(node);
                    }
                    self.phase = Phase::Done;
                }
                Phase::Done => {}
            }
        }
    }

    /// An event emitted at `at` by `source`, its envelope filled as Ray's exporter fills it.
    fn event(&mut self, source: SourceType, at: i64, payload: EventPayload) -> RayEvent {
        let mut event_id = [0u8; 28];
        self.rng.fill(&mut event_id);
        RayEvent {
            event_id: Some(EventId::from_bytes(&event_id)),
            source_type: source,
            event_type: payload
                .event_type()
                .unwrap_or(EventType::EVENT_TYPE_UNSPECIFIED),
            timestamp: Some(Timestamp::from_nanos(at)),
            severity: Severity::INFO,
            message: String::new(),
            session_name: self.session.clone(),
            node_id: None,
            payload,
        }
    }

    /// Sends a GCS event (GCS runs on the head node).
    fn send_gcs(&mut self, payload: EventPayload, at: i64) {
        let event = self.event(SourceType::GCS, at, payload);
        self.send(0, event);
    }

    /// Sends a core worker's event from `node`.
    fn send_worker(&mut self, node: u32, payload: EventPayload, at: i64) {
        let event = self.event(SourceType::CORE_WORKER, at, payload);
        self.send(node, event);
    }

    /// Queues `event` on `node`'s aggregator, which stamps its own node id, sending a body
    /// when it is full.
    fn send(&mut self, node: u32, mut event: RayEvent) {
        let index = node as usize % self.outboxes.len();
        event.node_id = self.node_ids.get(index).cloned();
        let Some(outbox) = self.outboxes.get_mut(index) else {
            return;
        };
        outbox
            .json
            .push(if outbox.events == 0 { b'[' } else { b',' });
        if let Err(source) = serde_json::to_writer(&mut outbox.json, &event) {
            self.failed = Some(SynthError {
                event_type: event.event_type.to_string(),
                source,
            });
            return;
        }
        outbox.events += 1;
        self.truth.events += 1;
        if outbox.events >= self.settings.batch_events {
            self.flush(index);
        }
    }

    fn flush(&mut self, node: usize) {
        let Some(outbox) = self.outboxes.get_mut(node) else {
            return;
        };
        if outbox.events == 0 {
            return;
        }
        let Outbox { mut json, events } = std::mem::take(outbox);
        json.push(b']');
        let body = Body {
            node: node as u32,
            json,
            events,
            redelivery: false,
        };
        self.truth.bodies += 1;
        if self.rng.chance(self.settings.duplicate_rate) {
            self.truth.bodies += 1;
            self.truth.redeliveries += 1;
            self.ready.push_back(Body {
                redelivery: true,
                ..body.clone()
            });
            self.ready.push_front(body);
        } else {
            self.ready.push_back(body);
        }
    }
}

impl Iterator for Generator {
    type Item = Result<Body, SynthError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.fill();
        match self.ready.pop_front() {
            Some(body) => Some(Ok(body)),
            None => self.failed.take().map(Err),
        }
    }
}

fn random_id(rng: &mut Rng, len: usize) -> Id {
    let mut bytes = vec![0u8; len];
    rng.fill(&mut bytes);
    Id::from_bytes(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> SynthSettings {
        SynthSettings {
            attempts: 3000,
            jobs: 3,
            nodes: 4,
            workers_per_node: 4,
            failure_rate: 0.1,
            duplicate_rate: 0.05,
            profile: true,
            ..SynthSettings::default()
        }
    }

    fn bodies(settings: SynthSettings) -> Result<Vec<Vec<u8>>, SynthError> {
        Generator::new(settings)
            .map(|body| body.map(|body| body.json))
            .collect()
    }

    #[test]
    fn same_seed_gives_the_same_bytes() -> Result<(), SynthError> {
        let first = bodies(small())?;
        assert_eq!(first, bodies(small())?);
        assert_ne!(first, bodies(SynthSettings { seed: 2, ..small() })?);
        Ok(())
    }

    #[test]
    fn bodies_are_arrays_of_ray_events_within_the_batch_limit()
    -> Result<(), Box<dyn std::error::Error>> {
        let mut generator = Generator::new(small());
        let (mut events, mut redelivered) = (0u64, 0u64);
        let mut types = std::collections::BTreeSet::new();
        for body in generator.by_ref() {
            let body = body?;
            let array = shared::event::split_batch(&body.json)?;
            assert_eq!(array.len(), body.events);
            assert!(body.events <= 1000);
            for raw in array {
                let event = RayEvent::from_json(raw.get())?;
                assert!(
                    !matches!(event.payload, EventPayload::Unknown),
                    "{}",
                    raw.get()
                );
                types.insert(event.event_type.to_string());
            }
            if body.redelivery {
                redelivered += 1;
            } else {
                events += body.events as u64;
            }
        }
        let truth = generator.truth();
        assert_eq!(truth.events, events);
        assert_eq!(truth.redeliveries, redelivered);
        assert!(truth.attempts >= 3000);
        assert!(truth.by_state.get("FAILED").copied().unwrap_or(0) > 100);
        // Every type the generator sends, profiles included.
        assert_eq!(types.len(), 12, "{types:?}");
        Ok(())
    }
}
