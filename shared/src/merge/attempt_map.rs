//! [`AttemptMap`]: task attempts by key (a fold's, or stored versions being merged), kept in
//! the order first seen.

use std::collections::HashMap;

use super::{AttemptKey, TaskAttempt};

/// Task attempts by key: the attempts side by side in a vector, a hash map from key to place.
///
/// A map holding the attempts themselves moved every one of them each time it grew (an
/// attempt is hundreds of bytes) and touched them in hash order: growing was a fifth of a
/// run's fold (perf). Here growing moves small entries, and what reads every attempt (the
/// rows written, the drop) walks memory in order.
#[derive(Clone, Debug, Default)]
pub struct AttemptMap {
    attempts: Vec<(AttemptKey, TaskAttempt)>,
    places: HashMap<AttemptKey, usize, foldhash::fast::RandomState>,
}

impl AttemptMap {
    /// An empty map with room for `capacity` attempts.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            attempts: Vec::with_capacity(capacity),
            places: HashMap::with_capacity_and_hasher(capacity, Default::default()),
        }
    }

    /// Number of attempts.
    pub fn len(&self) -> usize {
        self.attempts.len()
    }

    /// True when there is no attempt.
    pub fn is_empty(&self) -> bool {
        self.attempts.is_empty()
    }

    /// The attempt at `key`, made by `new` from the key when there is none yet.
    pub fn get_or_insert_with(
        &mut self,
        key: AttemptKey,
        new: impl FnOnce(&AttemptKey) -> TaskAttempt,
    ) -> &mut TaskAttempt {
        let place = match self.places.get(&key) {
            Some(place) => *place,
            None => {
                let place = self.attempts.len();
                self.places.insert(key.clone(), place);
                let attempt = new(&key);
                self.attempts.push((key, attempt));
                place
            }
        };
        // `places` only names places of `attempts`, which never shrinks: this cannot panic.
        &mut self.attempts[place].1
    }

    /// Merges `attempt` into the one at `key` ([`TaskAttempt::merge`]), or keeps it there
    /// when it is the first.
    pub fn merge_in(&mut self, key: AttemptKey, attempt: TaskAttempt) {
        match self
            .places
            .get(&key)
            .and_then(|&place| self.attempts.get_mut(place))
        {
            Some((_, existing)) => existing.merge(attempt),
            None => {
                self.places.insert(key.clone(), self.attempts.len());
                self.attempts.push((key, attempt));
            }
        }
    }

    /// The attempts, in the order first seen.
    pub fn into_values(self) -> Vec<TaskAttempt> {
        self.attempts
            .into_iter()
            .map(|(_, attempt)| attempt)
            .collect()
    }

    /// The key as stored and the attempt at `key`.
    pub fn get_key_value(&self, key: &AttemptKey) -> Option<(&AttemptKey, &TaskAttempt)> {
        let (key, attempt) = self.attempts.get(*self.places.get(key)?)?;
        Some((key, attempt))
    }

    /// The attempt at `key`.
    pub fn get(&self, key: &AttemptKey) -> Option<&TaskAttempt> {
        self.get_key_value(key).map(|(_, attempt)| attempt)
    }

    /// Every attempt with its key, in the order first seen.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&AttemptKey, &TaskAttempt)> + '_ {
        self.attempts.iter().map(|(key, attempt)| (key, attempt))
    }

    /// Every key, in the order first seen.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &AttemptKey> + '_ {
        self.attempts.iter().map(|(key, _)| key)
    }

    /// Every attempt, in the order first seen.
    pub fn values(&self) -> impl ExactSizeIterator<Item = &TaskAttempt> + '_ {
        self.attempts.iter().map(|(_, attempt)| attempt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::encoding::Id;

    fn key(hex: &str, attempt_number: i32) -> Option<AttemptKey> {
        Some(AttemptKey {
            task_id: Id::from_hex(hex)?,
            attempt_number,
        })
    }

    #[test]
    fn an_attempt_is_made_or_merged_once_and_found_by_its_key() -> Result<(), &'static str> {
        let keys = [key("aa", 0), key("bb", 0), key("aa", 1)];
        let keys: Vec<AttemptKey> = keys.into_iter().collect::<Option<_>>().ok_or("hex")?;
        let mut map = AttemptMap::default();
        let mut made = 0;
        for key in keys.iter().chain(&keys) {
            map.get_or_insert_with(key.clone(), |key| {
                made += 1;
                TaskAttempt::new(key)
            });
        }
        assert_eq!((made, map.len()), (3, 3), "one attempt per key");
        let found: Vec<&AttemptKey> = map.keys().collect();
        assert_eq!(
            found,
            keys.iter().collect::<Vec<_>>(),
            "in the order first seen"
        );
        for key in &keys {
            let attempt = map.get(key).ok_or("an attempt made is found")?;
            assert_eq!(
                (attempt.task_id.as_ref(), attempt.attempt_number),
                (Some(&key.task_id), key.attempt_number)
            );
        }
        // A second view of an attempt is merged into the first, not kept beside it.
        let job = Id::from_hex("01000000").ok_or("hex")?;
        let mut later = TaskAttempt::new(&keys[1]);
        later.job_id = Some(job.clone());
        map.merge_in(keys[1].clone(), later);
        assert_eq!(map.len(), 3);
        assert_eq!(
            map.get(&keys[1])
                .and_then(|attempt| attempt.job_id.as_ref()),
            Some(&job)
        );
        let values = map.clone().into_values();
        assert_eq!(values.len(), 3);
        assert_eq!(
            values[1].job_id.as_ref(),
            Some(&job),
            "in the order first seen"
        );
        let other = key("bb", 1).ok_or("hex")?;
        assert!(map.get(&other).is_none());
        Ok(())
    }
}
