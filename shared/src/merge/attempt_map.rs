//! [`AttemptMap`]: task attempts by key (a run's, or stored versions being merged), kept in
//! the order first seen.

use std::collections::HashMap;

use super::{AttemptKey, TaskAttempt};

/// Task attempts by key: the attempts side by side in chunks of [`CHUNK`], a hash map from key
/// to place.
///
/// A map holding the attempts themselves would move every one of them each time it grew (an attempt
/// is hundreds of bytes) and touch them in hash order, a large share of applying a run's events.
/// One vector of attempts would still move them all at each doubling, into memory the kernel has to
/// fault in again. Chunks never move what they hold, and what reads every attempt (the rows
/// written, the drop) still walks memory in order.
#[derive(Clone, Debug, Default)]
pub struct AttemptMap {
    /// Full chunks, then at most one with room; every chunk was made with room for [`CHUNK`].
    chunks: Vec<Vec<(AttemptKey, TaskAttempt)>>,
    len: usize,
    places: HashMap<AttemptKey, usize, foldhash::fast::RandomState>,
}

/// Attempts per chunk: ~3 MB of them, so that a chunk's memory comes straight from the kernel
/// and the last chunk's unused room is small against a run's.
const CHUNK: usize = 4096;

impl AttemptMap {
    /// An empty map with room for `capacity` keys.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            chunks: Vec::with_capacity(capacity.div_ceil(CHUNK)),
            len: 0,
            places: HashMap::with_capacity_and_hasher(capacity, Default::default()),
        }
    }

    /// Number of attempts.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there is no attempt.
    pub fn is_empty(&self) -> bool {
        self.len == 0
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
                let attempt = new(&key);
                self.push(key, attempt)
            }
        };
        self.at_mut(place)
    }

    /// Merges `attempt` into the one at `key` ([`TaskAttempt::merge`]), or keeps it there
    /// when it is the first.
    pub fn merge_in(&mut self, key: AttemptKey, attempt: TaskAttempt) {
        match self.places.get(&key) {
            Some(&place) => self.at_mut(place).merge(attempt),
            None => {
                self.push(key, attempt);
            }
        }
    }

    /// Adds an attempt whose key is not in the map yet; returns its place.
    fn push(&mut self, key: AttemptKey, attempt: TaskAttempt) -> usize {
        let place = self.len;
        self.places.insert(key.clone(), place);
        match self.chunks.last_mut() {
            Some(chunk) if chunk.len() < CHUNK => chunk.push((key, attempt)),
            _ => {
                let mut chunk = Vec::with_capacity(CHUNK);
                chunk.push((key, attempt));
                self.chunks.push(chunk);
            }
        }
        self.len += 1;
        place
    }

    /// The attempt at `place`, which [`Self::push`] returned.
    fn at_mut(&mut self, place: usize) -> &mut TaskAttempt {
        // Every chunk but the last is full, so a place names exactly one slot; places come only
        // from `push`, and nothing is ever removed: this cannot panic.
        &mut self.chunks[place / CHUNK][place % CHUNK].1
    }

    /// The attempts, in the order first seen.
    pub fn into_values(self) -> Vec<TaskAttempt> {
        self.chunks
            .into_iter()
            .flatten()
            .map(|(_, attempt)| attempt)
            .collect()
    }

    /// The key as stored and the attempt at `key`.
    pub fn get_key_value(&self, key: &AttemptKey) -> Option<(&AttemptKey, &TaskAttempt)> {
        let place = *self.places.get(key)?;
        let (key, attempt) = self.chunks.get(place / CHUNK)?.get(place % CHUNK)?;
        Some((key, attempt))
    }

    /// The attempt at `key`.
    pub fn get(&self, key: &AttemptKey) -> Option<&TaskAttempt> {
        self.get_key_value(key).map(|(_, attempt)| attempt)
    }

    /// Every attempt with its key, in the order first seen.
    pub fn iter(&self) -> impl Iterator<Item = (&AttemptKey, &TaskAttempt)> + '_ {
        self.chunks
            .iter()
            .flatten()
            .map(|(key, attempt)| (key, attempt))
    }

    /// Every key, in the order first seen.
    pub fn keys(&self) -> impl Iterator<Item = &AttemptKey> + '_ {
        self.iter().map(|(key, _)| key)
    }

    /// Every attempt, in the order first seen.
    pub fn values(&self) -> impl Iterator<Item = &TaskAttempt> + '_ {
        self.iter().map(|(_, attempt)| attempt)
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

    #[test]
    fn attempts_past_a_chunk_keep_their_order_and_places() -> Result<(), &'static str> {
        let keys: Vec<AttemptKey> = (0..2 * CHUNK + 5)
            .map(|number| key(&format!("{number:08x}"), 0))
            .collect::<Option<_>>()
            .ok_or("hex")?;
        let mut map = AttemptMap::with_capacity(10);
        for key in &keys {
            map.get_or_insert_with(key.clone(), TaskAttempt::new);
        }
        let job = Id::from_hex("01000000").ok_or("hex")?;
        for key in [&keys[CHUNK - 1], &keys[CHUNK], &keys[2 * CHUNK + 4]] {
            let mut later = TaskAttempt::new(key);
            later.job_id = Some(job.clone());
            map.merge_in(key.clone(), later);
            map.get_or_insert_with(key.clone(), |_| TaskAttempt::default())
                .attempt_number += 1;
        }
        assert_eq!(map.len(), keys.len());
        assert!(map.keys().eq(keys.iter()), "in the order first seen");
        for (at, key) in keys.iter().enumerate() {
            let attempt = map.get(key).ok_or("every attempt is found")?;
            assert_eq!(attempt.task_id.as_ref(), Some(&key.task_id));
            let touched = [CHUNK - 1, CHUNK, 2 * CHUNK + 4].contains(&at);
            assert_eq!(attempt.job_id.is_some(), touched, "{at}");
            assert_eq!(attempt.attempt_number, i32::from(touched), "{at}");
        }
        let values = map.into_values();
        assert!(
            values
                .iter()
                .map(|attempt| attempt.task_id.as_ref())
                .eq(keys.iter().map(|key| Some(&key.task_id)))
        );
        Ok(())
    }
}
