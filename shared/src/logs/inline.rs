//! Members inline in the index (docs/architecture.md, "Logs"): a node's newest small members,
//! carried in the node's index rather than in a segment of their own until they would pass
//! [`INLINE_BYTES`]. A request, or a batch of them, that stores a few lines then writes one
//! object, the index, where it would write a segment and the index: S3 PUTs are most of what a
//! busy node's logs cost.
//!
//! The inline members' extents name an id of their own as their segment. A write that adds to
//! them gives them a new id, so that a write whose answer was lost is recognised by the id the
//! index names, as a segment's is. Once the inline members and a request's would pass
//! [`INLINE_BYTES`], both become the request's segment and the index carries none.

use std::collections::HashMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};
use ulid::Ulid;

use super::index::LogIndex;

/// Most compressed bytes an index carries inline: a read of the index, which every read and
/// every request makes, fetches them too.
pub const INLINE_BYTES: usize = 128 * 1024;

/// Gzip members carried in the index, one after another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "InlineRow", into = "InlineRow")]
pub struct Inline {
    /// The segment id their extents name.
    pub id: Ulid,
    /// The members; an extent's are at its `at..at + size`.
    pub members: Vec<u8>,
}

/// Inline members as the index writes them: its id and its members in base64.
type InlineRow = (String, String);

impl TryFrom<InlineRow> for Inline {
    type Error = String;

    fn try_from((id, members): InlineRow) -> Result<Self, String> {
        Ok(Self {
            id: Ulid::from_string(&id).map_err(|err| format!("inline id {id:?}: {err}"))?,
            members: STANDARD
                .decode(members)
                .map_err(|err| format!("inline members: {err}"))?,
        })
    }
}

impl From<Inline> for InlineRow {
    fn from(inline: Inline) -> Self {
        (inline.id.to_string(), STANDARD.encode(inline.members))
    }
}

/// Places a request's new `members` (whose extents in `index` name `id`, at offsets into
/// `members`) inline in `index` when they fit beside its inline members still named, returning
/// `None`; else returns the segment `id` to write (those inline members, then `members`), and
/// `index` carries none. Either way the extents that named the inline members, and those that
/// named `id`, name `id` at their member's new place.
pub fn place(index: &mut LogIndex, id: Ulid, members: Vec<u8>) -> Option<Vec<u8>> {
    let inline = index.inline.take();
    let (mut body, moved) = inline
        .as_ref()
        .map(|inline| named_members(index, inline))
        .unwrap_or_default();
    let shift = body.len() as u64;
    let inline_id = inline.map(|inline| inline.id);
    for extent in index.files.values_mut().flatten() {
        if extent.segment == id {
            extent.at += shift;
        } else if Some(extent.segment) == inline_id
            && let Some(&at) = moved.get(&extent.at)
        {
            extent.segment = id;
            extent.at = at;
        }
    }
    body.extend_from_slice(&members);
    if body.len() <= INLINE_BYTES {
        index.inline = Some(Inline { id, members: body });
        None
    } else {
        Some(body)
    }
}

/// The members of `inline` that extents of `index` still name, one after another, and where
/// each moved (from its `at` among the inline members to its place among these). Members no extent names
/// (merged into larger ones) are left behind.
fn named_members(index: &LogIndex, inline: &Inline) -> (Vec<u8>, HashMap<u64, u64>) {
    let mut named: Vec<(u64, u64)> = index
        .files
        .values()
        .flatten()
        .filter(|extent| extent.segment == inline.id)
        .map(|extent| (extent.at, extent.size))
        .collect();
    named.sort_unstable();
    named.dedup();
    let mut kept = Vec::new();
    let mut moved = HashMap::new();
    for (at, size) in named {
        let from = usize::try_from(at).unwrap_or(usize::MAX);
        let to = usize::try_from(size).map_or(usize::MAX, |size| from.saturating_add(size));
        if let Some(member) = inline.members.get(from..to) {
            moved.insert(at, kept.len() as u64);
            kept.extend_from_slice(member);
        }
    }
    (kept, moved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logs::index::Extent;

    fn extent(start: u64, segment: Ulid, at: u64, size: u64) -> Extent {
        Extent {
            start,
            end: start + 1,
            segment,
            at,
            size,
            level: 0,
        }
    }

    /// Appends `extent` to file `a`'s extents, as a store adds its request's.
    fn append(index: &mut LogIndex, extent: Extent) {
        index.files.entry("a".into()).or_default().push(extent);
    }

    /// Each extent of file `a`: its start, the id it names and where its member is.
    fn places(index: &LogIndex) -> Vec<(u64, Ulid, u64)> {
        index.files["a"]
            .iter()
            .map(|extent| (extent.start, extent.segment, extent.at))
            .collect()
    }

    #[test]
    fn members_stay_inline_until_they_would_pass_the_limit() {
        let ids: Vec<Ulid> = (1..=4).map(|n| Ulid::from_parts(n, 0)).collect();
        let mut index = LogIndex::default();
        append(&mut index, extent(0, ids[0], 0, 10));
        assert_eq!(place(&mut index, ids[0], vec![1; 10]), None);

        // A second request's members follow; every extent now names the new id.
        append(&mut index, extent(1, ids[1], 0, 20));
        assert_eq!(place(&mut index, ids[1], vec![2; 20]), None);
        assert_eq!(places(&index), [(0, ids[1], 0), (1, ids[1], 10)]);

        // The first extent merged away (its member no longer named) is left behind.
        index.files.entry("a".into()).or_default().remove(0);
        append(&mut index, extent(2, ids[2], 0, 5));
        assert_eq!(place(&mut index, ids[2], vec![3; 5]), None);
        assert_eq!(places(&index), [(1, ids[2], 0), (2, ids[2], 20)]);
        let inline = index
            .inline
            .clone()
            .map(|inline| (inline.id, inline.members));
        assert_eq!(inline, Some((ids[2], [vec![2; 20], vec![3; 5]].concat())));

        // Past the limit: the named members and the request's become its segment.
        append(&mut index, extent(3, ids[3], 0, INLINE_BYTES as u64));
        let segment = place(&mut index, ids[3], vec![4; INLINE_BYTES]);
        let expected = [vec![2; 20], vec![3; 5], vec![4; INLINE_BYTES]].concat();
        assert_eq!(segment, Some(expected));
        assert_eq!(index.inline, None);
        assert_eq!(
            places(&index),
            [(1, ids[3], 0), (2, ids[3], 20), (3, ids[3], 25)]
        );
    }

    #[test]
    fn inline_members_read_back_as_written() -> Result<(), serde_json::Error> {
        let index = LogIndex {
            inline: Some(Inline {
                id: Ulid::nil(),
                members: b"members".to_vec(),
            }),
            ..LogIndex::default()
        };
        let text = serde_json::to_string(&index)?;
        assert_eq!(
            text,
            r#"{"files":{},"inline":["00000000000000000000000000","bWVtYmVycw=="]}"#
        );
        assert_eq!(serde_json::from_str::<LogIndex>(&text)?, index);
        let bad = r#"{"files":{},"inline":["00000000000000000000000000","not base64!"]}"#;
        assert!(serde_json::from_str::<LogIndex>(bad).is_err());
        Ok(())
    }
}
