//! The failures Ray synthesizes for attempts that never reported an end: when the worker
//! running one dies, or its job finishes, the state API shows it `FAILED` with `WORKER_DIED`.
//! [`FailureContext`] collects the job ends and worker deaths that decide it, under the same
//! contract as every merge here: order and repetition never change the result.

use std::collections::BTreeMap;

use super::ReportedError;
use crate::event::EventPayload;
use crate::event::cluster::{DriverJobState, WorkerState};
use crate::event::encoding::Id;

/// What Ray's failure synthesis needs to know: when jobs ended and workers died.
#[derive(Clone, Debug, Default)]
pub struct FailureContext {
    /// Job id → end time (ns) of finished jobs.
    pub job_ends: BTreeMap<Id, i64>,
    /// Worker id → how it died.
    pub worker_deaths: BTreeMap<Id, WorkerDeath>,
}

impl FailureContext {
    /// Merges in what another context knows (the same rules as [`FailureContext::apply`]).
    pub fn merge(&mut self, other: &Self) {
        for (job, &end) in &other.job_ends {
            self.record_job_end(job, end);
        }
        for (worker, death) in &other.worker_deaths {
            self.record_worker_death(worker, death.clone());
        }
    }

    fn record_job_end(&mut self, job: &Id, at: i64) {
        let end = self.job_ends.entry(job.clone()).or_insert(at);
        *end = (*end).max(at);
    }

    fn record_worker_death(&mut self, worker: &Id, death: WorkerDeath) {
        let slot = self
            .worker_deaths
            .entry(worker.clone())
            .or_insert_with(|| death.clone());
        if (death.at, &death.detail) > (slot.at, &slot.detail) {
            *slot = death;
        }
    }

    /// Applies a job or worker lifecycle event; other events are ignored. Like every merge
    /// here, the result does not depend on order or repetition.
    pub fn apply(&mut self, payload: &EventPayload) {
        match payload {
            EventPayload::DriverJobLifecycle(event) => {
                let Some(job) = &event.job_id else { return };
                for transition in &event.state_transitions {
                    if transition.state == DriverJobState::FINISHED {
                        self.record_job_end(job, transition.timestamp.nanos());
                    }
                }
            }
            EventPayload::WorkerLifecycle(event) => {
                let Some(worker) = &event.worker_id else {
                    return;
                };
                for transition in &event.state_transitions {
                    if transition.state != WorkerState::DEAD {
                        continue;
                    }
                    let at = if transition.end_time_ms > 0 {
                        transition.end_time_ms.saturating_mul(1_000_000)
                    } else {
                        transition.timestamp.nanos()
                    };
                    let (exit_type_number, detail) = transition
                        .death_info
                        .as_ref()
                        .map(|info| {
                            (
                                info.exit_type.number().unwrap_or(0),
                                info.exit_detail.clone(),
                            )
                        })
                        .unwrap_or_default();
                    self.record_worker_death(
                        worker,
                        WorkerDeath {
                            at,
                            exit_type_number,
                            detail,
                        },
                    );
                }
            }
            _ => {}
        }
    }

    /// The failure Ray synthesizes for an unfinished attempt of `job` run by `worker`, and when
    /// (ns): the worker's death, else the job's end, else none.
    pub(super) fn synthesized_failure(
        &self,
        job: Option<&Id>,
        worker: Option<&Id>,
    ) -> Option<(i64, ReportedError)> {
        // Worker death is checked first: it is the more specific cause, and Ray marks it
        // 1 s after the death versus 15 s after the job ends.
        if let Some(worker) = worker
            && let Some(death) = self.worker_deaths.get(worker)
        {
            return Some((
                death.at,
                ReportedError {
                    error_type: "WORKER_DIED".to_owned(),
                    message: format!(
                        "Worker running the task ({}) died with exit_type: {} with error_message: {}",
                        worker.as_hex(),
                        death.exit_type_number,
                        death.detail
                    ),
                },
            ));
        }
        let job = job?;
        let &ended = self.job_ends.get(job)?;
        Some((
            ended,
            ReportedError {
                error_type: "WORKER_DIED".to_owned(),
                message: format!(
                    "Job finishes ({job}) as driver exits. Marking all non-terminal tasks as failed."
                ),
            },
        ))
    }
}

/// A worker's death, as its lifecycle event reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerDeath {
    /// End time (ns): the worker's `end_time_ms`, or the transition time if that is unset.
    pub at: i64,
    /// `WorkerExitType` number, as Ray prints it in the message.
    pub exit_type_number: i32,
    /// Exit detail.
    pub detail: String,
}

#[cfg(test)]
mod tests {
    use crate::event::common::TaskStatus;
    use crate::merge::test_events::{NODE, TASK, WORKER, lifecycle, ms, only, time};

    #[test]
    fn a_finished_job_fails_its_unfinished_attempts_at_the_job_end() {
        let job_end = format!(
            r#"{{"eventType": "DRIVER_JOB_LIFECYCLE_EVENT", "timestamp": "{}", "driverJobLifecycleEvent": {{"jobId": "AQAAAA==", "stateTransitions": [{{"state": "FINISHED", "timestamp": "{}"}}]}}}}"#,
            time(30),
            time(30)
        );
        let view = only(&[
            lifecycle(TASK, 5, &[("PENDING_ARGS_AVAIL", 2), ("RUNNING", 5)], ""),
            job_end.clone(),
        ]);
        assert_eq!(view.state, TaskStatus::FAILED);
        assert!(view.synthesized_failure);
        assert_eq!(view.error_type.as_deref(), Some("WORKER_DIED"));
        assert_eq!(
            view.error_message.as_deref(),
            Some(
                "Job finishes (01000000) as driver exits. Marking all non-terminal tasks as failed."
            )
        );
        assert_eq!(view.end_time_ms, ms(30));
        // A terminal state reported at any time, even after the job end arrived, wins.
        let view = only(&[
            lifecycle(TASK, 5, &[("RUNNING", 5), ("FINISHED", 6)], ""),
            job_end,
        ]);
        assert_eq!(view.state, TaskStatus::FINISHED);
        assert!(!view.synthesized_failure);
    }

    #[test]
    fn a_dead_worker_fails_its_unfinished_attempts_at_its_end_time() {
        let death = format!(
            r#"{{"eventType": "WORKER_LIFECYCLE_EVENT", "timestamp": "{}", "workerLifecycleEvent": {{"workerId": "{WORKER}", "stateTransitions": [{{"state": "DEAD", "timestamp": "{}", "endTimeMs": "1795328060000", "deathInfo": {{"exitType": "SYSTEM_ERROR", "exitDetail": "killed"}}}}]}}}}"#,
            time(21),
            time(21)
        );
        let view = only(&[
            lifecycle(
                TASK,
                3,
                &[("SUBMITTED_TO_WORKER", 3)],
                &format!(r#", "nodeId": "{NODE}", "workerId": "{WORKER}""#),
            ),
            death,
        ]);
        assert_eq!(view.state, TaskStatus::FAILED);
        assert_eq!(view.end_time_ms, Some(1_795_328_060_000));
        let message = view.error_message.unwrap_or_default();
        assert!(
            message.starts_with("Worker running the task (f19cb71a"),
            "{message}"
        );
        assert!(
            message.ends_with("died with exit_type: 0 with error_message: killed"),
            "{message}"
        );
    }
}
