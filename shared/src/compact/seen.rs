//! [`SeenEvents`]: which events a compaction run has already taken, by event id.

use std::collections::HashSet;

use crate::event::encoding::EventId;

/// The event ids a run has taken, so that a re-delivered copy is dropped.
///
/// Held as the ids are, inline: a set of hex ids hashed and compared their text through a
/// pointer, and took and released a reference count on each, which was a twentieth of a run's
/// CPU and all on the thread that folds (perf).
#[derive(Default)]
pub(super) struct SeenEvents(HashSet<EventId, foldhash::fast::RandomState>);

impl SeenEvents {
    /// Makes room for `more` ids.
    pub(super) fn reserve(&mut self, more: usize) {
        self.0.reserve(more);
    }

    /// True the first time `id` is given.
    pub(super) fn first_time(&mut self, id: &EventId) -> bool {
        self.0.insert(id.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_new_once_whatever_its_length() {
        // The same bytes at two lengths, a Ray-sized id, and one too long to keep inline.
        let ids = [
            EventId::from_bytes(&[0]),
            EventId::from_bytes(&[0, 0]),
            EventId::from_bytes(&[0xab; 28]),
            EventId::from_bytes(&[0xcd; 40]),
        ];
        let mut seen = SeenEvents::default();
        let first: Vec<bool> = ids.iter().map(|id| seen.first_time(id)).collect();
        let again: Vec<bool> = ids.iter().map(|id| seen.first_time(id)).collect();
        assert_eq!(first, [true; 4]);
        assert_eq!(again, [false; 4]);
    }
}
