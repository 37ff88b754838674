//! Synthetic Ray traffic: the HTTP bodies Ray 2.60's aggregator agents would POST for a cluster
//! running millions of tasks, for `afterglow generate` and `afterglow bench`.
//!
//! The wire format is Ray's (camelCase JSON, base64 ids, RFC 3339 timestamps, int64 as strings;
//! see `tests/fixtures/ray-2.60`), and so is the shape: a task's definition and its owner-side
//! transitions come from the owner's node while its executor-side transitions come from the node
//! that ran it, each node's events are cut into bodies of at most `batch_events`, bodies from
//! different nodes interleave (so a lifecycle often arrives before its definition), failed
//! attempts carry multi-line tracebacks, some failures are retried, and some bodies are sent twice
//! (as Ray does after a timeout). Everything derives from the seed: the same settings give the same
//! bytes. [`Truth`] counts what was generated, independently of how Afterglow will read it.

mod catalog;
mod rng;

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use self::catalog::{ACTOR_CLASSES, EXCEPTIONS, FUNCTIONS};
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

/// How one attempt ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Finished,
    Exception,
    WorkerDied,
    OutOfMemory,
    Cancelled,
}

impl Outcome {
    fn error_type(self) -> Option<&'static str> {
        match self {
            Outcome::Finished => None,
            Outcome::Exception => Some("TASK_EXECUTION_EXCEPTION"),
            Outcome::WorkerDied => Some("WORKER_DIED"),
            Outcome::OutOfMemory => Some("OUT_OF_MEMORY"),
            Outcome::Cancelled => Some("TASK_CANCELLED"),
        }
    }
}

/// A worker process.
#[derive(Clone, Debug)]
struct Worker {
    id: String,
    node: u32,
    pid: u32,
}

/// An actor of a job.
#[derive(Clone, Debug)]
struct Actor {
    id: [u8; 16],
    class: usize,
    worker: Worker,
}

/// A job and what its tasks may refer to.
#[derive(Clone, Debug)]
struct Job {
    id: [u8; 4],
    driver_node: u32,
    driver_worker: Worker,
    actors: Vec<Actor>,
    /// Recent task ids and their executors, for nested tasks' parents.
    recent: VecDeque<([u8; 24], Worker)>,
}

/// Where the generator is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Start,
    Tasks,
    End,
    Done,
}

/// Generates bodies; an iterator, so any size streams in constant memory.
#[derive(Debug)]
pub struct Generator {
    settings: SynthSettings,
    rng: Rng,
    session: String,
    node_ids: Vec<String>,
    workers: Vec<Vec<Worker>>,
    jobs: Vec<Job>,
    /// Per node: the events not yet sent.
    buffers: Vec<Vec<String>>,
    ready: VecDeque<Body>,
    clock_ns: i64,
    phase: Phase,
    truth: Truth,
    timestamps: TimestampFormat,
    next_pid: u32,
}

/// 2026-11-22T00:00:00Z, the synthetic session's start.
const START_NS: i64 = 1_795_305_600_000_000_000;

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
        let node_ids = (0..nodes).map(|_| random_b64(&mut rng, 28)).collect();
        let mut generator = Self {
            buffers: vec![Vec::new(); nodes as usize],
            node_ids,
            workers: Vec::new(),
            jobs: Vec::new(),
            ready: VecDeque::new(),
            clock_ns: START_NS,
            phase: Phase::Start,
            truth: Truth {
                session_name: session.clone(),
                ..Truth::default()
            },
            timestamps: TimestampFormat::default(),
            next_pid: 4000,
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

    fn new_worker(&mut self, node: u32) -> Worker {
        self.next_pid += 1;
        Worker {
            id: random_b64(&mut self.rng, 28),
            node,
            pid: self.next_pid,
        }
    }

    /// The next body, generating tasks until one is ready.
    fn fill(&mut self) {
        while self.ready.is_empty() && self.phase != Phase::Done {
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
                    for node in 0..self.buffers.len() {
                        self.flush(node);
                    }
                    self.phase = Phase::Done;
                }
                Phase::Done => {}
            }
        }
    }

    /// Queues `event` on `node`'s aggregator, sending a body when it is full.
    fn push(&mut self, node: u32, event: String) {
        let index = node as usize % self.buffers.len();
        self.truth.events += 1;
        if let Some(buffer) = self.buffers.get_mut(index) {
            buffer.push(event);
            if buffer.len() >= self.settings.batch_events {
                self.flush(index);
            }
        }
    }

    fn flush(&mut self, node: usize) {
        let Some(buffer) = self.buffers.get_mut(node) else {
            return;
        };
        if buffer.is_empty() {
            return;
        }
        let events = std::mem::take(buffer);
        let size = events.iter().map(|event| event.len() + 1).sum::<usize>() + 2;
        let mut json = Vec::with_capacity(size);
        json.push(b'[');
        for (index, event) in events.iter().enumerate() {
            if index > 0 {
                json.push(b',');
            }
            json.extend_from_slice(event.as_bytes());
        }
        json.push(b']');
        let body = Body {
            node: node as u32,
            json,
            events: events.len(),
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

    /// Nodes, workers, jobs, drivers and actors.
    fn start_cluster(&mut self) {
        let at = self.clock_ns;
        for node in 0..self.settings.nodes {
            let id = self.node_ids[node as usize].clone();
            let mut event = self.envelope("NODE_DEFINITION_EVENT", "GCS", at);
            let _ = write!(
                event,
                "\"nodeDefinitionEvent\":{{\"nodeId\":\"{id}\",\"nodeIpAddress\":\"10.0.{}.{}\",\
                 \"labels\":{{}},\"startTimestamp\":\"{}\",\"hostname\":\"ray-worker-{node}\",\
                 \"nodeName\":\"10.0.{}.{}\",\"instanceId\":\"i-{node:017x}\",\"instanceTypeName\":\"m7i.4xlarge\"}}",
                node / 250,
                node % 250 + 1,
                self.timestamps.format(at),
                node / 250,
                node % 250 + 1,
            );
            self.close_gcs(event);
            let mut event = self.envelope("NODE_LIFECYCLE_EVENT", "GCS", at);
            let _ = write!(
                event,
                "\"nodeLifecycleEvent\":{{\"nodeId\":\"{id}\",\"stateTransitions\":[{{\"timestamp\":\"{}\",\
                 \"resources\":{{\"CPU\":16.0,\"memory\":68719476736.0}},\"state\":\"ALIVE\",\"aliveSubState\":\"UNSPECIFIED\"}}]}}",
                self.timestamps.format(at),
            );
            self.close_gcs(event);
        }
        for node in 0..self.settings.nodes as usize {
            for worker in self.workers[node].clone() {
                self.worker_started(&worker, at);
            }
        }
        for index in 0..self.settings.jobs {
            let job_id = (index + 1).to_le_bytes();
            let driver_node = index % self.settings.nodes;
            let driver_worker = self.new_worker(driver_node);
            let mut job = Job {
                id: job_id,
                driver_node,
                driver_worker,
                actors: Vec::new(),
                recent: VecDeque::new(),
            };
            self.job_started(&job, at);
            let actors_per_job = 4;
            for number in 0..actors_per_job {
                let actor = self.actor_started(&job, number, at);
                job.actors.push(actor);
            }
            self.jobs.push(job);
        }
    }

    /// Jobs finish, actors and workers exit.
    fn end_cluster(&mut self) {
        self.clock_ns += 60_000_000_000;
        let at = self.clock_ns;
        for job in self.jobs.clone() {
            for actor in &job.actors {
                let mut event = self.envelope("ACTOR_LIFECYCLE_EVENT", "GCS", at);
                let _ = write!(
                    event,
                    "\"actorLifecycleEvent\":{{\"actorId\":\"{}\",\"stateTransitions\":[{{\"state\":\"DEAD\",\
                     \"timestamp\":\"{}\",\"deathCause\":{{\"actorDiedErrorContext\":{{\"errorMessage\":\
                     \"The actor is dead because all references to the actor were removed.\",\"reason\":\"OUT_OF_SCOPE\",\
                     \"className\":\"{}\",\"actorId\":\"{}\",\"neverStarted\":false}}}},\"nodeId\":\"\",\"workerId\":\"\",\
                     \"reprName\":\"\",\"pid\":0,\"port\":0,\"restartReason\":\"ACTOR_FAILURE\"}}]}}",
                    STANDARD.encode(actor.id),
                    self.timestamps.format(at),
                    ACTOR_CLASSES[actor.class].class,
                    STANDARD.encode(actor.id),
                );
                self.close_gcs(event);
            }
            let mut event = self.envelope("DRIVER_JOB_LIFECYCLE_EVENT", "GCS", at);
            let _ = write!(
                event,
                "\"driverJobLifecycleEvent\":{{\"jobId\":\"{}\",\"stateTransitions\":[{{\"state\":\"FINISHED\",\"timestamp\":\"{}\"}}]}}",
                STANDARD.encode(job.id),
                self.timestamps.format(at),
            );
            self.close_gcs(event);
        }
        let end_ms = at / 1_000_000;
        for node in 0..self.settings.nodes as usize {
            for worker in self.workers[node].clone() {
                let mut event = self.envelope("WORKER_LIFECYCLE_EVENT", "GCS", at);
                let _ = write!(
                    event,
                    "\"workerLifecycleEvent\":{{\"workerId\":\"{}\",\"stateTransitions\":[{{\"state\":\"DEAD\",\
                     \"timestamp\":\"{}\",\"endTimeMs\":\"{end_ms}\",\"deathInfo\":{{\"exitType\":\"INTENDED_USER_EXIT\",\
                     \"exitDetail\":\"Worker force exited because its job has finished\"}},\"workerLaunchTimeMs\":\"0\",\
                     \"workerLaunchedTimeMs\":\"0\",\"startTimeMs\":\"0\"}}],\"jobId\":\"\"}}",
                    worker.id,
                    self.timestamps.format(at),
                );
                self.close_gcs(event);
            }
        }
    }

    fn worker_started(&mut self, worker: &Worker, at: i64) {
        let node_id = self.node_ids[worker.node as usize].clone();
        let mut event = self.envelope("WORKER_DEFINITION_EVENT", "GCS", at);
        let _ = write!(
            event,
            "\"workerDefinitionEvent\":{{\"workerId\":\"{}\",\"nodeId\":\"{node_id}\",\"pid\":{},\"workerType\":\"WORKER\"}}",
            worker.id, worker.pid
        );
        self.close_gcs(event);
        let ms = at / 1_000_000;
        let mut event = self.envelope("WORKER_LIFECYCLE_EVENT", "GCS", at);
        let _ = write!(
            event,
            "\"workerLifecycleEvent\":{{\"workerId\":\"{}\",\"stateTransitions\":[{{\"timestamp\":\"{}\",\
             \"workerLaunchTimeMs\":\"{}\",\"workerLaunchedTimeMs\":\"{}\",\"startTimeMs\":\"{ms}\",\"state\":\"ALIVE\",\
             \"endTimeMs\":\"0\"}}],\"jobId\":\"\"}}",
            worker.id,
            self.timestamps.format(at),
            ms - 900,
            ms - 30,
        );
        self.close_gcs(event);
    }

    fn job_started(&mut self, job: &Job, at: i64) {
        let job_b64 = STANDARD.encode(job.id);
        let node_id = self.node_ids[job.driver_node as usize].clone();
        let mut event = self.envelope("DRIVER_JOB_DEFINITION_EVENT", "GCS", at);
        let _ = write!(
            event,
            "\"driverJobDefinitionEvent\":{{\"jobId\":\"{job_b64}\",\"driverPid\":\"{}\",\"driverNodeId\":\"{node_id}\",\
             \"entrypoint\":\"python -m pipeline.run --config jobs/{}.yaml\",\"config\":{{\"serializedRuntimeEnv\":\"{{}}\",\
             \"metadata\":{{\"job_submission_id\":\"raysubmit_{:016x}\"}}}}}}",
            job.driver_worker.pid,
            u32::from_le_bytes(job.id),
            self.rng.next_u64(),
        );
        self.close_gcs(event);
        let mut event = self.envelope("DRIVER_JOB_LIFECYCLE_EVENT", "GCS", at);
        let _ = write!(
            event,
            "\"driverJobLifecycleEvent\":{{\"jobId\":\"{job_b64}\",\"stateTransitions\":[{{\"state\":\"CREATED\",\"timestamp\":\"{}\"}}]}}",
            self.timestamps.format(at),
        );
        self.close_gcs(event);
        // The driver "task": Ray exports it, its state API hides it.
        let mut driver_task = [0xffu8; 24];
        driver_task[20..].copy_from_slice(&job.id);
        let task_b64 = STANDARD.encode(driver_task);
        let mut event = self.envelope("TASK_DEFINITION_EVENT", "CORE_WORKER", at);
        let _ = write!(
            event,
            "\"taskDefinitionEvent\":{{\"taskId\":\"{task_b64}\",\"taskType\":\"DRIVER_TASK\",\"taskFunc\":{{}},\
             \"jobId\":\"{job_b64}\",\"parentTaskId\":\"////////////////////////////////\",\
             \"placementGroupId\":\"////////////////////////\",\"taskAttempt\":0,\"language\":\"PYTHON\",\
             \"taskName\":\"\",\"requiredResources\":{{}},\"refIds\":{{}},\"serializedRuntimeEnv\":\"\",\
             \"labelSelector\":{{}},\"isDetachedActor\":false}}"
        );
        self.close_on(job.driver_node, event);
        let mut event = self.envelope("TASK_LIFECYCLE_EVENT", "CORE_WORKER", at);
        let _ = write!(
            event,
            "\"taskLifecycleEvent\":{{\"taskId\":\"{task_b64}\",\"stateTransitions\":[{{\"state\":\"RUNNING\",\
             \"timestamp\":\"{}\"}}],\"jobId\":\"{job_b64}\",\"taskAttempt\":0,\"nodeId\":\"\",\"workerId\":\"\",\"workerPid\":0}}",
            self.timestamps.format(at),
        );
        self.close_on(job.driver_node, event);
    }

    fn actor_started(&mut self, job: &Job, number: usize, at: i64) -> Actor {
        let class = (u32::from_le_bytes(job.id) as usize + number) % ACTOR_CLASSES.len();
        let mut id = [0u8; 16];
        self.rng.fill(&mut id[..12]);
        id[12..].copy_from_slice(&job.id);
        let node = self.rng.below(self.settings.nodes as usize) as u32;
        let worker = self.new_worker(node);
        self.worker_started(&worker, at);
        let actor = Actor { id, class, worker };
        let class_name = ACTOR_CLASSES[class].class;
        let module = ACTOR_CLASSES[class].module;
        let actor_b64 = STANDARD.encode(id);
        let job_b64 = STANDARD.encode(job.id);
        let mut event = self.envelope("ACTOR_DEFINITION_EVENT", "GCS", at);
        let _ = write!(
            event,
            "\"actorDefinitionEvent\":{{\"actorId\":\"{actor_b64}\",\"jobId\":\"{job_b64}\",\"isDetached\":false,\
             \"name\":\"\",\"rayNamespace\":\"default\",\"serializedRuntimeEnv\":\"{{}}\",\"className\":\"{class_name}\",\
             \"labelSelector\":{{}},\"requiredResources\":{{\"CPU\":1.0}},\"placementGroupId\":\"\",\"callSite\":\"\",\
             \"parentId\":\"\",\"refIds\":{{}}}}"
        );
        self.close_gcs(event);
        let node_id = self.node_ids[node as usize].clone();
        let mut event = self.envelope("ACTOR_LIFECYCLE_EVENT", "GCS", at);
        let _ = write!(
            event,
            "\"actorLifecycleEvent\":{{\"actorId\":\"{actor_b64}\",\"stateTransitions\":[{{\"timestamp\":\"{}\",\
             \"state\":\"PENDING_CREATION\",\"nodeId\":\"\",\"workerId\":\"\",\"reprName\":\"\",\"pid\":0,\"port\":0,\
             \"restartReason\":\"ACTOR_FAILURE\"}},{{\"state\":\"ALIVE\",\"timestamp\":\"{}\",\"nodeId\":\"{node_id}\",\
             \"workerId\":\"{}\",\"pid\":{},\"port\":{},\"reprName\":\"\",\"restartReason\":\"ACTOR_FAILURE\"}}]}}",
            self.timestamps.format(at),
            self.timestamps.format(at + 900_000_000),
            actor.worker.id,
            actor.worker.pid,
            20_000 + actor.worker.pid,
        );
        self.close_gcs(event);
        // Its creation task.
        let mut task_id = [0xffu8; 24];
        task_id[8..].copy_from_slice(&id);
        let spec = TaskSpec {
            task_id,
            job_id: job.id,
            attempt: 0,
            kind: TaskKind::ActorCreation,
            name: format!("{class_name}.__init__"),
            module: module.to_owned(),
            class: class_name.to_owned(),
            function: "__init__".to_owned(),
            parent: None,
            owner_node: job.driver_node,
            executor: actor.worker.clone(),
            created_ns: at,
            duration_ns: 850_000_000,
            outcome: Outcome::Finished,
        };
        self.emit_attempt(&spec);
        actor
    }

    /// One task: its attempts, each with its events.
    fn task(&mut self) {
        let gap =
            (self.settings.mean_gap_us as f64 * 1000.0 * -(1.0 - self.rng.unit()).ln()) as i64;
        self.clock_ns += gap.max(1);
        let job_index = self.rng.below(self.jobs.len());
        let Some(job) = self.jobs.get(job_index) else {
            return;
        };
        let (job_id, driver_node, actors, recent) =
            (job.id, job.driver_node, job.actors.len(), job.recent.len());
        let actor_call = self.rng.chance(self.settings.actor_share) && actors > 0;
        let mut task_id = [0u8; 24];
        self.rng.fill(&mut task_id[..8]);
        let (kind, name, module, class, function, median_ms, executor) = if actor_call {
            let actor = self.jobs[job_index].actors[self.rng.below(actors)].clone();
            let class = &ACTOR_CLASSES[actor.class];
            let (method, median) = class.methods[self.rng.below(class.methods.len())];
            task_id[8..].copy_from_slice(&actor.id);
            (
                TaskKind::ActorMethod { actor: actor.id },
                format!("{}.{method}", class.class),
                class.module.to_owned(),
                class.class.to_owned(),
                method.to_owned(),
                median,
                actor.worker.clone(),
            )
        } else {
            task_id[8..20].fill(0xff);
            task_id[20..].copy_from_slice(&job_id);
            let function = pick_function(&mut self.rng);
            let node = self.rng.below(self.settings.nodes as usize);
            let worker =
                self.workers[node][self.rng.below(self.settings.workers_per_node as usize)].clone();
            (
                TaskKind::Normal,
                function.name.to_owned(),
                function.module.to_owned(),
                String::new(),
                function.name.to_owned(),
                function.median_ms,
                worker,
            )
        };
        let parent = if !actor_call && self.rng.chance(self.settings.nested_share) && recent > 0 {
            let index = if self.settings.chained {
                recent - 1
            } else {
                self.rng.below(recent)
            };
            self.jobs[job_index].recent.get(index).cloned()
        } else {
            None
        };
        let owner_node = parent
            .as_ref()
            .map_or(driver_node, |(_, worker)| worker.node);
        let duration_ns = (median_ms * 1e6 * self.rng.log_normal(0.6)) as i64;
        let first = if self.rng.chance(self.settings.failure_rate) {
            match self.rng.below(20) {
                0..=11 => Outcome::Exception,
                12..=16 => Outcome::WorkerDied,
                17..=18 => Outcome::OutOfMemory,
                _ => Outcome::Cancelled,
            }
        } else {
            Outcome::Finished
        };
        let mut spec = TaskSpec {
            task_id,
            job_id,
            attempt: 0,
            kind,
            name,
            module,
            class,
            function,
            parent: parent.map(|(id, _)| id),
            owner_node,
            executor,
            created_ns: self.clock_ns,
            duration_ns: duration_ns.max(100_000),
            outcome: first,
        };
        self.emit_attempt(&spec);
        // Ray retries system failures; a retried attempt here succeeds.
        if matches!(first, Outcome::WorkerDied | Outcome::OutOfMemory) && !actor_call {
            spec.attempt = 1;
            spec.created_ns += spec.duration_ns + 50_000_000;
            spec.outcome = Outcome::Finished;
            let node = self.rng.below(self.settings.nodes as usize);
            spec.executor =
                self.workers[node][self.rng.below(self.settings.workers_per_node as usize)].clone();
            self.emit_attempt(&spec);
        }
        if let Some(job) = self.jobs.get_mut(job_index) {
            job.recent.push_back((task_id, spec.executor.clone()));
            if job.recent.len() > 64 {
                job.recent.pop_front();
            }
        }
    }

    /// The events of one attempt, each queued on the node that sends it.
    fn emit_attempt(&mut self, spec: &TaskSpec) {
        self.truth.attempts += 1;
        *self.truth.by_name.entry(spec.name.clone()).or_default() += 1;
        let state = if spec.outcome == Outcome::Finished {
            "FINISHED"
        } else {
            "FAILED"
        };
        *self.truth.by_state.entry(state.to_owned()).or_default() += 1;
        if let Some(error_type) = spec.outcome.error_type() {
            *self
                .truth
                .by_error_type
                .entry(error_type.to_owned())
                .or_default() += 1;
        }

        let task_b64 = STANDARD.encode(spec.task_id);
        let job_b64 = STANDARD.encode(spec.job_id);
        let parent_b64 = match &spec.parent {
            Some(parent) => STANDARD.encode(parent),
            None => {
                let mut driver = [0xffu8; 24];
                driver[20..].copy_from_slice(&spec.job_id);
                STANDARD.encode(driver)
            }
        };
        let created = spec.created_ns;
        let pending_node = created + 40_000 + self.rng.below(40_000) as i64;
        let submitted = pending_node + (2e6 * self.rng.log_normal(0.8)) as i64;
        let running = submitted + 300_000 + self.rng.below(400_000) as i64;
        let ended = running + spec.duration_ns;

        // Definition, from the owner.
        let mut event = self.envelope(spec.kind.definition_event(), "CORE_WORKER", created);
        match spec.kind {
            TaskKind::ActorMethod { actor } => {
                let _ = write!(
                    event,
                    "\"actorTaskDefinitionEvent\":{{\"taskId\":\"{task_b64}\",\"actorFunc\":{{\"pythonFunctionDescriptor\":\
                     {{\"moduleName\":\"{}\",\"className\":\"{}\",\"functionName\":\"{}\",\"functionHash\":\"\"}}}},\
                     \"actorTaskName\":\"{}\",\"requiredResources\":{{}},\"jobId\":\"{job_b64}\",\"actorId\":\"{}\",\
                     \"parentTaskId\":\"{parent_b64}\",\"placementGroupId\":\"////////////////////////\",\
                     \"serializedRuntimeEnv\":\"{{}}\",\"taskAttempt\":{},\"language\":\"PYTHON\",\"refIds\":{{}},\
                     \"labelSelector\":{{}},\"isDetachedActor\":false}}",
                    spec.module,
                    spec.class,
                    spec.function,
                    spec.name,
                    STANDARD.encode(actor),
                    spec.attempt,
                );
            }
            TaskKind::Normal | TaskKind::ActorCreation => {
                let task_type = if matches!(spec.kind, TaskKind::Normal) {
                    "NORMAL_TASK"
                } else {
                    "ACTOR_CREATION_TASK"
                };
                let resources = if matches!(spec.kind, TaskKind::Normal) {
                    "{\"CPU\":1.0}"
                } else {
                    "{}"
                };
                let _ = write!(
                    event,
                    "\"taskDefinitionEvent\":{{\"taskId\":\"{task_b64}\",\"taskFunc\":{{\"pythonFunctionDescriptor\":\
                     {{\"moduleName\":\"{}\",\"functionName\":\"{}\",\"functionHash\":\"{:032x}\",\"className\":\"{}\"}}}},\
                     \"taskName\":\"{}\",\"requiredResources\":{resources},\"jobId\":\"{job_b64}\",\
                     \"parentTaskId\":\"{parent_b64}\",\"placementGroupId\":\"////////////////////////\",\
                     \"serializedRuntimeEnv\":\"{{\\\"pip\\\": [\\\"pyarrow==21.0.0\\\"]}}\",\"taskAttempt\":{},\
                     \"taskType\":\"{task_type}\",\"language\":\"PYTHON\",\"refIds\":{{}},\"labelSelector\":{{}},\
                     \"isDetachedActor\":false}}",
                    spec.module,
                    spec.function,
                    u128::from(fnv(spec.function.as_bytes())),
                    spec.class,
                    spec.name,
                    spec.attempt,
                );
            }
        }
        self.close_on(spec.owner_node, event);

        // Owner-side transitions.
        let mut event = self.envelope("TASK_LIFECYCLE_EVENT", "CORE_WORKER", pending_node);
        let _ = write!(
            event,
            "\"taskLifecycleEvent\":{{\"taskId\":\"{task_b64}\",\"stateTransitions\":[{{\"state\":\"PENDING_ARGS_AVAIL\",\
             \"timestamp\":\"{}\"}},{{\"state\":\"PENDING_NODE_ASSIGNMENT\",\"timestamp\":\"{}\"}}],\"jobId\":\"{job_b64}\",\
             \"taskAttempt\":{},\"nodeId\":\"\",\"workerId\":\"\",\"workerPid\":0}}",
            self.timestamps.format(created),
            self.timestamps.format(pending_node),
            spec.attempt,
        );
        self.close_on(spec.owner_node, event);

        if spec.outcome == Outcome::Cancelled {
            let mut event = self.envelope("TASK_LIFECYCLE_EVENT", "CORE_WORKER", submitted);
            let _ = write!(
                event,
                "\"taskLifecycleEvent\":{{\"taskId\":\"{task_b64}\",\"stateTransitions\":[{{\"state\":\"FAILED\",\
                 \"timestamp\":\"{}\"}}],\"rayErrorInfo\":{{\"errorType\":\"TASK_CANCELLED\",\"errorMessage\":\"\"}},\
                 \"jobId\":\"{job_b64}\",\"taskAttempt\":{},\"nodeId\":\"\",\"workerId\":\"\",\"workerPid\":0}}",
                self.timestamps.format(submitted),
                spec.attempt,
            );
            self.close_on(spec.owner_node, event);
            return;
        }

        // Executor side: RUNNING with the log position, then the end.
        let executor = &spec.executor;
        let node_id = self.node_ids[executor.node as usize].clone();
        let log = format!(
            "/tmp/ray/{}/logs/worker-{:056x}-{:08x}-{}",
            self.session,
            fnv(executor.id.as_bytes()),
            u32::from_le_bytes(spec.job_id),
            executor.pid
        );
        let offset = self.rng.below(5_000_000);
        let mut event = self.envelope("TASK_LIFECYCLE_EVENT", "CORE_WORKER", running);
        let _ = write!(
            event,
            "\"taskLifecycleEvent\":{{\"taskId\":\"{task_b64}\",\"stateTransitions\":[{{\"state\":\"RUNNING\",\
             \"timestamp\":\"{}\"}}],\"workerPid\":{},\"jobId\":\"{job_b64}\",\"taskLogInfo\":{{\"stdoutFile\":\"{log}.out\",\
             \"stderrFile\":\"{log}.err\",\"stdoutStart\":\"{offset}\",\"stdoutEnd\":\"{offset}\",\"stderrStart\":\"{offset}\",\
             \"stderrEnd\":\"{offset}\"}},\"taskAttempt\":{},\"nodeId\":\"\",\"workerId\":\"\"}}",
            self.timestamps.format(running),
            executor.pid,
            spec.attempt,
        );
        let end_node = executor.node;
        let end_worker = executor.id.clone();
        let pid = executor.pid;
        self.close_on(end_node, event);

        let (end_state, error) = match spec.outcome {
            Outcome::Finished => ("FINISHED", String::new()),
            outcome => {
                let message = match outcome {
                    Outcome::Exception => {
                        let exception = &EXCEPTIONS[self.rng.below(EXCEPTIONS.len())];
                        let line = 20 + self.rng.below(400) as u32;
                        let detail = self.rng.next_u64() % 100_000;
                        catalog::user_exception(
                            &spec.module,
                            &spec.function,
                            exception,
                            pid,
                            line,
                            detail,
                        )
                    }
                    Outcome::OutOfMemory => catalog::OUT_OF_MEMORY_MESSAGE.to_owned(),
                    _ => catalog::WORKER_DIED_MESSAGE.to_owned(),
                };
                let mut error = String::from(",\"rayErrorInfo\":{\"errorMessage\":");
                let _ = serde_json::to_string(&message).map(|text| error.push_str(&text));
                let _ = write!(
                    error,
                    ",\"errorType\":\"{}\"}}",
                    outcome.error_type().unwrap_or("UNKNOWN")
                );
                ("FAILED", error)
            }
        };
        let mut event = self.envelope("TASK_LIFECYCLE_EVENT", "CORE_WORKER", ended);
        let _ = write!(
            event,
            "\"taskLifecycleEvent\":{{\"taskId\":\"{task_b64}\",\"stateTransitions\":[{{\"state\":\"SUBMITTED_TO_WORKER\",\
             \"timestamp\":\"{}\"}},{{\"state\":\"{end_state}\",\"timestamp\":\"{}\"}}]{error},\"nodeId\":\"{node_id}\",\
             \"workerId\":\"{end_worker}\",\"jobId\":\"{job_b64}\",\"taskAttempt\":{},\"workerPid\":0}}",
            self.timestamps.format(submitted),
            self.timestamps.format(ended),
            spec.attempt,
        );
        self.close_on(end_node, event);

        if self.settings.profile {
            let mut event = self.envelope("TASK_PROFILE_EVENT", "CORE_WORKER", running);
            let _ = write!(
                event,
                "\"taskProfileEvents\":{{\"taskId\":\"{task_b64}\",\"jobId\":\"{job_b64}\",\"profileEvents\":{{\
                 \"componentType\":\"worker\",\"componentId\":\"{end_worker}\",\"nodeIpAddress\":\"10.0.0.1\",\"events\":[\
                 {{\"startTime\":\"{running}\",\"endTime\":\"{ended}\",\"extraData\":\"{{}}\",\"eventName\":\"task:execute\"}}]}},\
                 \"attemptNumber\":{}}}",
                spec.attempt,
            );
            self.close_on(end_node, event);
        }
    }

    /// The common head of an event, left open for its payload.
    fn envelope(&mut self, event_type: &str, source: &str, at: i64) -> String {
        let mut event = String::with_capacity(768);
        event.push_str("{\"eventId\":\"");
        let mut id = [0u8; 28];
        self.rng.fill(&mut id);
        STANDARD.encode_string(id, &mut event);
        let _ = write!(
            event,
            "\",\"sourceType\":\"{source}\",\"eventType\":\"{event_type}\",\"timestamp\":\"{}\",\"severity\":\"INFO\",\
             \"sessionName\":\"{}\",",
            self.timestamps.format(at),
            self.session
        );
        event
    }

    /// Closes a GCS event (sent by the head node).
    fn close_gcs(&mut self, event: String) {
        self.close_on(0, event);
    }

    /// Closes an event sent by `node` and queues it there.
    fn close_on(&mut self, node: u32, mut event: String) {
        let node_id = &self.node_ids[node as usize % self.node_ids.len()];
        let _ = write!(event, ",\"nodeId\":\"{node_id}\",\"message\":\"\"}}");
        self.push(node, event);
    }
}

impl Iterator for Generator {
    type Item = Body;

    fn next(&mut self) -> Option<Body> {
        self.fill();
        self.ready.pop_front()
    }
}

/// What kind of task an attempt belongs to.
#[derive(Clone, Copy, Debug)]
enum TaskKind {
    Normal,
    ActorCreation,
    ActorMethod { actor: [u8; 16] },
}

impl TaskKind {
    fn definition_event(self) -> &'static str {
        match self {
            TaskKind::ActorMethod { .. } => "ACTOR_TASK_DEFINITION_EVENT",
            TaskKind::Normal | TaskKind::ActorCreation => "TASK_DEFINITION_EVENT",
        }
    }
}

/// One attempt to emit.
#[derive(Clone, Debug)]
struct TaskSpec {
    task_id: [u8; 24],
    job_id: [u8; 4],
    attempt: u32,
    kind: TaskKind,
    name: String,
    module: String,
    class: String,
    function: String,
    parent: Option<[u8; 24]>,
    owner_node: u32,
    executor: Worker,
    created_ns: i64,
    duration_ns: i64,
    outcome: Outcome,
}

fn pick_function(rng: &mut Rng) -> &'static catalog::Function {
    let total: u32 = FUNCTIONS.iter().map(|function| function.weight).sum();
    let mut ticket = rng.below(total as usize) as u32;
    for function in FUNCTIONS {
        if ticket < function.weight {
            return function;
        }
        ticket -= function.weight;
    }
    &FUNCTIONS[0]
}

fn random_b64(rng: &mut Rng, len: usize) -> String {
    let mut bytes = vec![0u8; len];
    rng.fill(&mut bytes);
    STANDARD.encode(bytes)
}

/// FNV-1a, for stable made-up hashes.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// RFC 3339 with nanoseconds, reusing the formatted second (events come in bursts).
#[derive(Debug, Default)]
struct TimestampFormat {
    second: Option<(i64, String)>,
}

impl TimestampFormat {
    fn format(&mut self, ns: i64) -> String {
        let second = ns.div_euclid(1_000_000_000);
        let nanos = ns.rem_euclid(1_000_000_000);
        let prefix = match &self.second {
            Some((cached, prefix)) if *cached == second => prefix.clone(),
            _ => {
                let prefix = chrono::DateTime::from_timestamp(second, 0)
                    .map(|time| time.format("%Y-%m-%dT%H:%M:%S").to_string())
                    .unwrap_or_else(|| "1970-01-01T00:00:00".to_owned());
                self.second = Some((second, prefix.clone()));
                prefix
            }
        };
        format!("{prefix}.{nanos:09}Z")
    }
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
            ..SynthSettings::default()
        }
    }

    #[test]
    fn same_seed_gives_the_same_bytes() {
        let first: Vec<Vec<u8>> = Generator::new(small()).map(|body| body.json).collect();
        let second: Vec<Vec<u8>> = Generator::new(small()).map(|body| body.json).collect();
        assert_eq!(first, second);
        let other: Vec<Vec<u8>> = Generator::new(SynthSettings { seed: 2, ..small() })
            .map(|body| body.json)
            .collect();
        assert_ne!(first, other);
    }

    #[test]
    fn bodies_are_json_arrays_within_the_batch_limit() -> Result<(), serde_json::Error> {
        let mut generator = Generator::new(small());
        let mut events = 0u64;
        let mut redelivered = 0u64;
        for body in generator.by_ref() {
            let array: Vec<serde_json::Value> = serde_json::from_slice(&body.json)?;
            assert_eq!(array.len(), body.events);
            assert!(body.events <= 1000);
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
        Ok(())
    }

    #[test]
    fn timestamps_are_rfc3339_with_nanoseconds() {
        let mut format = TimestampFormat::default();
        assert_eq!(
            format.format(START_NS + 5),
            "2026-11-22T00:00:00.000000005Z"
        );
        assert_eq!(
            format.format(START_NS + 61_500_000_000),
            "2026-11-22T00:01:01.500000000Z"
        );
    }
}
