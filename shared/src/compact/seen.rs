//! [`SeenEvents`]: which events a compaction run has already taken, by event id.

use std::collections::HashSet;

use crate::event::encoding::Id;

/// Longest id kept inline: Ray's event ids are 28 bytes (reference §2.1).
const INLINE: usize = 31;

// The length is kept in a byte.
const _: () = assert!(INLINE <= u8::MAX as usize);

/// The event ids a run has taken, so that a re-delivered copy is dropped.
///
/// Kept as the ids' bytes, inline: a set of the ids themselves hashed and compared their hex
/// text through a pointer, and took and released a reference count on each, which was a
/// twentieth of a run's CPU and all on the thread that folds (perf).
#[derive(Default)]
pub(super) struct SeenEvents {
    /// Ids of up to [`INLINE`] bytes: their length, then their bytes, then zeros.
    inline: HashSet<[u8; INLINE + 1], foldhash::fast::RandomState>,
    /// Longer ids, which Ray does not send.
    longer: HashSet<Id, foldhash::fast::RandomState>,
}

impl SeenEvents {
    /// Makes room for `more` ids.
    pub(super) fn reserve(&mut self, more: usize) {
        self.inline.reserve(more);
    }

    /// True the first time `id` is given.
    pub(super) fn first_time(&mut self, id: &Id) -> bool {
        let mut key = [0u8; INLINE + 1];
        let (length, bytes) = key.split_at_mut(1);
        match id.bytes_into(bytes) {
            Some(decoded) => {
                // At most `INLINE` bytes were decoded, so the length fits (asserted above).
                length[0] = decoded.len() as u8;
                self.inline.insert(key)
            }
            None => self.longer.insert(id.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_new_once_whatever_its_length() -> Result<(), &'static str> {
        let hex = |text: &str| Id::from_hex(text).ok_or("hex");
        // The same bytes at two lengths, a Ray-sized id, and one too long to keep inline.
        let ids = [
            hex("00")?,
            hex("0000")?,
            hex(&"ab".repeat(28))?,
            hex(&"cd".repeat(40))?,
        ];
        let mut seen = SeenEvents::default();
        let first: Vec<bool> = ids.iter().map(|id| seen.first_time(id)).collect();
        let again: Vec<bool> = ids.iter().map(|id| seen.first_time(id)).collect();
        assert_eq!(first, [true; 4]);
        assert_eq!(again, [false; 4]);
        Ok(())
    }
}
