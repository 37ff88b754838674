//! [`SeenEvents`]: which events a compaction run has already taken, by event id.

use std::hash::BuildHasher;

use hashbrown::hash_table::{Entry, HashTable};

use crate::event::encoding::EventId;

/// The event ids a run has taken, so that a re-delivered copy is dropped.
///
/// The ids are kept in the order taken; the table holds only each one's place and a 32-bit
/// fingerprint of it, and compares ids only where fingerprints match. A set of the ids
/// themselves (40 bytes a slot, in a table twice the size of a run's ids) would miss the cache
/// on nearly every insert, all on the thread that applies the events; 8-byte slots keep the
/// table small enough to miss far less.
pub(super) struct SeenEvents<S = foldhash::fast::RandomState> {
    ids: Vec<EventId>,
    places: HashTable<Slot>,
    hasher: S,
}

/// An id's place in [`SeenEvents::ids`], with its fingerprint.
struct Slot {
    fingerprint: u32,
    place: u32,
}

impl Slot {
    /// The table's hash of the id: its fingerprint in both halves, so that the bits the table
    /// picks a bucket by (the low ones) and those it tags a slot with (the high seven) are all
    /// the fingerprint's, and a slot can be hashed again without its id when the table grows.
    fn hash(fingerprint: u32) -> u64 {
        u64::from(fingerprint) * 0x1_0000_0001
    }
}

impl Default for SeenEvents {
    fn default() -> Self {
        Self::with_hasher(foldhash::fast::RandomState::default())
    }
}

impl<S: BuildHasher> SeenEvents<S> {
    /// An empty set whose fingerprints `hasher` makes.
    fn with_hasher(hasher: S) -> Self {
        Self {
            ids: Vec::new(),
            places: HashTable::new(),
            hasher,
        }
    }

    /// Makes room for `more` ids.
    pub(super) fn reserve(&mut self, more: usize) {
        self.ids.reserve(more);
        self.places
            .reserve(more, |slot| Slot::hash(slot.fingerprint));
    }

    /// True the first time `id` is given.
    pub(super) fn first_time(&mut self, id: &EventId) -> bool {
        // Truncated: the table needs only 32 bits, and equal ids always share them.
        let fingerprint = self.hasher.hash_one(id) as u32;
        let Ok(place) = u32::try_from(self.ids.len()) else {
            // Past four billion ids in one run every id is new: applying a copy again changes
            // no row (the merge is idempotent); it only goes uncounted as a duplicate.
            return true;
        };
        let ids = &self.ids;
        let entry = self.places.entry(
            Slot::hash(fingerprint),
            |slot| {
                slot.fingerprint == fingerprint
                    && usize::try_from(slot.place)
                        .ok()
                        .and_then(|place| ids.get(place))
                        == Some(id)
            },
            |slot| Slot::hash(slot.fingerprint),
        );
        match entry {
            Entry::Occupied(_) => false,
            Entry::Vacant(vacant) => {
                vacant.insert(Slot { fingerprint, place });
                self.ids.push(id.clone());
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasherDefault;

    use super::*;

    /// The same bytes at two lengths, Ray-sized ids, and one too long to keep inline.
    fn ids() -> [EventId; 5] {
        [
            EventId::from_bytes(&[0]),
            EventId::from_bytes(&[0, 0]),
            EventId::from_bytes(&[0xab; 28]),
            EventId::from_bytes(&[0xac; 28]),
            EventId::from_bytes(&[0xcd; 40]),
        ]
    }

    fn first_then_again<S: BuildHasher>(seen: &mut SeenEvents<S>) -> (Vec<bool>, Vec<bool>) {
        let first = ids().iter().map(|id| seen.first_time(id)).collect();
        let again = ids().iter().map(|id| seen.first_time(id)).collect();
        (first, again)
    }

    #[test]
    fn an_id_is_new_once_whatever_its_length() {
        let (first, again) = first_then_again(&mut SeenEvents::default());
        assert_eq!(first, [true; 5]);
        assert_eq!(again, [false; 5]);
    }

    /// A hasher that hashes everything alike.
    #[derive(Default)]
    struct Constant;

    impl std::hash::Hasher for Constant {
        fn finish(&self) -> u64 {
            0x5eed
        }
        fn write(&mut self, _: &[u8]) {}
    }

    #[test]
    fn ids_whose_fingerprints_collide_are_told_apart_by_their_bytes() {
        let mut seen = SeenEvents::with_hasher(BuildHasherDefault::<Constant>::default());
        let (first, again) = first_then_again(&mut seen);
        assert_eq!(first, [true; 5]);
        assert_eq!(again, [false; 5]);
        assert_eq!(seen.places.len(), 5);
    }

    #[test]
    fn room_made_ahead_changes_nothing_taken() {
        let mut seen = SeenEvents::default();
        let (first, _) = first_then_again(&mut seen);
        // Growing hashes every slot again from its fingerprint alone.
        seen.reserve(100_000);
        let again: Vec<bool> = ids().iter().map(|id| seen.first_time(id)).collect();
        assert_eq!(first, [true; 5]);
        assert_eq!(again, [false; 5]);
    }
}
