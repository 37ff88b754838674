//! What each part of the synthetic cluster sends, and when: nodes, workers, jobs and their
//! driver tasks, actors, and every task attempt's definition, transitions and profile.

use std::collections::{BTreeMap, VecDeque};

use shared::event::EventPayload as P;
use shared::event::cluster::{
    ActorDefinitionEvent, ActorLifecycleEvent, ActorRestartReason, ActorState,
    ActorStateTransition, DriverJobConfig, DriverJobDefinitionEvent, DriverJobLifecycleEvent,
    DriverJobState, NodeAliveSubState, NodeDefinitionEvent, NodeLifecycleEvent, NodeState,
    NodeStateTransition, StateTransition, WorkerDeathInfo, WorkerDefinitionEvent, WorkerExitType,
    WorkerLifecycleEvent, WorkerState, WorkerStateTransition, WorkerType,
};
use shared::event::common::{
    ActorDeathCause, ActorDiedErrorContext, ActorDiedReason, ErrorType, FunctionDescriptor,
    Language, PythonFunctionDescriptor, RayErrorInfo, TaskStatus, TaskType,
};
use shared::event::encoding::{Id, Timestamp};
use shared::event::task::{
    ActorTaskDefinitionEvent, ProfileEventEntry, ProfileEvents, TaskDefinitionEvent,
    TaskLifecycleEvent, TaskLogInfo, TaskProfileEvents, TaskStateTransition,
};

use crate::Generator;
use crate::catalog::{self, ACTOR_CLASSES, EXCEPTIONS, FUNCTIONS};
use crate::rng::Rng;

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
    fn error_type(self) -> Option<ErrorType> {
        match self {
            Outcome::Finished => None,
            Outcome::Exception => Some(ErrorType::TASK_EXECUTION_EXCEPTION),
            Outcome::WorkerDied => Some(ErrorType::WORKER_DIED),
            Outcome::OutOfMemory => Some(ErrorType::OUT_OF_MEMORY),
            Outcome::Cancelled => Some(ErrorType::TASK_CANCELLED),
        }
    }
}

/// A worker process.
#[derive(Clone, Debug)]
pub(crate) struct Worker {
    id: Id,
    node: u32,
    pid: u32,
}

/// An actor of a job.
#[derive(Clone, Debug)]
pub(crate) struct Actor {
    id: [u8; 16],
    class: usize,
    worker: Worker,
}

/// A job and what its tasks may refer to.
#[derive(Clone, Debug)]
pub(crate) struct Job {
    id: [u8; 4],
    driver_node: u32,
    driver_worker: Worker,
    actors: Vec<Actor>,
    /// Recent task ids and their executors, for nested tasks' parents.
    recent: VecDeque<([u8; 24], Worker)>,
}

/// What kind of task an attempt belongs to.
#[derive(Clone, Copy, Debug)]
enum TaskKind {
    Normal,
    ActorCreation,
    ActorMethod { actor: [u8; 16] },
}

/// One attempt to emit.
#[derive(Clone, Debug)]
struct TaskSpec {
    task_id: [u8; 24],
    job_id: [u8; 4],
    attempt: i32,
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

/// The driver "task" of a job: Ray exports it, its state API hides it.
fn driver_task_id(job: [u8; 4]) -> [u8; 24] {
    let mut id = [0xffu8; 24];
    id[20..].copy_from_slice(&job);
    id
}

/// Ray's nil placement group id.
fn nil_placement_group() -> Option<Id> {
    Some(Id::from_bytes(&[0xff; 18]))
}

fn at(ns: i64) -> Timestamp {
    Timestamp::from_nanos(ns)
}

fn cpu(count: f64) -> BTreeMap<String, f64> {
    BTreeMap::from([("CPU".to_owned(), count)])
}

impl Generator {
    pub(crate) fn new_worker(&mut self, node: u32) -> Worker {
        self.next_pid += 1;
        Worker {
            id: crate::random_id(&mut self.rng, 28),
            node,
            pid: self.next_pid,
        }
    }

    /// Nodes, workers, jobs, drivers and actors.
    pub(crate) fn start_cluster(&mut self) {
        let now = self.clock_ns;
        for node in 0..self.settings.nodes {
            let node_id = self.node_ids.get(node as usize).cloned();
            let address = format!("10.0.{}.{}", node / 250, node % 250 + 1);
            let definition = NodeDefinitionEvent {
                node_id: node_id.clone(),
                node_ip_address: address.clone(),
                start_timestamp: Some(at(now)),
                hostname: format!("ray-worker-{node}"),
                node_name: address,
                instance_id: format!("i-{node:017x}"),
                instance_type_name: "m7i.4xlarge".to_owned(),
                ..NodeDefinitionEvent::default()
            };
            self.send_gcs(P::NodeDefinition(Box::new(definition)), now);
            let lifecycle = NodeLifecycleEvent {
                node_id,
                state_transitions: vec![NodeStateTransition {
                    state: NodeState::ALIVE,
                    timestamp: at(now),
                    resources: BTreeMap::from([
                        ("CPU".to_owned(), 16.0),
                        ("memory".to_owned(), 68_719_476_736.0),
                    ]),
                    death_info: None,
                    alive_sub_state: NodeAliveSubState::UNSPECIFIED,
                }],
            };
            self.send_gcs(P::NodeLifecycle(Box::new(lifecycle)), now);
        }
        for node in 0..self.settings.nodes as usize {
            for worker in self.workers[node].clone() {
                self.worker_started(&worker, now);
            }
        }
        for index in 0..self.settings.jobs {
            let driver_node = index % self.settings.nodes;
            let driver_worker = self.new_worker(driver_node);
            let mut job = Job {
                id: (index + 1).to_le_bytes(),
                driver_node,
                driver_worker,
                actors: Vec::new(),
                recent: VecDeque::new(),
            };
            self.job_started(&job, now);
            let actors_per_job = 4;
            for number in 0..actors_per_job {
                let actor = self.actor_started(&job, number, now);
                job.actors.push(actor);
            }
            self.jobs.push(job);
        }
    }

    /// Jobs finish, actors and workers exit.
    pub(crate) fn end_cluster(&mut self) {
        self.clock_ns += 60_000_000_000;
        let now = self.clock_ns;
        for job in self.jobs.clone() {
            for actor in &job.actors {
                let actor_id = Id::from_bytes(&actor.id);
                let death = ActorDiedErrorContext {
                    error_message:
                        "The actor is dead because all references to the actor were removed."
                            .to_owned(),
                    reason: ActorDiedReason::OUT_OF_SCOPE,
                    class_name: ACTOR_CLASSES[actor.class].class.to_owned(),
                    actor_id: Some(actor_id.clone()),
                    ..ActorDiedErrorContext::default()
                };
                let lifecycle = ActorLifecycleEvent {
                    actor_id: Some(actor_id),
                    state_transitions: vec![ActorStateTransition {
                        state: ActorState::DEAD,
                        timestamp: at(now),
                        node_id: None,
                        worker_id: None,
                        repr_name: String::new(),
                        death_cause: Some(ActorDeathCause {
                            actor_died_error_context: Some(death),
                            ..ActorDeathCause::default()
                        }),
                        pid: 0,
                        port: 0,
                        restart_reason: ActorRestartReason::ACTOR_FAILURE,
                    }],
                };
                self.send_gcs(P::ActorLifecycle(Box::new(lifecycle)), now);
            }
            let lifecycle = DriverJobLifecycleEvent {
                job_id: Some(Id::from_bytes(&job.id)),
                state_transitions: vec![StateTransition {
                    state: DriverJobState::FINISHED,
                    timestamp: at(now),
                }],
            };
            self.send_gcs(P::DriverJobLifecycle(Box::new(lifecycle)), now);
        }
        let end_ms = now / 1_000_000;
        for node in 0..self.settings.nodes as usize {
            for worker in self.workers[node].clone() {
                let lifecycle = WorkerLifecycleEvent {
                    worker_id: Some(worker.id.clone()),
                    job_id: None,
                    state_transitions: vec![WorkerStateTransition {
                        state: WorkerState::DEAD,
                        timestamp: at(now),
                        worker_launch_time_ms: 0,
                        worker_launched_time_ms: 0,
                        start_time_ms: 0,
                        end_time_ms: end_ms,
                        death_info: Some(WorkerDeathInfo {
                            exit_type: WorkerExitType::INTENDED_USER_EXIT,
                            exit_detail: "Worker force exited because its job has finished"
                                .to_owned(),
                            memory_used_bytes: None,
                        }),
                    }],
                };
                self.send_gcs(P::WorkerLifecycle(Box::new(lifecycle)), now);
            }
        }
    }

    fn worker_started(&mut self, worker: &Worker, now: i64) {
        let definition = WorkerDefinitionEvent {
            worker_id: Some(worker.id.clone()),
            node_id: self.node_ids.get(worker.node as usize).cloned(),
            worker_type: WorkerType::WORKER,
            pid: worker.pid,
        };
        self.send_gcs(P::WorkerDefinition(Box::new(definition)), now);
        let ms = now / 1_000_000;
        let lifecycle = WorkerLifecycleEvent {
            worker_id: Some(worker.id.clone()),
            job_id: None,
            state_transitions: vec![WorkerStateTransition {
                state: WorkerState::ALIVE,
                timestamp: at(now),
                worker_launch_time_ms: ms - 900,
                worker_launched_time_ms: ms - 30,
                start_time_ms: ms,
                end_time_ms: 0,
                death_info: None,
            }],
        };
        self.send_gcs(P::WorkerLifecycle(Box::new(lifecycle)), now);
    }

    fn job_started(&mut self, job: &Job, now: i64) {
        let job_id = Some(Id::from_bytes(&job.id));
        let submission = format!("raysubmit_{:016x}", self.rng.next_u64());
        let definition = DriverJobDefinitionEvent {
            job_id: job_id.clone(),
            driver_pid: i64::from(job.driver_worker.pid),
            driver_node_id: self.node_ids.get(job.driver_node as usize).cloned(),
            entrypoint: format!(
                "python -m pipeline.run --config jobs/{}.yaml",
                u32::from_le_bytes(job.id)
            ),
            config: DriverJobConfig {
                serialized_runtime_env: "{}".to_owned(),
                metadata: BTreeMap::from([("job_submission_id".to_owned(), submission)]),
            },
        };
        self.send_gcs(P::DriverJobDefinition(Box::new(definition)), now);
        let lifecycle = DriverJobLifecycleEvent {
            job_id: job_id.clone(),
            state_transitions: vec![StateTransition {
                state: DriverJobState::CREATED,
                timestamp: at(now),
            }],
        };
        self.send_gcs(P::DriverJobLifecycle(Box::new(lifecycle)), now);
        let task_id = Some(Id::from_bytes(&driver_task_id(job.id)));
        let definition = TaskDefinitionEvent {
            task_id: task_id.clone(),
            task_type: TaskType::DRIVER_TASK,
            language: Language::PYTHON,
            job_id: job_id.clone(),
            parent_task_id: Some(Id::from_bytes(&[0xff; 24])),
            placement_group_id: nil_placement_group(),
            ..TaskDefinitionEvent::default()
        };
        self.send_worker(
            job.driver_node,
            P::TaskDefinition(Box::new(definition)),
            now,
        );
        let lifecycle = TaskLifecycleEvent {
            task_id,
            state_transitions: vec![TaskStateTransition {
                state: TaskStatus::RUNNING,
                timestamp: at(now),
            }],
            job_id,
            ..TaskLifecycleEvent::default()
        };
        self.send_worker(job.driver_node, P::TaskLifecycle(Box::new(lifecycle)), now);
    }

    fn actor_started(&mut self, job: &Job, number: usize, now: i64) -> Actor {
        let class = (u32::from_le_bytes(job.id) as usize + number) % ACTOR_CLASSES.len();
        let mut id = [0u8; 16];
        self.rng.fill(&mut id[..12]);
        id[12..].copy_from_slice(&job.id);
        let node = self.rng.below(self.settings.nodes as usize) as u32;
        let worker = self.new_worker(node);
        self.worker_started(&worker, now);
        let actor = Actor { id, class, worker };
        let class_name = ACTOR_CLASSES[class].class;
        let module = ACTOR_CLASSES[class].module;
        let actor_id = Some(Id::from_bytes(&id));
        let definition = ActorDefinitionEvent {
            actor_id: actor_id.clone(),
            job_id: Some(Id::from_bytes(&job.id)),
            ray_namespace: "default".to_owned(),
            serialized_runtime_env: "{}".to_owned(),
            class_name: class_name.to_owned(),
            required_resources: cpu(1.0),
            ..ActorDefinitionEvent::default()
        };
        self.send_gcs(P::ActorDefinition(Box::new(definition)), now);
        let pending = ActorStateTransition {
            state: ActorState::PENDING_CREATION,
            timestamp: at(now),
            node_id: None,
            worker_id: None,
            repr_name: String::new(),
            death_cause: None,
            pid: 0,
            port: 0,
            restart_reason: ActorRestartReason::ACTOR_FAILURE,
        };
        let alive = ActorStateTransition {
            state: ActorState::ALIVE,
            timestamp: at(now + 900_000_000),
            node_id: self.node_ids.get(node as usize).cloned(),
            worker_id: Some(actor.worker.id.clone()),
            pid: actor.worker.pid,
            port: 20_000 + actor.worker.pid as i32,
            ..pending.clone()
        };
        let lifecycle = ActorLifecycleEvent {
            actor_id,
            state_transitions: vec![pending, alive],
        };
        self.send_gcs(P::ActorLifecycle(Box::new(lifecycle)), now);
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
            created_ns: now,
            duration_ns: 850_000_000,
            outcome: Outcome::Finished,
        };
        self.emit_attempt(&spec);
        actor
    }

    /// One task: its attempts, each with its events.
    pub(crate) fn task(&mut self) {
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
                .entry(error_type.to_string())
                .or_default() += 1;
        }

        let task_id = Some(Id::from_bytes(&spec.task_id));
        let job_id = Some(Id::from_bytes(&spec.job_id));
        let parent_task_id = Some(Id::from_bytes(
            &spec.parent.unwrap_or_else(|| driver_task_id(spec.job_id)),
        ));
        let created = spec.created_ns;
        let pending_node = created + 40_000 + self.rng.below(40_000) as i64;
        let submitted = pending_node + (2e6 * self.rng.log_normal(0.8)) as i64;
        let running = submitted + 300_000 + self.rng.below(400_000) as i64;
        let ended = running + spec.duration_ns;
        let lifecycle = |transitions: &[(TaskStatus, i64)]| TaskLifecycleEvent {
            task_id: task_id.clone(),
            task_attempt: spec.attempt,
            state_transitions: transitions
                .iter()
                .map(|(state, ns)| TaskStateTransition {
                    state: state.clone(),
                    timestamp: at(*ns),
                })
                .collect(),
            job_id: job_id.clone(),
            ..TaskLifecycleEvent::default()
        };

        // Definition, from the owner.
        let function = PythonFunctionDescriptor {
            module_name: spec.module.clone(),
            class_name: spec.class.clone(),
            function_name: spec.function.clone(),
            function_hash: String::new(),
        };
        let definition = match spec.kind {
            TaskKind::ActorMethod { actor } => {
                P::ActorTaskDefinition(Box::new(ActorTaskDefinitionEvent {
                    task_id: task_id.clone(),
                    task_attempt: spec.attempt,
                    language: Language::PYTHON,
                    actor_func: FunctionDescriptor {
                        python_function_descriptor: Some(function),
                        ..FunctionDescriptor::default()
                    },
                    actor_task_name: spec.name.clone(),
                    job_id: job_id.clone(),
                    actor_id: Some(Id::from_bytes(&actor)),
                    parent_task_id,
                    placement_group_id: nil_placement_group(),
                    serialized_runtime_env: "{}".to_owned(),
                    ..ActorTaskDefinitionEvent::default()
                }))
            }
            TaskKind::Normal | TaskKind::ActorCreation => {
                let normal = matches!(spec.kind, TaskKind::Normal);
                P::TaskDefinition(Box::new(TaskDefinitionEvent {
                    task_id: task_id.clone(),
                    task_attempt: spec.attempt,
                    task_type: if normal {
                        TaskType::NORMAL_TASK
                    } else {
                        TaskType::ACTOR_CREATION_TASK
                    },
                    language: Language::PYTHON,
                    task_func: FunctionDescriptor {
                        python_function_descriptor: Some(PythonFunctionDescriptor {
                            function_hash: format!(
                                "{:032x}",
                                u128::from(fnv(spec.function.as_bytes()))
                            ),
                            ..function
                        }),
                        ..FunctionDescriptor::default()
                    },
                    task_name: spec.name.clone(),
                    required_resources: if normal { cpu(1.0) } else { BTreeMap::new() },
                    job_id: job_id.clone(),
                    parent_task_id,
                    placement_group_id: nil_placement_group(),
                    serialized_runtime_env: r#"{"pip": ["pyarrow==21.0.0"]}"#.to_owned(),
                    ..TaskDefinitionEvent::default()
                }))
            }
        };
        self.send_worker(spec.owner_node, definition, created);

        // Owner-side transitions.
        let owner_side = lifecycle(&[
            (TaskStatus::PENDING_ARGS_AVAIL, created),
            (TaskStatus::PENDING_NODE_ASSIGNMENT, pending_node),
        ]);
        self.send_worker(
            spec.owner_node,
            P::TaskLifecycle(Box::new(owner_side)),
            pending_node,
        );

        if spec.outcome == Outcome::Cancelled {
            let cancelled = TaskLifecycleEvent {
                ray_error_info: Some(RayErrorInfo {
                    error_type: ErrorType::TASK_CANCELLED,
                    ..RayErrorInfo::default()
                }),
                ..lifecycle(&[(TaskStatus::FAILED, submitted)])
            };
            self.send_worker(
                spec.owner_node,
                P::TaskLifecycle(Box::new(cancelled)),
                submitted,
            );
            return;
        }

        // Executor side: RUNNING with the log position, then the end.
        let executor = &spec.executor;
        let log = format!(
            "/tmp/ray/{}/logs/worker-{:056x}-{:08x}-{}",
            self.session,
            fnv(executor.id.as_hex().as_bytes()),
            u32::from_le_bytes(spec.job_id),
            executor.pid
        );
        let offset = self.rng.below(5_000_000) as i64;
        let started = TaskLifecycleEvent {
            worker_pid: executor.pid,
            task_log_info: Some(TaskLogInfo {
                stdout_file: Some(format!("{log}.out")),
                stderr_file: Some(format!("{log}.err")),
                stdout_start: Some(offset),
                stdout_end: Some(offset),
                stderr_start: Some(offset),
                stderr_end: Some(offset),
            }),
            ..lifecycle(&[(TaskStatus::RUNNING, running)])
        };
        self.send_worker(executor.node, P::TaskLifecycle(Box::new(started)), running);

        let (end_state, ray_error_info) = match spec.outcome.error_type() {
            None => (TaskStatus::FINISHED, None),
            Some(error_type) => {
                let error_message = match spec.outcome {
                    Outcome::Exception => {
                        let exception = &EXCEPTIONS[self.rng.below(EXCEPTIONS.len())];
                        let line = 20 + self.rng.below(400) as u32;
                        let detail = self.rng.next_u64() % 100_000;
                        catalog::user_exception(
                            &spec.module,
                            &spec.function,
                            exception,
                            executor.pid,
                            line,
                            detail,
                        )
                    }
                    Outcome::OutOfMemory => catalog::OUT_OF_MEMORY_MESSAGE.to_owned(),
                    _ => catalog::WORKER_DIED_MESSAGE.to_owned(),
                };
                let error = RayErrorInfo {
                    error_message,
                    error_type,
                    actor_died_error: None,
                };
                (TaskStatus::FAILED, Some(error))
            }
        };
        let finished = TaskLifecycleEvent {
            ray_error_info,
            node_id: self.node_ids.get(executor.node as usize).cloned(),
            worker_id: Some(executor.id.clone()),
            ..lifecycle(&[
                (TaskStatus::SUBMITTED_TO_WORKER, submitted),
                (end_state, ended),
            ])
        };
        self.send_worker(executor.node, P::TaskLifecycle(Box::new(finished)), ended);

        if self.settings.profile {
            let profile = TaskProfileEvents {
                task_id,
                attempt_number: spec.attempt,
                job_id,
                profile_events: ProfileEvents {
                    component_type: "worker".to_owned(),
                    component_id: Some(executor.id.clone()),
                    node_ip_address: "10.0.0.1".to_owned(),
                    events: vec![ProfileEventEntry {
                        start_time: running,
                        end_time: ended,
                        extra_data: Some("{}".to_owned()),
                        event_name: "task:execute".to_owned(),
                    }],
                },
            };
            self.send_worker(executor.node, P::TaskProfile(Box::new(profile)), running);
        }
    }
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

/// FNV-1a, for stable made-up hashes.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}
