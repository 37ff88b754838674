//! The budget of new sessions: how many sessions a cluster may start per minute on one ingest
//! instance.
//!
//! Every distinct session a cluster sends becomes, once compacted, a manifest, a catalog entry
//! and a quiet check: state that every cluster's compactions and queries share. A Ray cluster
//! starts one session at each `ray start`; a token holder sending made-up session names could
//! start thousands a minute. [`SessionAdmission`] admits a body only while its
//! cluster's sessions not seen before stay within the budget; sessions already seen always pass,
//! so a cluster's running session is never refused.
//!
//! The state is in memory, per ingest instance (one Lambda sandbox, or one `serve`), so with `C`
//! instances running at once a cluster may start `C` times the budget. It is bounded: it
//! remembers the [`REMEMBERED_SESSIONS`] (cluster, session) pairs seen most recently, and per
//! cluster the times of its admissions within the last [`SESSION_WINDOW`]. It does no I/O and
//! reads no clock: callers pass `now`, so tests move time without waiting.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::keys::ClusterName;

/// The rolling window the budget counts admissions of new sessions in.
pub const SESSION_WINDOW: Duration = Duration::from_secs(60);

/// Most (cluster, session) pairs one instance remembers, and most clusters whose recent
/// admissions it counts. A pair forgotten (the least recently seen goes first) counts as new
/// when it comes back.
pub const REMEMBERED_SESSIONS: usize = 10_000;

/// A body refused because its new sessions would pass its cluster's budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{new_sessions} new sessions would pass the cluster's budget; retry in {retry_after:?}")]
pub struct OverBudget {
    /// Sessions of the body this instance had not seen for the cluster.
    pub new_sessions: usize,
    /// How long until enough of the cluster's earlier admissions leave the window for the body
    /// to pass ([`SESSION_WINDOW`] when the body alone starts more sessions than the budget).
    pub retry_after: Duration,
}

/// Which sessions each cluster has been seen sending, and how many new ones it started lately.
/// Shared by every request an instance serves.
pub struct SessionAdmission {
    per_window: usize,
    capacity: usize,
    state: Mutex<State>,
}

/// The remembered pairs, least recently seen first, and the recent admissions per cluster.
#[derive(Default)]
struct State {
    /// Cluster → session → the tick it was last seen at.
    seen: HashMap<ClusterName, HashMap<Box<str>, u64>>,
    /// The same pairs by tick: the first is the least recently seen.
    by_tick: BTreeMap<u64, (ClusterName, Box<str>)>,
    /// The tick the next sighting gets.
    next_tick: u64,
    /// Per cluster, when each of its new sessions was admitted, oldest first.
    windows: HashMap<ClusterName, VecDeque<Instant>>,
}

impl SessionAdmission {
    /// Admits at most `per_window` new sessions per cluster per [`SESSION_WINDOW`] (at least
    /// one), remembering at most `capacity` pairs and clusters (at least one).
    pub fn new(per_window: usize, capacity: usize) -> Self {
        Self {
            per_window: per_window.max(1),
            capacity: capacity.max(1),
            state: Mutex::new(State::default()),
        }
    }

    /// New sessions admitted per cluster per [`SESSION_WINDOW`].
    pub fn per_window(&self) -> usize {
        self.per_window
    }

    /// Admits a body of `cluster` carrying `sessions` at `now`: every session already seen for
    /// the cluster passes; those not seen pass together only while the cluster's admissions
    /// within the window stay within the budget, and are then remembered. Refused, nothing is
    /// recorded, so the body's retry is judged afresh.
    pub fn admit(
        &self,
        cluster: &ClusterName,
        sessions: &[&str],
        now: Instant,
    ) -> Result<(), OverBudget> {
        // A panic elsewhere while holding the lock leaves the maps consistent: each update
        // below completes without calling out.
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut new: Vec<&str> = sessions
            .iter()
            .copied()
            .filter(|session| !state.knows(cluster, session))
            .collect();
        new.sort_unstable();
        new.dedup();
        if !new.is_empty() {
            let window = state.windows.entry(cluster.clone()).or_default();
            while let Some(&oldest) = window.front()
                && now.saturating_duration_since(oldest) >= SESSION_WINDOW
            {
                window.pop_front();
            }
            let wanted = window.len().saturating_add(new.len());
            if wanted > self.per_window {
                // The body passes once `wanted - per_window` earlier admissions have left.
                let retry_after = (wanted - self.per_window)
                    .checked_sub(1)
                    .and_then(|index| window.get(index))
                    .and_then(|admitted| admitted.checked_add(SESSION_WINDOW))
                    .map_or(SESSION_WINDOW, |free| free.saturating_duration_since(now));
                if window.is_empty() {
                    state.windows.remove(cluster);
                }
                return Err(OverBudget {
                    new_sessions: new.len(),
                    retry_after,
                });
            }
            window.extend(std::iter::repeat_n(now, new.len()));
            state.bound_windows(now, self.capacity);
        }
        for session in sessions {
            state.touch(cluster, session, self.capacity);
        }
        Ok(())
    }
}

/// The settings only: the state holds up to [`REMEMBERED_SESSIONS`] pairs.
impl std::fmt::Debug for SessionAdmission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionAdmission")
            .field("per_window", &self.per_window)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl State {
    /// Whether `session` of `cluster` is remembered.
    fn knows(&self, cluster: &ClusterName, session: &str) -> bool {
        self.seen
            .get(cluster)
            .is_some_and(|sessions| sessions.contains_key(session))
    }

    /// Marks `session` of `cluster` as the most recently seen pair, forgetting the least
    /// recently seen ones past `capacity`.
    fn touch(&mut self, cluster: &ClusterName, session: &str, capacity: usize) {
        let tick = self.next_tick;
        self.next_tick = self.next_tick.wrapping_add(1);
        if let Some(last) = self
            .seen
            .get_mut(cluster)
            .and_then(|sessions| sessions.get_mut(session))
        {
            let previous = std::mem::replace(last, tick);
            if let Some(pair) = self.by_tick.remove(&previous) {
                self.by_tick.insert(tick, pair);
            }
            return;
        }
        self.seen
            .entry(cluster.clone())
            .or_default()
            .insert(session.into(), tick);
        self.by_tick.insert(tick, (cluster.clone(), session.into()));
        while self.by_tick.len() > capacity {
            let Some((_, (old_cluster, old_session))) = self.by_tick.pop_first() else {
                break;
            };
            if let Some(sessions) = self.seen.get_mut(&old_cluster) {
                sessions.remove(&old_session);
                if sessions.is_empty() {
                    self.seen.remove(&old_cluster);
                }
            }
        }
    }

    /// Keeps at most `capacity` clusters' windows: those with no admission left in the window
    /// go first, then those whose latest admission is oldest (that cluster's count restarts).
    fn bound_windows(&mut self, now: Instant, capacity: usize) {
        if self.windows.len() <= capacity {
            return;
        }
        self.windows.retain(|_, window| {
            window
                .back()
                .is_some_and(|&latest| now.saturating_duration_since(latest) < SESSION_WINDOW)
        });
        while self.windows.len() > capacity {
            let oldest = self
                .windows
                .iter()
                .min_by_key(|(_, window)| window.back().copied())
                .map(|(cluster, _)| cluster.clone());
            let Some(cluster) = oldest else {
                break;
            };
            self.windows.remove(&cluster);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(name: &str) -> Result<ClusterName, Box<dyn std::error::Error>> {
        Ok(ClusterName::new(name)?)
    }

    fn later(start: Instant, seconds: u64) -> Result<Instant, Box<dyn std::error::Error>> {
        Ok(start
            .checked_add(Duration::from_secs(seconds))
            .ok_or("instant overflow")?)
    }

    #[test]
    fn sessions_already_seen_pass_past_the_budget() -> Result<(), Box<dyn std::error::Error>> {
        let admission = SessionAdmission::new(2, 100);
        let (a, now) = (cluster("a")?, Instant::now());
        admission.admit(&a, &["s1"], now)?;
        admission.admit(&a, &["s2"], now)?;
        let refused = admission.admit(&a, &["s3"], now);
        assert_eq!(
            refused,
            Err(OverBudget {
                new_sessions: 1,
                retry_after: SESSION_WINDOW
            })
        );
        admission.admit(&a, &["s1", "s2"], now)?;
        // Another cluster has a budget of its own.
        admission.admit(&cluster("b")?, &["s3"], now)?;
        Ok(())
    }

    #[test]
    fn a_refused_body_admits_none_of_its_sessions() -> Result<(), Box<dyn std::error::Error>> {
        let admission = SessionAdmission::new(2, 100);
        let (a, now) = (cluster("a")?, Instant::now());
        admission.admit(&a, &["s1"], now)?;
        assert!(admission.admit(&a, &["s2", "s3"], now).is_err());
        // Neither s2 nor s3 was recorded: one of them still fits.
        admission.admit(&a, &["s3"], now)?;
        assert!(admission.admit(&a, &["s2"], now).is_err());
        Ok(())
    }

    #[test]
    fn the_window_rolls() -> Result<(), Box<dyn std::error::Error>> {
        let admission = SessionAdmission::new(2, 100);
        let (a, start) = (cluster("a")?, Instant::now());
        admission.admit(&a, &["s1"], start)?;
        admission.admit(&a, &["s2"], later(start, 30)?)?;
        let refused = admission.admit(&a, &["s3"], later(start, 50)?);
        assert_eq!(
            refused.map_err(|over| over.retry_after),
            Err(Duration::from_secs(10))
        );
        // s1's admission has left the window; s2's has not.
        admission.admit(&a, &["s3"], later(start, 60)?)?;
        assert!(admission.admit(&a, &["s4"], later(start, 89)?).is_err());
        admission.admit(&a, &["s4"], later(start, 90)?)?;
        Ok(())
    }

    #[test]
    fn memory_stays_bounded_by_the_least_recently_seen() -> Result<(), Box<dyn std::error::Error>> {
        let capacity = 3;
        let admission = SessionAdmission::new(1_000, capacity);
        let a = cluster("a")?;
        let start = Instant::now();
        for index in 0..10 {
            admission.admit(&a, &[format!("s{index}").as_str()], start)?;
        }
        // s7 seen again, then one more: s8 is the least recently seen and goes.
        admission.admit(&a, &["s7"], start)?;
        admission.admit(&a, &["s10"], start)?;
        {
            let state = admission.state.lock().map_err(|_| "poisoned")?;
            assert_eq!(state.by_tick.len(), capacity);
            let remembered: usize = state.seen.values().map(HashMap::len).sum();
            assert_eq!(remembered, capacity);
            for kept in ["s7", "s9", "s10"] {
                assert!(state.knows(&a, kept), "{kept} forgotten");
            }
            assert!(!state.knows(&a, "s8"));
        }

        // Many clusters at once: at most `capacity` windows are kept.
        for index in 0..10 {
            let other = cluster(&format!("c{index}"))?;
            admission.admit(&other, &["s"], later(start, index)?)?;
        }
        let state = admission.state.lock().map_err(|_| "poisoned")?;
        assert!(state.windows.len() <= capacity, "{}", state.windows.len());
        assert!(state.seen.len() <= capacity);
        assert_eq!(state.by_tick.len(), capacity);
        Ok(())
    }
}
